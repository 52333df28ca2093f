/* TCP bootstrap: see bootstrap.h. One connection at a time on the server: the
 * group is small and each exchange is a few hundred bytes; a client that
 * stalls holds the server for at most io_timeout_s. */
#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"

#define MAGIC     "RFB1"
#define ACK       "ACK1"
#define HELLO_FIX 22 /* magic + 4 u32 + u16 */

struct rf_boot_server {
    int fd;
    int port;
};

static double opt_or(double v, double dflt) {
    return v > 0 ? v : dflt;
}

static const char *run_id_of(const rf_boot_opts *o) {
    return o->run_id ? o->run_id : "default";
}

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits until fd is ready for `events` or the deadline passes: 1 ready, 0 timed
 * out, -1 error (errno). */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - rf_now();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1000 ? 1000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* Sends/receives exactly n bytes before the deadline on a non-blocking socket:
 * RF_OK, or RF_ERR_IO with a detail. */
static int send_all(int fd, const void *buf, size_t n, double deadline) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return rf_fail(RF_ERR_IO, "send: %s", strerror(errno));
        int r = wait_fd(fd, POLLOUT, deadline);
        if (r == 0) return rf_fail(RF_ERR_IO, "send timed out");
        if (r < 0) return rf_fail(RF_ERR_IO, "poll: %s", strerror(errno));
    }
    return RF_OK;
}

