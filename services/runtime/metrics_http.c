/* One thread: poll the listening socket (and a wake-up pipe), accept, read
 * the request head, answer, close. */
#include "runtime/metrics_http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"

#define REQ_MAX 8192

struct rf_metrics_http {
    int fd, wake[2], port;
    rf_prom *reg;
    pthread_t thread;
    int running;
};

int rf_http_parse_request_line(const char *buf, size_t len, rf_http_request *req) {
    memset(req, 0, sizeof *req);
    const char *nl = memchr(buf, '\n', len);
    if (!nl) return len >= REQ_MAX ? -1 : 0;
    size_t line = (size_t)(nl - buf); /* without the '\n' */
    if (line > 0 && buf[line - 1] == '\r') line--;
    size_t i = 0, m = 0;
    while (i < line && buf[i] >= 'A' && buf[i] <= 'Z') {
        if (m + 1 >= sizeof req->method) return -1;
        req->method[m++] = buf[i++];
    }
    if (m == 0 || i >= line || buf[i++] != ' ') return -1;
    if (i >= line || buf[i] != '/') return -1;
    size_t p = 0;
    int in_query = 0;
    for (; i < line && buf[i] != ' '; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c < 0x21 || c == 0x7f) return -1;
        if (c == '?' || c == '#') in_query = 1;
        if (in_query) continue;
        if (p + 1 >= sizeof req->path) return -1;
        req->path[p++] = (char)c;
    }
    if (i >= line || buf[i++] != ' ') return -1;
    if (line - i != 8 || memcmp(buf + i, "HTTP/1.", 7) || (buf[i + 7] != '0' && buf[i + 7] != '1'))
        return -1;
    req->minor = buf[i + 7] - '0';
    return (int)(nl - buf) + 1;
}

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *reason, const char *type, const char *body,
                    size_t len, int head_only) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n",
                     status, reason, type, len, status == 405 ? "Allow: GET, HEAD\r\n" : "");
    send_all(fd, head, (size_t)n);
    if (!head_only) send_all(fd, body, len);
}

static void serve_one(rf_metrics_http *h, int fd) {
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char buf[REQ_MAX];
    size_t len = 0;
    rf_http_request req;
    int r = 0;
    /* The request line, then the rest of the head up to the blank line (read
     * so that the client does not see a reset; its contents are not used). */
    while (len < sizeof buf) {
        ssize_t got = recv(fd, buf + len, sizeof buf - len, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        len += (size_t)got;
        if (r == 0) r = rf_http_parse_request_line(buf, len, &req);
        if (r < 0) break;
        if (r > 0 && (memmem(buf, len, "\r\n\r\n", 4) || memmem(buf, len, "\n\n", 2))) break;
    }
    static const char text[] = "text/plain; charset=utf-8";
    if (r <= 0) {
        if (len > 0) respond(fd, 400, "Bad Request", text, "bad request\n", 12, 0);
        return;
    }
    int head = !strcmp(req.method, "HEAD");
    if (strcmp(req.path, "/metrics") != 0) {
        respond(fd, 404, "Not Found", text, "not found; try /metrics\n", 24, head);
    } else if (strcmp(req.method, "GET") != 0 && !head) {
        respond(fd, 405, "Method Not Allowed", text, "method not allowed\n", 19, 0);
    } else {
        rf_buf out = RF_BUF_INIT;
        if (rf_prom_expose(h->reg, &out) == RF_OK)
            respond(fd, 200, "OK", RF_PROM_CONTENT_TYPE, out.data ? out.data : "", out.len, head);
        else
            respond(fd, 500, "Internal Server Error", text, "out of memory\n", 14, head);
        rf_buf_free(&out);
    }
}

static void *serve(void *arg) {
    rf_metrics_http *h = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = h->fd, .events = POLLIN},
                              {.fd = h->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            rf_error("metrics", "poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents) break;
        if (!(p[0].revents & POLLIN)) continue;
        int fd = accept4(h->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        serve_one(h, fd);
        close(fd);
    }
    return NULL;
}

/* "host:port", "[v6]:port" or ":port" (all interfaces). */
static int split_listen(const char *listen, char *host, size_t hsize, char *port, size_t psize) {
    const char *colon = strrchr(listen, ':');
    if (!colon || !colon[1])
        return rf_fail(RF_ERR_INVALID, "metrics: '%s' is not host:port", listen);
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= hsize || strlen(colon + 1) >= psize)
        return rf_fail(RF_ERR_INVALID, "metrics: address '%s' too long", listen);
    memcpy(host, h, hl);
    host[hl] = 0;
    snprintf(port, psize, "%s", colon + 1);
    return RF_OK;
}

int rf_metrics_http_start(const char *addr, rf_prom *r, rf_metrics_http **out) {
    *out = NULL;
    char host[256], port[32];
    int rc = split_listen(addr, host, sizeof host, port, sizeof port);
    if (rc) return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (gai) return rf_fail(RF_ERR_INVALID, "metrics: %s: %s", addr, gai_strerror(gai));
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 16) < 0) {
            rc = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return rf_fail(RF_ERR_IO, "metrics: cannot listen on %s: %s", addr,
                       rc ? strerror(rc) : "no address");
    rf_metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        return RF_ERR_NOMEM;
    }
    h->fd = fd;
    h->reg = r;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    if (pipe2(h->wake, O_CLOEXEC) < 0) {
        close(fd);
        free(h);
        return rf_fail(RF_ERR_IO, "metrics: pipe: %s", strerror(errno));
    }
    if (pthread_create(&h->thread, NULL, serve, h) != 0) {
        close(fd);
        close(h->wake[0]);
        close(h->wake[1]);
        free(h);
        return rf_fail(RF_ERR_IO, "metrics: cannot start the server thread");
    }
    h->running = 1;
    *out = h;
    return RF_OK;
}

int rf_metrics_http_port(const rf_metrics_http *h) {
    return h ? h->port : 0;
}

void rf_metrics_http_stop(rf_metrics_http *h) {
    if (!h) return;
    if (h->running) {
        ssize_t w;
        do
            w = write(h->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(h->thread, NULL);
    }
    close(h->fd);
    close(h->wake[0]);
    close(h->wake[1]);
    free(h);
}
