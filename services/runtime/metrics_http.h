/* A minimal HTTP/1.1 server for Prometheus scrapes: GET (or HEAD) /metrics
 * answers the registry in the text format 0.0.4; any other path is 404, any
 * other method 405, a malformed or oversized request 400. One thread serves
 * one connection at a time, closes it after the response (Connection:
 * close), and gives a client 2 s to send its request, so a stuck client
 * delays a scrape by at most that. Requests are read into a fixed 8 KiB
 * buffer; everything after the request line and headers is ignored.
 *
 * Services start it from rf_svc_main (--metrics-listen); `refinery run
 * --metrics-port` starts it for the embedded runner. */
#ifndef RF_RUNTIME_METRICS_HTTP_H
#define RF_RUNTIME_METRICS_HTTP_H

#include <stddef.h>

#include "common/prom.h"

typedef struct rf_metrics_http rf_metrics_http;

/* Binds listen ("host:port", port 0 picks a free one; "[::1]:port" for IPv6)
 * and starts the thread serving registry r (which must outlive the server). */
int rf_metrics_http_start(const char *listen, rf_prom *r, rf_metrics_http **out);
/* The bound port. */
int rf_metrics_http_port(const rf_metrics_http *h);
/* Stops the thread, closes the socket, frees. NULL is a no-op. */
void rf_metrics_http_stop(rf_metrics_http *h);

/* The request line of an HTTP request, bounds-checked; exposed for the fuzz
 * target and tests. */
typedef struct rf_http_request {
    char method[16];
    char path[256]; /* without the query string */
    int minor;      /* HTTP/1.<minor> */
} rf_http_request;

/* Parses "METHOD SP target SP HTTP/1.x CRLF" at the start of buf[0..len)
 * (buf need not be NUL-terminated). Returns the length of the request line
 * with its line end, 0 when more bytes are needed (no line end yet), or -1
 * when the line is malformed: a method that is not 1..15 uppercase letters,
 * a target that does not start with '/' or is longer than 255 bytes or holds
 * control bytes, a version other than HTTP/1.0 or HTTP/1.1. */
int rf_http_parse_request_line(const char *buf, size_t len, rf_http_request *req);

#endif
