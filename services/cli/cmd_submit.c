/* refinery submit SPEC: runs a pipeline spec on the services. Control.Submit
 * (the server checks the spec as `refinery run` does and stores it), then the
 * spec's ingest inputs go through Ingest.PushLists, then Control.Seal.
 *
 * With --server-inputs nothing is read here: after Submit, Ingest.Load has
 * the ingest service read the inputs from its --input-root (the spec's paths
 * are relative to it) and seal the run once they are all in.
 *
 * The inputs are read and mapped to text, label and id here, by the ingest
 * library with the spec's `ingest:` settings (format, preset, fields, label
 * map), so the same files mean the same documents as in `refinery run`.
 * Cleaning and filtering are left to the server: they are off here, except
 * that text must be UTF-8 (proto3 strings) and must not contain NUL. Records
 * refused here (invalid JSON, a missing field, an unmapped label, ...) are
 * counted per reason in the summary and the first few shown on stderr.
 * Augmentation is not applied (the services do not augment).
 *
 * REFINERY__SECTION__KEY=value overrides apply as in `refinery run`: to the
 * spec read here and to the spec sent to Control, which stores the effective
 * one. With any override set the spec is sent re-emitted from the tree
 * (comments dropped; line numbers in the server's errors are those of the
 * re-emitted text), and stderr lists the overrides. */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "cli/command.h"
#include "cli/remote.h"
#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "common/json.h"
#include "common/stats.h"
#include "common/sys.h"
#include "ingest/ingest.h"
#include "runtime/doc_out.h"

#define SHOW_REJECTS 5

static volatile int canceled;

static void on_signal(int sig) {
    (void)sig;
    canceled = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery submit SPEC.yaml [--run-id ID] [--server-inputs] [--watch] [--json]\n"
            "                [--stall-timeout S] [--unreachable-timeout S] [server options]\n"
            "Submits the spec as a run (Control.Submit), pushes the documents of its\n"
            "ingest.inputs (Ingest.PushLists; read and mapped here, cleaned and filtered by the\n"
            "server), seals the run and prints a JSON summary: records read, pushed,\n"
            "accepted and rejected by the server, and records refused here with reasons.\n"
            "--server-inputs: read nothing here; the ingest service reads the inputs itself\n"
            "(Ingest.Load) from its --input-root, to which the spec's ingest.inputs are\n"
            "relative, and seals the run when they are in; prints the run id, the inputs\n"
            "and the batch size. The load goes on if this command stops.\n"
            "--watch then follows the run like `refinery watch` (--json: JSON lines) and\n"
            "exits 0 only if it succeeds; the watch options and exit statuses below apply\n"
            "to it (before the watch: 1 for a failure, 2 for a bad spec or usage).\n\n%s%s",
            rf_watch_usage, rf_remote_usage);
}

/* The PushLists call the ingest library's batches are streamed into. */
typedef struct pusher {
    rf_rpc_stream *stream;
    uint64_t sent;
    uint64_t nul_text; /* refused here: proto strings end at NUL */
    bool broken;       /* the server ended the call: finish says why */
    rf_doc_out list;   /* the DocumentList being filled */
} pusher;

#define LIST_MAX_BYTES (1u << 20) /* a DocumentList stays well under the 4 MB limit */

static int send_list(pusher *p) {
    size_t n = p->list.n;
    if (n == 0) return RF_OK;
    Refinery__V1__DocumentList l = REFINERY__V1__DOCUMENT_LIST__INIT;
    l.docs = p->list.ptrs;
    l.n_docs = n;
    p->list.n = 0;
    if (rf_rpc_stream_send(p->stream, &l.base) < 0) {
        p->broken = true;
        return rf_fail(RF_ERR_IO, "the server ended the push");
    }
    p->sent += n;
    return RF_OK;
}

