#include "evaluator/metrics.h"

#include <stdlib.h>

#include "common/error.h"

int rf_metrics_init(rf_metrics *m, int k) {
    m->k = k;
    m->n = 0;
    m->loss_sum = 0;
    m->confusion = calloc((size_t)k * k, sizeof *m->confusion);
    return m->confusion ? RF_OK : RF_ERR_NOMEM;
}

void rf_metrics_free(rf_metrics *m) {
    free(m->confusion);
    m->confusion = NULL;
}

void rf_metrics_add(rf_metrics *m, int label, int pred, double loss) {
    m->confusion[(size_t)label * m->k + pred]++;
    m->n++;
    m->loss_sum += loss;
}

double rf_metrics_accuracy(const rf_metrics *m) {
    uint64_t ok = 0;
    for (int c = 0; c < m->k; c++)
        ok += m->confusion[(size_t)c * m->k + c];
    return m->n ? (double)ok / (double)m->n : 0;
}

double rf_metrics_loss(const rf_metrics *m) {
    return m->n ? m->loss_sum / (double)m->n : 0;
}

rf_class_scores rf_metrics_class(const rf_metrics *m, int c) {
    uint64_t tp = m->confusion[(size_t)c * m->k + c], pred = 0, truth = 0;
    for (int j = 0; j < m->k; j++) {
        pred += m->confusion[(size_t)j * m->k + c];
        truth += m->confusion[(size_t)c * m->k + j];
    }
    rf_class_scores s = {0};
    s.support = truth;
    s.precision = pred ? (double)tp / (double)pred : 0;
    s.recall = truth ? (double)tp / (double)truth : 0;
    s.f1 = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0;
    return s;
}

rf_class_scores rf_metrics_macro(const rf_metrics *m) {
    rf_class_scores s = {0};
    for (int c = 0; c < m->k; c++) {
        rf_class_scores x = rf_metrics_class(m, c);
        s.precision += x.precision / m->k;
        s.recall += x.recall / m->k;
        s.f1 += x.f1 / m->k;
        s.support += x.support;
    }
    return s;
}

int rf_metrics_to_json(const rf_metrics *m, rf_buf *o) {
    rf_class_scores mac = rf_metrics_macro(m);
    int rc = rf_buf_printf(o,
                           "{\"examples\":%llu,\"accuracy\":%.6f,\"loss\":%.6f,"
                           "\"macro\":{\"precision\":%.6f,\"recall\":%.6f,\"f1\":%.6f},"
                           "\"per_class\":[",
                           (unsigned long long)m->n, rf_metrics_accuracy(m), rf_metrics_loss(m),
                           mac.precision, mac.recall, mac.f1);
    for (int c = 0; c < m->k && !rc; c++) {
        rf_class_scores x = rf_metrics_class(m, c);
        rc = rf_buf_printf(o,
                           "%s{\"class\":%d,\"precision\":%.6f,\"recall\":%.6f,\"f1\":%.6f,"
                           "\"support\":%llu}",
                           c ? "," : "", c, x.precision, x.recall, x.f1,
                           (unsigned long long)x.support);
    }
    if (!rc) rc = rf_buf_puts(o, "],\"confusion\":[");
    for (int c = 0; c < m->k && !rc; c++) {
        rc = rf_buf_puts(o, c ? ",[" : "[");
        for (int j = 0; j < m->k && !rc; j++)
            rc = rf_buf_printf(o, "%s%llu", j ? "," : "",
                               (unsigned long long)m->confusion[(size_t)c * m->k + j]);
        if (!rc) rc = rf_buf_putc(o, ']');
    }
    return rc ? rc : rf_buf_puts(o, "]}");
}