static int recv_all(int fd, void *buf, size_t n, double deadline) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r, n -= (size_t)r;
            continue;
        }
        if (r == 0) return rf_fail(RF_ERR_IO, "connection closed by peer");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return rf_fail(RF_ERR_IO, "recv: %s", strerror(errno));
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) return rf_fail(RF_ERR_IO, "receive timed out");
        if (w < 0) return rf_fail(RF_ERR_IO, "poll: %s", strerror(errno));
    }
    return RF_OK;
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int check_opts(const rf_boot_opts *o, size_t len) {
    if (!o || o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return rf_fail(RF_ERR_INVALID, "bootstrap: bad rank %d of world %d", o ? o->rank : -1,
                       o ? o->world : -1);
    if (strlen(run_id_of(o)) > RF_BOOT_MAX_RUN_ID)
        return rf_fail(RF_ERR_INVALID, "bootstrap: run id longer than %d bytes",
                       RF_BOOT_MAX_RUN_ID);
    if (len == 0 || len > RF_BOOT_MAX_BLOB)
        return rf_fail(RF_ERR_INVALID, "bootstrap: blob of %zu bytes (1..%d)", len,
                       RF_BOOT_MAX_BLOB);
    return RF_OK;
}

int rf_boot_listen(const char *bind_addr, int port, rf_boot_server **out) {
    *out = NULL;
    if (port < 0 || port > 65535) return rf_fail(RF_ERR_INVALID, "bootstrap: port %d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    /* With no address prefer IPv4's wildcard: pods' MASTER_ADDR resolve to it. */
    if (!bind_addr) hints.ai_family = AF_INET;
    int gr = getaddrinfo(bind_addr, ps, &hints, &res);
    if (gr != 0)
        return rf_fail(RF_ERR_IO, "bootstrap: resolve %s: %s", bind_addr ? bind_addr : "*",
                       gai_strerror(gr));
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rf_fail(RF_ERR_IO, "bootstrap: listen on %s:%d: %s", bind_addr ? bind_addr : "*",
                       port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 || set_nonblock(fd) != 0) {
        int e = errno;
        close(fd);
        return rf_fail(RF_ERR_IO, "bootstrap: listen socket: %s", strerror(e));
    }
    rf_boot_server *s = malloc(sizeof *s);
    if (!s) {
        close(fd);
        return rf_fail(RF_ERR_NOMEM, "bootstrap: out of memory");
    }
    s->fd = fd;
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    *out = s;
    return RF_OK;
}

int rf_boot_server_port(const rf_boot_server *s) {
    return s ? s->port : -1;
}

void rf_boot_server_close(rf_boot_server *s) {
    if (!s) return;
    close(s->fd);
    free(s);
}

static int reply(int fd, int status, const void *data, size_t n, double deadline) {
    unsigned char h[9];
    memcpy(h, MAGIC, 4);
    h[4] = (unsigned char)status;
    put32(h + 5, (uint32_t)n);
    int rc = send_all(fd, h, sizeof h, deadline);
    return rc ? rc : send_all(fd, data, n, deadline);
}

/* One client: returns the rank it acknowledged as, or -1 (logged) when the
 * exchange failed or the client was refused. */
static int serve_one(int fd, const rf_boot_opts *o, const void *blob, size_t len,
                     char last_refusal[512]) {
    double deadline = rf_now() + opt_or(o->io_timeout_s, 5);
    unsigned char h[HELLO_FIX] = {0};
    char run_id[RF_BOOT_MAX_RUN_ID + 1];
    int rc = recv_all(fd, h, sizeof h, deadline);
    if (rc == RF_OK && memcmp(h, MAGIC, 4) != 0) rc = rf_fail(RF_ERR_IO, "not a bootstrap client");
    uint32_t attempt = get32(h + 4), rank = get32(h + 8), world = get32(h + 12),
             blen = get32(h + 16), idlen = (uint32_t)h[20] << 8 | h[21];
    if (rc == RF_OK && idlen > RF_BOOT_MAX_RUN_ID) rc = rf_fail(RF_ERR_IO, "run id too long");
    if (rc == RF_OK) rc = recv_all(fd, run_id, idlen, deadline);
    if (rc != RF_OK) {
        rf_warn("comm", "bootstrap: dropped a connection: %s", rf_errmsg());
        return -1;
    }
    run_id[idlen] = 0;
    char why[512] = "";
    if (strcmp(run_id, run_id_of(o)) != 0 || attempt != o->attempt)
        snprintf(why, sizeof why,
                 "stale or foreign group: client has run %s attempt %u, rank 0 serves run %s "
                 "attempt %u",
                 run_id, attempt, run_id_of(o), o->attempt);
    else if (world != (uint32_t)o->world)
        snprintf(why, sizeof why, "world size differs: client %u, rank 0 %d", world, o->world);
    else if (rank == 0 || rank >= world)
        snprintf(why, sizeof why, "bad rank %u of world %u", rank, world);
    else if (blen != len)
        snprintf(why, sizeof why, "blob size differs: client %u, rank 0 %zu", blen, len);
    if (why[0]) {
        if (strcmp(why, last_refusal) != 0) /* once, not at every retry */
            rf_warn("comm", "bootstrap: refused a client: %s", why);
        memcpy(last_refusal, why, sizeof why);
        reply(fd, 1, why, strlen(why), deadline);
        return -1;
    }
    unsigned char ack[4];
    rc = reply(fd, 0, blob, len, deadline);
    if (rc == RF_OK) rc = recv_all(fd, ack, 4, deadline);
    if (rc == RF_OK && memcmp(ack, ACK, 4) != 0) rc = rf_fail(RF_ERR_IO, "bad acknowledgement");
    if (rc != RF_OK) {
        rf_warn("comm", "bootstrap: rank %u did not take the id: %s", rank, rf_errmsg());
        return -1;
    }
    return (int)rank;
}

int rf_boot_serve(rf_boot_server *s, const rf_boot_opts *o, const void *blob, size_t len) {
    int rc = check_opts(o, len);
    if (rc) return rc;
    if (o->rank != 0) return rf_fail(RF_ERR_INVALID, "bootstrap: rank %d cannot serve", o->rank);
    int need = o->world - 1, have = 0;
    unsigned char *got = calloc((size_t)o->world, 1);
    if (!got) return rf_fail(RF_ERR_NOMEM, "bootstrap: out of memory");
    double timeout = opt_or(o->timeout_s, 900), deadline = rf_now() + timeout;
    char last_refusal[512] = "";
    while (have < need) {
        int w = wait_fd(s->fd, POLLIN, deadline);
        if (w <= 0) {
            if (w < 0) {
                rc = rf_fail(RF_ERR_IO, "bootstrap: poll: %s", strerror(errno));
                break;
            }
            char missing[256] = "";
            size_t m = 0;
            for (int r = 1; r < o->world && m + 16 < sizeof missing; r++)
                if (!got[r]) m += (size_t)snprintf(missing + m, sizeof missing - m, " %d", r);
            rc = rf_fail(RF_ERR_IO,
                         "timeout: bootstrap rank 0 (run %s attempt %u, port %d) waited %.1f s; "
                         "%d of %d ranks fetched the id; missing:%s",
                         run_id_of(o), o->attempt, s->port, timeout, have, need, missing);
            break;
        }
        int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) continue; /* EAGAIN, ECONNABORTED: the next poll decides */
        int r = serve_one(fd, o, blob, len, last_refusal);
        close(fd);
        if (r > 0 && !got[r]) {
            got[r] = 1;
            have++;
        }
    }
    free(got);
    return rc;
}

/* One try: connect, hello, reply. RF_OK with the blob; RF_ERR_INVALID when
 * refused (reason in rf_errmsg); RF_ERR_IO when the server is not there. */
static int fetch_once(const char *host, int port, const rf_boot_opts *o, void *blob, size_t len,
                      double io_timeout) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0) return rf_fail(RF_ERR_IO, "resolve %s: %s", host, gai_strerror(gr));
    int rc = rf_fail(RF_ERR_IO, "no address for %s", host);
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        double deadline = rf_now() + io_timeout;
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = rf_fail(RF_ERR_IO, "socket: %s", strerror(errno));
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            int e = errno;
            if (e == EINPROGRESS) {
                int w = wait_fd(fd, POLLOUT, deadline);
                socklen_t el = sizeof e;
                if (w <= 0)
                    e = w == 0 ? ETIMEDOUT : errno;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                    e = errno;
            }
            if (e != 0) {
                rc = rf_fail(RF_ERR_IO, "connect: %s", strerror(e));
                close(fd);
                continue;
            }
        }
        const char *id = run_id_of(o);
        size_t idlen = strlen(id);
        unsigned char h[HELLO_FIX + RF_BOOT_MAX_RUN_ID];
        memcpy(h, MAGIC, 4);
        put32(h + 4, o->attempt);
        put32(h + 8, (uint32_t)o->rank);
        put32(h + 12, (uint32_t)o->world);
        put32(h + 16, (uint32_t)len);
        h[20] = (unsigned char)(idlen >> 8), h[21] = (unsigned char)idlen;
        memcpy(h + HELLO_FIX, id, idlen);
        unsigned char r[9];
        rc = send_all(fd, h, HELLO_FIX + idlen, deadline);
        if (rc == RF_OK) rc = recv_all(fd, r, sizeof r, deadline);
        if (rc == RF_OK && memcmp(r, MAGIC, 4) != 0) rc = rf_fail(RF_ERR_IO, "not rank 0");
        if (rc == RF_OK) {
            uint32_t n = get32(r + 5);
            if (r[4] != 0) {
                char why[512];
                size_t k = n < sizeof why - 1 ? n : sizeof why - 1;
                rc = recv_all(fd, why, k, deadline);
                why[rc == RF_OK ? k : 0] = 0;
                rc = rf_fail(RF_ERR_INVALID, "refused by rank 0: %s", why);
            } else if (n != len) {
                rc = rf_fail(RF_ERR_IO, "rank 0 sent %u bytes, expected %zu", n, len);
            } else {
                rc = recv_all(fd, blob, len, deadline);
                if (rc == RF_OK) rc = send_all(fd, ACK, 4, deadline);
            }
        }
        close(fd);
        if (rc == RF_OK || rc == RF_ERR_INVALID) break;
    }
    freeaddrinfo(res);
    return rc;
}