/* A batch as DocumentLists of at most LIST_MAX_BYTES of text. */
static int push_batch(void *ctx, rf_doc_batch *b) {
    pusher *p = ctx;
    int rc = RF_OK;
    size_t bytes = 0;
    for (size_t i = 0; i < b->n && rc == RF_OK; i++) {
        const rf_doc *d = &b->docs[i];
        if (strlen(d->text) != d->text_len) {
            p->nul_text++;
            continue;
        }
        if (p->list.n && bytes + d->text_len > LIST_MAX_BYTES) {
            rc = send_list(p);
            bytes = 0;
        }
        if (rc == RF_OK) rc = rf_doc_out_add(&p->list, d);
        bytes += d->text_len;
    }
    if (rc == RF_OK) rc = send_list(p);
    p->list.n = 0; /* the views point into b */
    rf_doc_batch_free(b);
    return rc;
}

/* Client-side settings: the spec's reading and mapping, no cleaning or filters. */
static void client_side(rf_ingest_opts *o) {
    rf_clean_opts_default(&o->clean);
    o->clean.utf8 = RF_UTF8_REJECT;
    o->clean.nfkc = o->clean.strip_control = o->clean.collapse_whitespace = false;
    o->clean.html_unescape = o->clean.strip_tags = o->clean.lowercase = false;
    o->quality_enabled = false;
    o->language.n_expected = 0;
    o->augment.enabled = false;
}

/* Appends ,"client_rejected":N,"client_reject_reasons":{...} from the stats. */
static int64_t put_client_rejects(rf_buf *out, const rf_stats *stats, uint64_t nul_text) {
    rf_buf js = RF_BUF_INIT;
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *root = NULL, *rej = NULL;
    if (doc && rf_stats_to_json(stats, &js) == RF_OK &&
        rf_json_parse(doc, js.data, js.len, &root) == RF_OK)
        rej = rf_json_get(rf_json_get(root, "ingest"), "rejected");
    int64_t total = (int64_t)nul_text;
    rf_buf reasons = RF_BUF_INIT;
    for (size_t i = 0; rej && rej->type == RF_JSON_OBJECT && i < rej->len; i++) {
        const rf_json_member *m = &rej->u.members[i];
        int64_t n = (int64_t)m->value.num;
        total += n;
        rf_buf_puts(&reasons, reasons.len ? "," : "");
        rf_buf_append_json_str(&reasons, m->key, m->keylen);
        rf_buf_printf(&reasons, ":%" PRId64, n);
    }
    if (nul_text)
        rf_buf_printf(&reasons, "%s\"nul_in_text\":%" PRIu64, reasons.len ? "," : "", nul_text);
    rf_buf_printf(out, ",\"client_rejected\":%" PRId64 ",\"client_reject_reasons\":{%s}", total,
                  reasons.data ? reasons.data : "");
    rf_buf_free(&reasons);
    rf_buf_free(&js);
    rf_json_doc_free(doc);
    return total;
}

static void show_rejects(FILE *rejects, int64_t total) {
    if (!rejects || total == 0) return;
    rewind(rejects);
    char line[1024];
    int shown = 0;
    fprintf(stderr, "refinery submit: %" PRId64 " records refused before pushing%s\n", total,
            total > SHOW_REJECTS ? "; the first ones:" : ":");
    while (shown < SHOW_REJECTS && fgets(line, sizeof line, rejects)) {
        fputs("  ", stderr);
        fputs(line, stderr);
        if (!strchr(line, '\n')) fputc('\n', stderr);
        shown++;
    }
}

typedef struct submit_args {
    const char *spec_path, *run_id;
    bool watch, server_inputs;
    rf_remote r;
    rf_watch_opts w;
} submit_args;

