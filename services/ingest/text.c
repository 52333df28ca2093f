/* Plain-text record helpers: see text.h. */
#include "ingest/text.h"

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

bool rf_text_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return false;
    return true;
}

bool rf_text_wikitext_heading(const char *s, size_t n) {
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    return n >= 5 && s[0] == '=' && s[1] == ' ' && s[n - 1] == '=' && s[n - 2] == ' ';
}

void rf_paragraph_init(rf_paragraph *p, size_t max) {
    *p = (rf_paragraph){.text = RF_BUF_INIT, .max = max};
}

void rf_paragraph_free(rf_paragraph *p) {
    rf_buf_free(&p->text);
}

void rf_paragraph_reset(rf_paragraph *p) {
    rf_buf_reset(&p->text);
    p->nlines = 0;
    p->too_long = false;
}

int rf_paragraph_add(rf_paragraph *p, const char *s, size_t n, uint64_t line, uint64_t offset) {
    if (p->nlines++ == 0) {
        p->line = line;
        p->offset = offset;
    }
    if (p->too_long) return 0;
    if (p->max && p->text.len + 1 + n > p->max) {
        p->too_long = true;
        return 0;
    }
    int rc = p->text.len ? rf_buf_putc(&p->text, '\n') : 0;
    return rc ? rc : rf_buf_append(&p->text, s, n);
}
