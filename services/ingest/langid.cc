// Language identification through CLD2 (C++ API) behind the C interface of
// langid.h, and the language-consistency policy on top of it.
#include <cstdint>
#include <cstdio> // compact_lang_det.h uses FILE without including it
#include <cstdlib>
#include <cstring>

#include <cld2/public/compact_lang_det.h>

extern "C" {
#include "common/error.h"
#include "common/utf8.h"
#include "ingest/langid.h"
}

// CLD2 looks at most at this much text; longer documents are judged on their
// first bytes (cut at a code point boundary).
static const size_t kMaxDetectBytes = 1 << 20;

extern "C" int rf_langid_detect(const char *text, size_t n, rf_langid_result *r) {
    std::memset(r, 0, sizeof *r);
    if (n > kMaxDetectBytes) {
        n = kMaxDetectBytes;
        while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80)
            n--;
    }
    // CLD2's own check (ExtDetectLanguageSummaryCheckUTF8) also refuses valid
    // text with noncharacters such as U+FDEB; validate with the Unicode
    // definition instead and give CLD2 the text it then may assume valid.
    if (!rf_utf8_valid(text, n))
        return rf_fail(RF_ERR_INVALID, "langid: invalid UTF-8 at byte %zu",
                       rf_utf8_first_invalid(text, n));
    CLD2::Language lang3[3];
    int percent3[3];
    double score3[3];
    int text_bytes = 0;
    bool reliable = false;
    CLD2::Language top =
        CLD2::ExtDetectLanguageSummary(text, static_cast<int>(n), true, nullptr, 0, lang3, percent3,
                                       score3, nullptr, &text_bytes, &reliable);
    std::snprintf(r->code, sizeof r->code, "%s", CLD2::LanguageCode(top));
    r->reliable = reliable;
    for (int i = 0; i < 3; i++) {
        if (lang3[i] == top) {
            r->percent = percent3[i];
            r->score = score3[i];
            break;
        }
    }
    return 0;
}

extern "C" void rf_langid_opts_default(rf_langid_opts *o) {
    std::memset(o, 0, sizeof *o);
    o->min_percent = 50;
    o->min_bytes = 40;
}

extern "C" int rf_langid_opts_from_cfg(const rf_cfg *sec, rf_langid_opts *o) {
    static const char *const kKeys[] = {"expected", "min_percent", "min_bytes", nullptr};
    if (!sec) return 0;
    int rc = rf_cfg_check_keys(sec, kKeys);
    if (rc) return rc;
    int64_t pct;
    if ((rc = rf_cfg_int(sec, "min_percent", o->min_percent, 0, 100, &pct))) return rc;
    o->min_percent = static_cast<int>(pct);
    int64_t bytes;
    if ((rc = rf_cfg_int(sec, "min_bytes", static_cast<int64_t>(o->min_bytes), 0, INT64_MAX,
                         &bytes)))
        return rc;
    o->min_bytes = static_cast<size_t>(bytes);
    if (!rf_cfg_get(sec, "expected")) return 0;
    const char **codes = nullptr;
    size_t count = 0;
    if ((rc = rf_cfg_strlist(sec, "expected", &codes, &count))) return rc;
    if (count > RF_LANGID_MAX_EXPECTED) {
        rc = rf_fail(RF_ERR_INVALID, "%s: at most %d expected languages, got %zu",
                     rf_cfg_path(rf_cfg_get(sec, "expected")), RF_LANGID_MAX_EXPECTED, count);
    }
    for (size_t i = 0; !rc && i < count; i++) {
        size_t len = std::strlen(codes[i]);
        if (len == 0 || len >= sizeof o->expected[i])
            rc = rf_fail(RF_ERR_INVALID, "%s: '%s' is not a language code",
                         rf_cfg_path(rf_cfg_get(sec, "expected")), codes[i]);
        else
            std::memcpy(o->expected[i], codes[i], len + 1);
    }
    if (!rc) o->n_expected = count;
    std::free(codes);
    return rc;
}

extern "C" int rf_langid_check(const rf_langid_opts *o, const char *text, size_t n,
                               const char **reason, rf_langid_result *r) {
    rf_langid_result local;
    if (!r) r = &local;
    *reason = nullptr;
    if (o->n_expected == 0 || n < o->min_bytes) {
        std::memset(r, 0, sizeof *r);
        return 0;
    }
    int rc = rf_langid_detect(text, n, r);
    if (rc) return rc;
    if (!r->reliable || std::strcmp(r->code, "un") == 0 || r->percent < o->min_percent) return 0;
    for (size_t i = 0; i < o->n_expected; i++)
        if (std::strcmp(r->code, o->expected[i]) == 0) return 0;
    *reason = "wrong_language";
    return 0;
}