/* Pushes the inputs into run_id; fills *sum. Returns 0 or the exit status. */
static int push_inputs(rf_rpc_client *client, const char *run_id, const rf_ingest_opts *o,
                       const char **inputs, size_t n, Refinery__V1__PushSummary *sum,
                       rf_buf *report) {
    const char *const md[] = {"refinery-run-id", run_id, NULL};
    pusher p = {0};
    rf_stats *stats = rf_stats_new();
    FILE *rejects = tmpfile();
    if (!stats || !rejects) {
        fprintf(stderr, "refinery submit: out of memory or no temporary file\n");
        rf_stats_free(stats);
        if (rejects) fclose(rejects);
        return 1;
    }
    int rc = rf_rpc_stream_open_md(client, "/refinery.v1.Ingest/PushLists", 0, md, &p.stream);
    if (rc == RF_OK) {
        rf_ingest_sink sink = {.rejects = rejects, .emit = push_batch, .emit_ctx = &p};
        rc = rf_ingest_run(o, inputs, n, &sink, stats, &canceled);
        char err[512];
        snprintf(err, sizeof err, "%s", rc ? rf_errmsg() : "");
        ProtobufCMessage *m = NULL;
        if (!p.broken && rf_rpc_stream_close_send(p.stream) == RF_OK && rc == RF_OK &&
            rf_rpc_stream_recv(p.stream, &refinery__v1__push_summary__descriptor, &m) == 1) {
            const Refinery__V1__PushSummary *s = (const Refinery__V1__PushSummary *)m;
            sum->received = s->received;
            sum->accepted = s->accepted;
            sum->rejected = s->rejected;
            protobuf_c_message_free_unpacked(m, NULL);
        }
        rf_rpc_status st;
        int done = rf_rpc_stream_finish(p.stream, &st);
        if (done < 0 && (p.broken || rc == RF_OK)) {
            rc = rf_remote_report("submit", &st);
        } else if (rc < 0) {
            fprintf(stderr, "refinery submit: %s\n", err);
            rc = 1;
        }
    } else {
        fprintf(stderr, "refinery submit: %s\n", rf_errmsg());
        rc = 1;
    }
    rf_buf_printf(report,
                  "\"records\":%" PRId64 ",\"pushed\":%" PRIu64 ",\"accepted\":%" PRIu64
                  ",\"rejected\":%" PRIu64,
                  rf_stats_get(stats, "ingest.records_in"), p.sent, (uint64_t)sum->accepted,
                  (uint64_t)sum->rejected);
    int64_t refused = put_client_rejects(report, stats, p.nul_text);
    show_rejects(rejects, refused);
    fclose(rejects);
    rf_stats_free(stats);
    rf_doc_out_free(&p.list);
    return rc;
}

/* Ingest.Load: the server reads the run's inputs; prints its reply. */
static int load_inputs(rf_rpc_client *client, const submit_args *a, const char *run_id) {
    Refinery__V1__LoadRequest req = REFINERY__V1__LOAD_REQUEST__INIT;
    req.run_id = (char *)run_id;
    ProtobufCMessage *m = NULL;
    rf_rpc_status st;
    if (rf_rpc_unary(client, "/refinery.v1.Ingest/Load", &req.base,
                     &refinery__v1__load_reply__descriptor, &m, a->r.timeout_s, &st) < 0) {
        int rc = rf_remote_report("submit", &st);
        fprintf(stderr, "refinery submit: run %s was submitted but not loaded\n", run_id);
        return rc;
    }
    const Refinery__V1__LoadReply *r = (const Refinery__V1__LoadReply *)m;
    rf_buf out = RF_BUF_INIT;
    rf_buf_puts(&out, "{\"run_id\":");
    rf_buf_append_json_str(&out, run_id, strlen(run_id));
    rf_buf_printf(&out, ",\"server_inputs\":%u,\"batch_docs\":%u,\"load_started\":%s}\n", r->inputs,
                  r->batch_docs, r->started ? "true" : "false");
    fputs(out.data, stdout);
    fflush(stdout);
    rf_buf_free(&out);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static int emit_write(void *data, unsigned char *buf, size_t size) {
    return rf_buf_append(data, buf, size) == RF_OK;
}

static int emit_node(yaml_emitter_t *em, const rf_cfg *n) {
    yaml_event_t ev;
    int ok = 1;
    if (rf_cfg_kind_of(n) == RF_CFG_SCALAR) {
        const char *v = rf_cfg_scalar(n);
        return yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)v, (int)strlen(v), 1, 1,
                                            YAML_ANY_SCALAR_STYLE) &&
               yaml_emitter_emit(em, &ev);
    }
    int map = rf_cfg_kind_of(n) == RF_CFG_MAP;
    ok = map ? yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE)
             : yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE);
    ok = ok && yaml_emitter_emit(em, &ev);
    for (size_t i = 0; ok && i < rf_cfg_len(n); i++) {
        if (map) {
            const char *k = rf_cfg_key_at(n, i);
            ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)k, (int)strlen(k), 1,
                                              1, YAML_ANY_SCALAR_STYLE) &&
                 yaml_emitter_emit(em, &ev);
        }
        ok = ok && emit_node(em, rf_cfg_at(n, i));
    }
    if (!ok) return 0;
    ok = map ? yaml_mapping_end_event_initialize(&ev) : yaml_sequence_end_event_initialize(&ev);
    return ok && yaml_emitter_emit(em, &ev);
}

