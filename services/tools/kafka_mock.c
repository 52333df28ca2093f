/* refinery-kafka-mock: a standalone mock Kafka cluster (librdkafka's
 * rdkafka_mock, real Kafka protocol) for tests and local runs, since no Kafka
 * broker is packaged here.
 *
 * Prints "bootstrap=HOST:PORT,..." on stdout, then runs until SIGTERM/SIGINT.
 * Commands, one per line, from stdin or from the FIFO given by --control
 * (not from a terminal it runs in the background of: that would stop it):
 *   down N | up N            take broker N (1-based) down / bring it back
 *   topic NAME PARTITIONS    create a topic
 * Each is answered on stdout by "ok <command>" or "error <reason>". */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "runtime/kafka/mock.h"
#include "runtime/svc.h"

typedef struct control {
    rf_kafka_mock *mock;
    int fd;
} control;

static void run_command(rf_kafka_mock *m, char *line) {
    line[strcspn(line, "\r\n")] = 0;
    char verb[16], name[256];
    int n, rc;
    if (sscanf(line, "%15s", verb) != 1) return; /* blank line */
    if (!strcmp(verb, "down") && sscanf(line, "%*s %d", &n) == 1)
        rc = rf_kafka_mock_broker_down(m, n);
    else if (!strcmp(verb, "up") && sscanf(line, "%*s %d", &n) == 1)
        rc = rf_kafka_mock_broker_up(m, n);
    else if (!strcmp(verb, "topic") && sscanf(line, "%*s %255s %d", name, &n) == 2)
        rc = rf_kafka_mock_topic(m, name, n);
    else
        rc = rf_fail(RF_ERR_INVALID, "unknown command '%s'", line);
    if (rc == RF_OK) {
        printf("ok %s\n", line);
        rf_info("kafka-mock", "%s", line);
    } else {
        printf("error %s\n", rf_errmsg());
    }
    fflush(stdout);
}

/* Reads command lines until stop; polls so that it notices the stop flag. */
static void *control_main(void *arg) {
    control *c = arg;
    char line[512];
    size_t len = 0;
    while (!rf_svc_stopping()) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t got = read(c->fd, line + len, sizeof line - 1 - len);
        if (got <= 0) break; /* stdin closed: keep serving, stop reading */
        len += (size_t)got;
        line[len] = 0;
        char *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = 0;
            run_command(c->mock, line);
            len -= (size_t)(nl + 1 - line);
            memmove(line, nl + 1, len + 1);
        }
        if (len == sizeof line - 1) len = 0; /* overlong line: drop it */
    }
    return NULL;
}

int main(int argc, char **argv) {
    rf_log_init_from_env();
    int64_t brokers;
    const char *control_path, *bootstrap_file, *topics;
    const rf_opt opts[] = {
        {"brokers", "KAFKA_MOCK_BROKERS", RF_OPT_INT, &brokers, "3", "number of brokers"},
        {"control", "KAFKA_MOCK_CONTROL", RF_OPT_STR, &control_path, NULL,
         "FIFO to read commands from (created if missing) instead of stdin"},
        {"bootstrap-file", "KAFKA_MOCK_BOOTSTRAP_FILE", RF_OPT_STR, &bootstrap_file, NULL,
         "also write the bootstrap servers to this file (atomically)"},
        {"topics", "KAFKA_MOCK_TOPICS", RF_OPT_STR, &topics, NULL,
         "topics to create at start: name:partitions,..."},
    };
    int rc = rf_svc_parse("refinery-kafka-mock", "A mock Kafka cluster for tests.", opts,
                          sizeof opts / sizeof opts[0], argc, argv);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "refinery-kafka-mock: %s\n", rf_errmsg());
        return 2;
    }
    if (rf_svc_signals_init() < 0) return 1;

    rf_kafka_mock *mock;
    if (rf_kafka_mock_new((int)brokers, &mock) < 0) {
        fprintf(stderr, "refinery-kafka-mock: %s\n", rf_errmsg());
        return 1;
    }
    int status = 0;
    control c = {mock, STDIN_FILENO};
    if (control_path) {
        if (mkfifo(control_path, 0600) < 0 && errno != EEXIST) {
            fprintf(stderr, "refinery-kafka-mock: mkfifo %s: %s\n", control_path, strerror(errno));
            rf_kafka_mock_free(mock);
            return 1;
        }
        /* Read-write, so that writers coming and going never make it EOF. */
        c.fd = open(control_path, O_RDWR);
        if (c.fd < 0) {
            fprintf(stderr, "refinery-kafka-mock: %s: %s\n", control_path, strerror(errno));
            rf_kafka_mock_free(mock);
            return 1;
        }
    }
    if (topics) {
        char *list = strdup(topics), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t && status == 0;
             t = strtok_r(NULL, ",", &save)) {
            char *colon = strchr(t, ':');
            int parts = colon ? atoi(colon + 1) : 1;
            if (colon) *colon = 0;
            if (rf_kafka_mock_topic(mock, t, parts) < 0) {
                fprintf(stderr, "refinery-kafka-mock: %s\n", rf_errmsg());
                status = 1;
            }
        }
        free(list);
    }
    const char *bs = rf_kafka_mock_bootstrap(mock);
    /* The line goes out before the file appears: scripts wait for the file and
     * then read command answers from stdout, which must not be this line. */
    if (status == 0) {
        printf("bootstrap=%s\n", bs);
        fflush(stdout);
    }
    if (status == 0 && bootstrap_file && rf_write_file_atomic(bootstrap_file, bs, strlen(bs)) < 0) {
        fprintf(stderr, "refinery-kafka-mock: %s\n", rf_errmsg());
        status = 1;
    }
    pthread_t th;
    int have_thread = 0;
    if (status == 0) {
        rf_info("kafka-mock", "%d brokers at %s", (int)brokers, bs);
        /* `refinery-kafka-mock &` from an interactive shell: reading the
         * terminal from the background would stop the process (SIGTTIN). */
        bool background =
            !control_path && isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) != getpgrp();
        if (background)
            rf_info("kafka-mock", "in the background of a terminal: commands are not read from "
                                  "stdin (use --control FIFO)");
        else
            have_thread = pthread_create(&th, NULL, control_main, &c) == 0;
        int sig = rf_svc_wait_signal(-1);
        rf_info("kafka-mock", "signal %d: stopping", sig);
    }
    rf_svc_request_stop();
    if (have_thread) pthread_join(th, NULL);
    if (control_path && c.fd >= 0) close(c.fd);
    rf_kafka_mock_free(mock);
    return status;
}