int rf_boot_fetch(const char *host, int port, const rf_boot_opts *o, void *blob, size_t len) {
    int rc = check_opts(o, len);
    if (rc) return rc;
    if (o->rank == 0) return rf_fail(RF_ERR_INVALID, "bootstrap: rank 0 serves, it does not fetch");
    if (!host || !*host || port <= 0 || port > 65535)
        return rf_fail(RF_ERR_INVALID, "bootstrap: bad rank 0 address %s:%d", host ? host : "",
                       port);
    double timeout = opt_or(o->timeout_s, 900), io = opt_or(o->io_timeout_s, 5);
    double backoff_max = opt_or(o->backoff_max_s, 2), backoff = 0.1;
    double start = rf_now(), deadline = start + timeout, next_log = start + 30;
    int tries = 0;
    char last[512] = "", refused[512] = "";
    for (;;) {
        double left = deadline - rf_now();
        tries++;
        rc = fetch_once(host, port, o, blob, len, io < left ? io : (left > 0.05 ? left : 0.05));
        if (rc == RF_OK) {
            if (tries > 1)
                rf_info("comm", "bootstrap: rank %d fetched the id from %s:%d after %d tries",
                        o->rank, host, port, tries);
            return RF_OK;
        }
        if (rc == RF_ERR_INVALID) { /* refused: maybe the next rank 0 is the right one */
            if (strcmp(refused, rf_errmsg()) != 0)
                rf_warn("comm", "bootstrap: rank %d: %s; retrying", o->rank, rf_errmsg());
            snprintf(refused, sizeof refused, "%s", rf_errmsg());
        }
        snprintf(last, sizeof last, "%s", rf_errmsg());
        double now = rf_now();
        if (now >= deadline) break;
        if (now >= next_log) {
            rf_info("comm", "bootstrap: rank %d still waiting for rank 0 at %s:%d (%.0f s): %s",
                    o->rank, host, port, now - start, last);
            next_log = now + 30;
        }
        sleep_s(backoff < deadline - now ? backoff : deadline - now);
        backoff = backoff * 2 < backoff_max ? backoff * 2 : backoff_max;
    }
    return rf_fail(RF_ERR_IO,
                   "timeout: bootstrap rank %d of %d gave up after %.1f s and %d tries waiting for "
                   "rank 0 at %s:%d (run %s attempt %u); last error: %s%s%s",
                   o->rank, o->world, rf_now() - start, tries, host, port, run_id_of(o), o->attempt,
                   last, refused[0] && strcmp(refused, last) ? "; earlier " : "",
                   refused[0] && strcmp(refused, last) ? refused : "");
}