/* The tree as YAML (a new NUL-terminated string in *out). */
static int emit_yaml(const rf_cfg *root, rf_buf *out) {
    yaml_emitter_t em;
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&em)) return RF_ERR_NOMEM;
    yaml_emitter_set_output(&em, emit_write, out);
    yaml_emitter_set_unicode(&em, 1);
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) &&
             yaml_emitter_emit(&em, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) &&
             yaml_emitter_emit(&em, &ev) && emit_node(&em, root) &&
             yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) &&
             yaml_emitter_flush(&em);
    const char *problem = em.problem;
    yaml_emitter_delete(&em);
    if (!ok) return rf_fail(RF_ERR_INTERNAL, "cannot emit the spec: %s", problem ? problem : "?");
    return rf_buf_putc(out, 0) == RF_OK ? RF_OK : RF_ERR_NOMEM;
}

/* Applies the REFINERY__* overrides to cfg, as `refinery run` does; with
 * any set, replaces *text with the effective spec and lists them. */
static int apply_overrides(rf_cfg *cfg, char **text, size_t *len) {
    extern char **environ;
    int count = 0;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "REFINERY__", 10) == 0 && strchr(*e, '=')) {
            fprintf(stderr, "refinery submit: override %s\n", *e);
            count++;
        }
    if (!count) return RF_OK;
    int rc = rf_cfg_apply_env(cfg);
    if (rc) return rc;
    rf_buf b = RF_BUF_INIT;
    if ((rc = emit_yaml(cfg, &b)) < 0) {
        rf_buf_free(&b);
        return rc;
    }
    free(*text);
    *text = b.data;
    *len = b.len - 1;
    return RF_OK;
}

/* Reads the spec file (overrides applied), and unless the server reads the
 * inputs, the client side of its ingest section. */
static int load_spec(const submit_args *a, char **text, size_t *len, rf_cfg **cfg,
                     rf_ingest_opts *o, const char ***inputs, size_t *n) {
    const rf_cfg *section = NULL;
    int rc = rf_read_file(a->spec_path, 16u << 20, text, len);
    if (!rc) rc = rf_cfg_load_string(*text, *len, a->spec_path, cfg);
    if (!rc) rc = apply_overrides(*cfg, text, len);
    if (!rc && a->server_inputs) return RF_OK;
    if (!rc && !(section = rf_cfg_get(*cfg, "ingest")))
        rc = rf_fail(RF_ERR_INVALID, "%s: no ingest: section with inputs to push", a->spec_path);
    if (!rc) rc = rf_ingest_opts_from_cfg(section, o);
    if (!rc) rc = rf_cfg_strlist(section, "inputs", inputs, n);
    if (!rc && *n == 0)
        rc = rf_fail(RF_ERR_INVALID, "ingest.inputs: expected a list of input files");
    for (size_t i = 0; !rc && i < *n; i++)
        if (access((*inputs)[i], R_OK) != 0)
            rc = rf_fail(RF_ERR_NOT_FOUND, "ingest.inputs: cannot read %s", (*inputs)[i]);
    if (!rc) client_side(o);
    return rc;
}

/* --watch: follows the run on a channel of its own (this one freed, see
 * rf_remote_watch); Ctrl-C now simply ends the command (the handlers stop a
 * push, which is over). */
static int watch(rf_rpc_client **client, const submit_args *a, const char *run_id) {
    rf_rpc_client_free(*client);
    *client = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    return rf_remote_watch(&a->r, "submit", run_id, &a->w);
}

