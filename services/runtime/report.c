#include "common/buf.h"
#include "common/log.h"
#include "runtime/svc.h"

void rf_svc_log_stats(const char *comp, const rf_stats *stats) {
    rf_buf b = RF_BUF_INIT;
    rf_stats_to_json(stats, &b);
    rf_info(comp, "stopped: %s", b.data ? b.data : "{}");
    rf_buf_free(&b);
}
