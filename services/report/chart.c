#include "report/chart.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "report/report.h"

static int open_svg(rf_buf *out, const char *id, const char *title, int w, int h) {
    int rc = rf_buf_printf(out,
                           "<svg class=\"chart\" data-chart=\"%s\" role=\"img\" width=\"%d\" "
                           "height=\"%d\" viewBox=\"0 0 %d %d\" "
                           "xmlns=\"http://www.w3.org/2000/svg\"><title>",
                           id, w, h, w, h);
    if (rc == RF_OK) rc = rf_html_escape(out, title, strlen(title));
    if (rc == RF_OK) rc = rf_buf_puts(out, "</title>");
    return rc;
}

/* A number in at most 4 significant digits, for labels. */
static void fmt(char *s, size_t n, double v) {
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-3))
        snprintf(s, n, "%.3g", v);
    else
        snprintf(s, n, "%.4g", v);
}

int rf_chart_bars(rf_buf *out, const char *id, const char *title, const char *const *labels,
                  const double *values, size_t n) {
    const int lw = 200, bw = 420, row = 22, w = lw + bw + 90;
    int h = (int)n * row + 10;
    double max = 0;
    for (size_t i = 0; i < n; i++)
        if (values[i] > max) max = values[i];
    int rc = open_svg(out, id, title, w, h);
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        double len = max > 0 && values[i] > 0 ? values[i] / max * bw : 0;
        int y = 5 + (int)i * row;
        char v[32];
        fmt(v, sizeof v, values[i]);
        rc = rf_buf_printf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", lw - 6, y + 15);
        if (rc == RF_OK) rc = rf_html_escape(out, labels[i], strlen(labels[i]));
        if (rc == RF_OK)
            rc = rf_buf_printf(out,
                               "</text><rect class=\"bar\" x=\"%d\" y=\"%d\" width=\"%.1f\" "
                               "height=\"%d\"/><text x=\"%.1f\" y=\"%d\">%s</text>",
                               lw, y + 2, len < 1 && values[i] > 0 ? 1.0 : len, row - 6,
                               lw + len + 5, y + 15, v);
    }
    return rc ? rc : rf_buf_puts(out, "</svg>\n");
}

int rf_chart_line(rf_buf *out, const char *id, const char *title, const double *x, const double *y,
                  size_t n, const char *xlabel) {
    const int w = 470, h = 200, l = 60, r = 16, t = 14, b = 34;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        x0 = fmin(x0, x[i]);
        x1 = fmax(x1, x[i]);
        y0 = fmin(y0, y[i]);
        y1 = fmax(y1, y[i]);
    }
    if (!(x1 >= x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : fabs(y0) * 0.1), y0 -= (y1 - y0) / 2;
    int rc = open_svg(out, id, title, w, h);
    char a[32], bb[32], c[32], d[32];
    fmt(a, sizeof a, y1);
    fmt(bb, sizeof bb, y0);
    fmt(c, sizeof c, x0);
    fmt(d, sizeof d, x1);
    if (rc == RF_OK)
        rc = rf_buf_printf(out,
                           "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>"
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>"
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>"
                           "<text x=\"%d\" y=\"%d\">%s</text>"
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>"
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">",
                           l, t, w - l - r, h - t - b, l - 4, t + 10, a, l - 4, h - b, bb, l,
                           h - b + 14, c, w - r, h - b + 14, d, (l + w - r) / 2, h - 4);
    if (rc == RF_OK) rc = rf_html_escape(out, xlabel, strlen(xlabel));
    if (rc == RF_OK) rc = rf_buf_puts(out, "</text><polyline class=\"curve\" points=\"");
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        double px = l + (x[i] - x0) / (x1 - x0) * (w - l - r);
        double py = (h - b) - (y[i] - y0) / (y1 - y0) * (h - t - b);
        rc = rf_buf_printf(out, "%.1f,%.1f ", px, py);
    }
    if (rc == RF_OK) rc = rf_buf_puts(out, "\"/>");
    if (rc == RF_OK && n == 1) /* one point draws no line: a dot */
        rc = rf_buf_printf(out, "<circle class=\"dot\" cx=\"%d\" cy=\"%d\" r=\"3\"/>", l,
                           (h - b + t) / 2);
    return rc ? rc : rf_buf_puts(out, "</svg>\n");
}

int rf_chart_heatmap(rf_buf *out, const char *id, const char *title, const double *m, size_t k) {
    const int cell = k > 12 ? 28 : 48, pad = 60;
    int size = pad + (int)k * cell + 10;
    int rc = open_svg(out, id, title, size, size);
    if (rc == RF_OK)
        rc = rf_buf_printf(out,
                           "<text x=\"%d\" y=\"12\" text-anchor=\"middle\">predicted</text>"
                           "<text x=\"12\" y=\"%d\" transform=\"rotate(-90 12 %d)\" "
                           "text-anchor=\"middle\">true</text>",
                           pad + (int)k * cell / 2, pad + (int)k * cell / 2,
                           pad + (int)k * cell / 2);
    for (size_t i = 0; rc == RF_OK && i < k; i++) {
        rc = rf_buf_printf(out,
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%zu</text>"
                           "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%zu</text>",
                           pad + (int)i * cell + cell / 2, pad - 6, i, pad - 6,
                           pad + (int)i * cell + cell / 2 + 4, i);
        double rowsum = 0;
        for (size_t j = 0; j < k; j++)
            rowsum += m[i * k + j];
        for (size_t j = 0; rc == RF_OK && j < k; j++) {
            double v = m[i * k + j], share = rowsum > 0 ? v / rowsum : 0;
            rc = rf_buf_printf(out,
                               "<rect class=\"cell\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                               "fill=\"rgba(%s,%.3f)\"/><text x=\"%d\" y=\"%d\" "
                               "text-anchor=\"middle\">%.0f</text>",
                               pad + (int)j * cell, pad + (int)i * cell, cell - 2, cell - 2,
                               i == j ? "40,120,200" : "200,60,40", 0.1 + 0.9 * share,
                               pad + (int)j * cell + cell / 2, pad + (int)i * cell + cell / 2 + 4,
                               v);
        }
    }
    return rc ? rc : rf_buf_puts(out, "</svg>\n");
}