static int submit_run(const submit_args *a) {
    char *text = NULL;
    size_t len = 0, n = 0;
    rf_cfg *cfg = NULL;
    const char **inputs = NULL;
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    rf_rpc_client *client = NULL;
    int rc = load_spec(a, &text, &len, &cfg, &o, &inputs, &n);
    if (rc) {
        fprintf(stderr, "refinery submit: %s\n", rf_errmsg());
        rc = rc == RF_ERR_INVALID || rc == RF_ERR_PARSE ? 2 : 1;
        goto out;
    }
    if (rf_remote_connect(&a->r, a->r.server, "submit", &client) < 0) {
        rc = 1;
        goto out;
    }
    Refinery__V1__SubmitRequest req = REFINERY__V1__SUBMIT_REQUEST__INIT;
    req.spec_yaml = text;
    req.run_id = (char *)(a->run_id ? a->run_id : "");
    ProtobufCMessage *m = NULL;
    rf_rpc_status st;
    if (rf_rpc_unary(client, "/refinery.v1.Control/Submit", &req.base,
                     &refinery__v1__run_status__descriptor, &m, a->r.timeout_s, &st) < 0) {
        rc = rf_remote_report("submit", &st);
        goto out;
    }
    char run_id[128];
    snprintf(run_id, sizeof run_id, "%s", ((Refinery__V1__RunStatus *)m)->run_id);
    protobuf_c_message_free_unpacked(m, NULL);
    if (a->server_inputs) {
        fprintf(stderr, "refinery submit: run %s submitted; the server loads its inputs\n", run_id);
        rc = load_inputs(client, a, run_id);
        if (rc == 0 && a->watch) rc = watch(&client, a, run_id);
        goto out;
    }
    fprintf(stderr, "refinery submit: run %s submitted; pushing %zu input(s)\n", run_id, n);

    rf_buf report = RF_BUF_INIT;
    rf_buf_puts(&report, "{\"run_id\":");
    rf_buf_append_json_str(&report, run_id, strlen(run_id));
    rf_buf_putc(&report, ',');
    Refinery__V1__PushSummary sum = REFINERY__V1__PUSH_SUMMARY__INIT;
    rc = push_inputs(client, run_id, &o, inputs, n, &sum, &report);
    Refinery__V1__RunStatus *sealed = NULL;
    if (rc == 0 && rf_remote_run_call(client, &a->r, "Seal", run_id, &sealed, &st) < 0)
        rc = rf_remote_report("submit", &st);
    rf_buf_printf(&report, ",\"sealed\":%s}\n", sealed && sealed->sealed ? "true" : "false");
    fputs(report.data, stdout);
    fflush(stdout);
    rf_buf_free(&report);
    if (sealed) protobuf_c_message_free_unpacked(&sealed->base, NULL);
    if (rc)
        fprintf(stderr, "refinery submit: run %s is not sealed: its input is incomplete\n", run_id);
    else if (a->watch)
        rc = watch(&client, a, run_id);
out:
    rf_rpc_client_free(client);
    free(inputs);
    rf_ingest_opts_free(&o);
    rf_cfg_free(cfg);
    free(text);
    return rc;
}

static int cmd_submit(int argc, char **argv) {
    static const struct option longopts[] = {RF_REMOTE_LONGOPTS,
                                             RF_WATCH_LONGOPTS,
                                             {"run-id", required_argument, NULL, 'r'},
                                             {"watch", no_argument, NULL, 'w'},
                                             {"server-inputs", no_argument, NULL, 's'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    submit_args a = {0};
    rf_remote_init(&a.r);
    if (rf_watch_opts_init(&a.w) < 0) return 2;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&a.r, c, optarg);
        if (!shared) shared = rf_watch_option(&a.w, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        switch (c) {
        case 'r':
            a.run_id = optarg;
            break;
        case 'w':
            a.watch = true;
            break;
        case 's':
            a.server_inputs = true;
            break;
        case 'j':
            a.w.json = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 1) {
        usage(stderr);
        return 2;
    }
    a.spec_path = argv[optind];
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return submit_run(&a);
}

static const rf_command submit_cmd = {"submit", "submit a spec as a run and push its inputs",
                                      cmd_submit};
RF_COMMAND(submit_cmd)
