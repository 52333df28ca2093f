/* libFuzzer target: the request line parser of the /metrics HTTP server, which
 * reads whatever a client on the metrics port sends. Checks its promises: the
 * returned length is within the input and ends at a '\n'; a parsed request has
 * a NUL-terminated uppercase method and a path that starts with '/'. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/metrics_http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rf_http_request q;
    int n = rf_http_parse_request_line((const char *)data, size, &q);
    if (n < -1 || (size_t)(n > 0 ? n : 0) > size) __builtin_trap();
    if (n > 0) {
        if (data[n - 1] != '\n') __builtin_trap();
        size_t m = strnlen(q.method, sizeof q.method), p = strnlen(q.path, sizeof q.path);
        if (m == 0 || m >= sizeof q.method || p == 0 || p >= sizeof q.path) __builtin_trap();
        if (q.path[0] != '/' || (q.minor != 0 && q.minor != 1)) __builtin_trap();
        for (size_t i = 0; i < m; i++)
            if (q.method[i] < 'A' || q.method[i] > 'Z') __builtin_trap();
    }
    return 0;
}
