/* Inline SVG charts for the run report: horizontal bars, line curves and a
 * heat map. Each writes one <svg class="chart" data-chart="ID" role="img">
 * with a <title>, so a test can find it; labels are HTML-escaped. */
#ifndef RF_REPORT_CHART_H
#define RF_REPORT_CHART_H

#include <stddef.h>

#include "common/buf.h"

/* One bar per label, longest value = full width; the value printed after it. */
int rf_chart_bars(rf_buf *out, const char *id, const char *title, const char *const *labels,
                  const double *values, size_t n);
/* y over x as a polyline, with the axis ranges printed at the corners. */
int rf_chart_line(rf_buf *out, const char *id, const char *title, const double *x, const double *y,
                  size_t n, const char *xlabel);
/* A k x k matrix of counts (rows: true class, columns: predicted), cells
 * shaded by their share of the row. */
int rf_chart_heatmap(rf_buf *out, const char *id, const char *title, const double *m, size_t k);

#endif
