/* HTML tag stripping and character-reference decoding (see html.h). */
#include "ingest/html.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/utf8.h"

typedef struct entity {
    const char *name;
    uint32_t cp;
} entity;

/* The HTML 4.01 set (252 names, Python's html.entities.name2codepoint), &apos;
 * and single-code-point HTML5 names common in web text; sorted by strcmp. */
static const entity ENTITIES[] = {
    {"AElig", 0xC6},
    {"Aacute", 0xC1},
    {"Acirc", 0xC2},
    {"Agrave", 0xC0},
    {"Alpha", 0x391},
    {"Aring", 0xC5},
    {"Atilde", 0xC3},
    {"Auml", 0xC4},
    {"Beta", 0x392},
    {"Ccedil", 0xC7},
    {"Chi", 0x3A7},
    {"Dagger", 0x2021},
    {"Delta", 0x394},
    {"ETH", 0xD0},
    {"Eacute", 0xC9},
    {"Ecirc", 0xCA},
    {"Egrave", 0xC8},
    {"Epsilon", 0x395},
    {"Eta", 0x397},
    {"Euml", 0xCB},
    {"Gamma", 0x393},
    {"Hat", 0x5E},
    {"Iacute", 0xCD},
    {"Icirc", 0xCE},
    {"Igrave", 0xCC},
    {"Iota", 0x399},
    {"Iuml", 0xCF},
    {"Kappa", 0x39A},
    {"Lambda", 0x39B},
    {"Mu", 0x39C},
    {"NewLine", 0xA},
    {"NonBreakingSpace", 0xA0},
    {"Ntilde", 0xD1},
    {"Nu", 0x39D},
    {"OElig", 0x152},
    {"Oacute", 0xD3},
    {"Ocirc", 0xD4},
    {"Ograve", 0xD2},
    {"Omega", 0x3A9},
    {"Omicron", 0x39F},
    {"Oslash", 0xD8},
    {"Otilde", 0xD5},
    {"Ouml", 0xD6},
    {"Phi", 0x3A6},
    {"Pi", 0x3A0},
    {"Prime", 0x2033},
    {"Psi", 0x3A8},
    {"Rho", 0x3A1},
    {"Scaron", 0x160},
    {"Sigma", 0x3A3},
    {"THORN", 0xDE},
    {"Tab", 0x9},
    {"Tau", 0x3A4},
    {"Theta", 0x398},
    {"Uacute", 0xDA},
    {"Ucirc", 0xDB},
    {"Ugrave", 0xD9},
    {"Upsilon", 0x3A5},
    {"Uuml", 0xDC},
    {"Xi", 0x39E},
    {"Yacute", 0xDD},
    {"Yuml", 0x178},
    {"ZeroWidthSpace", 0x200B},
    {"Zeta", 0x396},
    {"aacute", 0xE1},
    {"acirc", 0xE2},
    {"acute", 0xB4},
    {"aelig", 0xE6},
    {"agrave", 0xE0},
    {"alefsym", 0x2135},
    {"alpha", 0x3B1},
    {"amp", 0x26},
    {"and", 0x2227},
    {"ang", 0x2220},
    {"apos", 0x27},
    {"aring", 0xE5},
    {"ast", 0x2A},
    {"asymp", 0x2248},
    {"atilde", 0xE3},
    {"auml", 0xE4},
    {"bdquo", 0x201E},
    {"beta", 0x3B2},
    {"brvbar", 0xA6},
    {"bsol", 0x5C},
    {"bull", 0x2022},
    {"cap", 0x2229},
    {"ccedil", 0xE7},
    {"cedil", 0xB8},
    {"cent", 0xA2},
    {"check", 0x2713},
    {"chi", 0x3C7},
    {"circ", 0x2C6},
    {"clubs", 0x2663},
    {"colon", 0x3A},
    {"comma", 0x2C},
    {"commat", 0x40},
    {"cong", 0x2245},
    {"copy", 0xA9},
    {"crarr", 0x21B5},
    {"cross", 0x2717},
    {"cup", 0x222A},
    {"curren", 0xA4},
    {"dArr", 0x21D3},
    {"dagger", 0x2020},
    {"darr", 0x2193},
    {"dash", 0x2010},
    {"deg", 0xB0},
    {"delta", 0x3B4},
    {"diams", 0x2666},
    {"die", 0xA8},
    {"divide", 0xF7},
    {"dollar", 0x24},
    {"dot", 0x2D9},
    {"eacute", 0xE9},
    {"ecirc", 0xEA},
    {"egrave", 0xE8},
    {"empty", 0x2205},
    {"emsp", 0x2003},
    {"ensp", 0x2002},
    {"epsilon", 0x3B5},
    {"equals", 0x3D},
    {"equiv", 0x2261},
    {"eta", 0x3B7},
    {"eth", 0xF0},
    {"euml", 0xEB},
    {"euro", 0x20AC},
    {"excl", 0x21},
    {"exist", 0x2203},
    {"female", 0x2640},
    {"flat", 0x266D},
    {"fnof", 0x192},
    {"forall", 0x2200},
    {"frac12", 0xBD},
    {"frac13", 0x2153},
    {"frac14", 0xBC},
    {"frac23", 0x2154},
    {"frac34", 0xBE},
    {"frasl", 0x2044},
    {"gamma", 0x3B3},
    {"ge", 0x2265},
    {"grave", 0x60},
    {"gt", 0x3E},
    {"hArr", 0x21D4},
    {"half", 0xBD},
    {"harr", 0x2194},
    {"hearts", 0x2665},
    {"hellip", 0x2026},
    {"hyphen", 0x2010},
    {"iacute", 0xED},
    {"icirc", 0xEE},
    {"iexcl", 0xA1},
    {"igrave", 0xEC},
    {"image", 0x2111},
    {"infin", 0x221E},
    {"int", 0x222B},
    {"iota", 0x3B9},
    {"iquest", 0xBF},
    {"isin", 0x2208},
    {"iuml", 0xEF},
    {"kappa", 0x3BA},
    {"lArr", 0x21D0},
    {"lambda", 0x3BB},
    {"lang", 0x2329},
    {"laquo", 0xAB},
    {"larr", 0x2190},
    {"lceil", 0x2308},
    {"lcub", 0x7B},
    {"ldquo", 0x201C},
    {"le", 0x2264},
    {"leftarrow", 0x2190},
    {"lfloor", 0x230A},
    {"lowast", 0x2217},
    {"lowbar", 0x5F},
    {"loz", 0x25CA},
    {"lpar", 0x28},
    {"lrm", 0x200E},
    {"lsaquo", 0x2039},
    {"lsqb", 0x5B},
    {"lsquo", 0x2018},
    {"lt", 0x3C},
    {"macr", 0xAF},
    {"male", 0x2642},
    {"mdash", 0x2014},
    {"micro", 0xB5},
    {"middot", 0xB7},
    {"minus", 0x2212},
    {"mldr", 0x2026},
    {"mu", 0x3BC},
    {"nabla", 0x2207},
    {"natural", 0x266E},
    {"nbsp", 0xA0},
    {"ndash", 0x2013},
    {"ne", 0x2260},
    {"ni", 0x220B},
    {"nldr", 0x2025},
    {"not", 0xAC},
    {"notin", 0x2209},
    {"nsub", 0x2284},
    {"ntilde", 0xF1},
    {"nu", 0x3BD},
    {"num", 0x23},
    {"oacute", 0xF3},
    {"ocirc", 0xF4},
    {"oelig", 0x153},
    {"ograve", 0xF2},
    {"oline", 0x203E},
    {"omega", 0x3C9},
    {"omicron", 0x3BF},
    {"oplus", 0x2295},
    {"or", 0x2228},
    {"ordf", 0xAA},
    {"ordm", 0xBA},
    {"oslash", 0xF8},
    {"otilde", 0xF5},
    {"otimes", 0x2297},
    {"ouml", 0xF6},
    {"para", 0xB6},
    {"part", 0x2202},
    {"percnt", 0x25},
    {"period", 0x2E},
    {"permil", 0x2030},
    {"perp", 0x22A5},
    {"phi", 0x3C6},
    {"phone", 0x260E},
    {"pi", 0x3C0},
    {"piv", 0x3D6},
    {"plus", 0x2B},
    {"plusmn", 0xB1},
    {"pound", 0xA3},
    {"prime", 0x2032},
    {"prod", 0x220F},
    {"prop", 0x221D},
    {"psi", 0x3C8},
    {"quest", 0x3F},
    {"quot", 0x22},
    {"rArr", 0x21D2},
    {"radic", 0x221A},
    {"rang", 0x232A},
    {"raquo", 0xBB},
    {"rarr", 0x2192},
    {"rceil", 0x2309},
    {"rcub", 0x7D},
    {"rdquo", 0x201D},
    {"real", 0x211C},
    {"reg", 0xAE},
    {"rfloor", 0x230B},
    {"rho", 0x3C1},
    {"rightarrow", 0x2192},
    {"rlm", 0x200F},
    {"rpar", 0x29},
    {"rsaquo", 0x203A},
    {"rsqb", 0x5D},
    {"rsquo", 0x2019},
    {"sbquo", 0x201A},
    {"scaron", 0x161},
    {"sdot", 0x22C5},
    {"sect", 0xA7},
    {"semi", 0x3B},
    {"sharp", 0x266F},
    {"shy", 0xAD},
    {"sigma", 0x3C3},
    {"sigmaf", 0x3C2},
    {"sim", 0x223C},
    {"sol", 0x2F},
    {"spades", 0x2660},
    {"star", 0x2606},
    {"starf", 0x2605},
    {"sub", 0x2282},
    {"sube", 0x2286},
    {"sum", 0x2211},
    {"sup", 0x2283},
    {"sup1", 0xB9},
    {"sup2", 0xB2},
    {"sup3", 0xB3},
    {"supe", 0x2287},
    {"szlig", 0xDF},
    {"tau", 0x3C4},
    {"there4", 0x2234},
    {"theta", 0x3B8},
    {"thetasym", 0x3D1},
    {"thinsp", 0x2009},
    {"thorn", 0xFE},
    {"tilde", 0x2DC},
    {"times", 0xD7},
    {"trade", 0x2122},
    {"uArr", 0x21D1},
    {"uacute", 0xFA},
    {"uarr", 0x2191},
    {"ucirc", 0xFB},
    {"ugrave", 0xF9},
    {"uml", 0xA8},
    {"upsih", 0x3D2},
    {"upsilon", 0x3C5},
    {"uuml", 0xFC},
    {"verbar", 0x7C},
    {"vert", 0x7C},
    {"weierp", 0x2118},
    {"xi", 0x3BE},
    {"yacute", 0xFD},
    {"yen", 0xA5},
    {"yuml", 0xFF},
    {"zeta", 0x3B6},
    {"zwj", 0x200D},
    {"zwnj", 0x200C},
};

static int entity_cmp(const void *key, const void *elem) {
    const entity *k = key, *e = elem;
    return strcmp(k->name, e->name);
}

uint32_t rf_html_entity_lookup(const char *name, size_t len) {
    char tmp[32];
    if (len == 0 || len >= sizeof tmp) return 0;
    memcpy(tmp, name, len);
    tmp[len] = '\0';
    entity key = {tmp, 0};
    const entity *e = bsearch(&key, ENTITIES, sizeof ENTITIES / sizeof ENTITIES[0],
                              sizeof ENTITIES[0], entity_cmp);
    return e ? e->cp : 0;
}

/* HTML5 maps numeric references 0x80..0x9F through windows-1252 ("&#150;" is an
 * en dash); 0 marks the five undefined slots, which stay as the C1 control. */
static const uint16_t CP1252[32] = {
    0x20AC, 0,      0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0,      0x017D, 0,      0,      0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0,      0x017E, 0x0178,
};

static uint32_t numeric_cp(uint32_t v) {
    if (v == 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return RF_UTF8_REPLACEMENT;
    if (v >= 0x80 && v <= 0x9F && CP1252[v - 0x80]) return CP1252[v - 0x80];
    return v;
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}
static bool is_alpha(unsigned char c) {
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}
static bool is_alnum(unsigned char c) {
    return is_alpha(c) || is_digit(c);
}
static int hex_val(unsigned char c) {
    if (is_digit(c)) return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Parses a reference at s[0..n) (s[0] == '&'). Returns its length including
 * ';' and stores the code point, or 0 if it is not a complete known reference. */
static size_t parse_ref(const char *s, size_t n, uint32_t *cp) {
    size_t i = 1;
    if (i < n && s[i] == '#') {
        i++;
        bool hex = i < n && (s[i] | 0x20) == 'x';
        if (hex) i++;
        size_t start = i;
        uint32_t v = 0;
        for (; i < n; i++) {
            int d = hex ? hex_val((unsigned char)s[i])
                        : (is_digit((unsigned char)s[i]) ? s[i] - '0' : -1);
            if (d < 0) break;
            v = v > 0x10FFFF ? v
                             : v * (hex ? 16 : 10) + (uint32_t)d; /* saturates above the range */
        }
        if (i == start || i >= n || s[i] != ';') return 0;
        *cp = numeric_cp(v);
        return i + 1;
    }
    size_t start = i;
    while (i < n && i - start < 31 && is_alnum((unsigned char)s[i]))
        i++;
    if (i == start || i >= n || s[i] != ';') return 0;
    uint32_t v = rf_html_entity_lookup(s + start, i - start);
    if (!v) return 0;
    *cp = v;
    return i + 1;
}

int rf_html_unescape(const char *in, size_t n, rf_buf *out, size_t *count) {
    size_t done = 0, decoded = 0;
    const char *amp;
    while ((amp = memchr(in + done, '&', n - done)) != NULL) {
        size_t at = (size_t)(amp - in);
        uint32_t cp;
        size_t len = parse_ref(amp, n - at, &cp);
        if (!len) {
            if (rf_buf_append(out, in + done, at + 1 - done)) return RF_ERR_NOMEM;
            done = at + 1;
            continue;
        }
        char enc[4];
        if (rf_buf_append(out, in + done, at - done) ||
            rf_buf_append(out, enc, rf_utf8_encode(cp, enc)))
            return RF_ERR_NOMEM;
        decoded++;
        done = at + len;
    }
    if (count) *count += decoded;
    return rf_buf_append(out, in + done, n - done) ? RF_ERR_NOMEM : 0;
}

/* Case-insensitive search for needle (lowercase ASCII) in s[0..n). */
static const char *find_ci(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && (s[i + j] | 0x20) == needle[j])
            j++;
        if (j == m) return s + i;
    }
    return NULL;
}

/* Tags after which text on either side belongs to different words. */
static bool is_block_tag(const char *name, size_t len) {
    static const char *const BLOCK[] = {
        "address", "article", "aside", "blockquote", "br",         "caption", "dd",
        "div",     "dl",      "dt",    "fieldset",   "figcaption", "figure",  "footer",
        "form",    "h1",      "h2",    "h3",         "h4",         "h5",      "h6",
        "header",  "hr",      "img",   "li",         "main",       "nav",     "ol",
        "option",  "p",       "pre",   "section",    "table",      "tbody",   "td",
        "tfoot",   "th",      "thead", "title",      "tr",         "ul",      NULL};
    char low[16];
    if (len >= sizeof low) return false;
    for (size_t i = 0; i < len; i++)
        low[i] = (char)(name[i] | 0x20);
    low[len] = '\0';
    for (const char *const *b = BLOCK; *b; b++)
        if (strcmp(*b, low) == 0) return true;
    return false;
}

static bool name_is(const char *name, size_t len, const char *lower) {
    if (strlen(lower) != len) return false;
    for (size_t i = 0; i < len; i++)
        if ((name[i] | 0x20) != lower[i]) return false;
    return true;
}

/* Length of the tag-like construct at s[0..n) (s[0] == '<'), 0 if none (the
 * '<' is then text). *space tells whether it separates words; *raw is set to
 * "script"/"style" when their bodies must be skipped; *eof is set when the
 * construct runs to the end of the input unterminated. */
static size_t tag_len(const char *s, size_t n, bool *space, const char **raw, bool *eof) {
    *space = false;
    *raw = NULL;
    *eof = false;
    if (n < 2) return 0;
    if (n >= 4 && memcmp(s, "<!--", 4) == 0) {
        const char *end = n > 4 ? find_ci(s + 4, n - 4, "-->") : NULL;
        *space = true;
        *eof = !end;
        return end ? (size_t)(end - s) + 3 : 0;
    }
    if (s[1] == '!' || s[1] == '?') { /* doctype, CDATA, processing instruction */
        const char *end = memchr(s, '>', n);
        *space = true;
        *eof = !end;
        return end ? (size_t)(end - s) + 1 : 0;
    }
    size_t i = 1;
    bool closing = s[i] == '/';
    if (closing) i++;
    if (i >= n || !is_alpha((unsigned char)s[i])) return 0;
    size_t name = i;
    while (i < n && (is_alnum((unsigned char)s[i]) || s[i] == '-' || s[i] == ':'))
        i++;
    size_t name_len = i - name;
    /* Attributes: a quote right after '=' (spaces allowed) opens a value that may
     * contain '>'. */
    bool after_eq = false;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '>') break;
        if ((c == '"' || c == '\'') && after_eq) {
            const char *q = memchr(s + i + 1, c, n - i - 1);
            if (!q) {
                *eof = true;
                return 0;
            }
            i = (size_t)(q - s);
            after_eq = false;
        } else if (c == '=') {
            after_eq = true;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            after_eq = false;
        }
    }
    if (i >= n) {
        *eof = true;
        return 0;
    }
    *space = is_block_tag(s + name, name_len);
    if (!closing && name_is(s + name, name_len, "script")) *raw = "</script";
    if (!closing && name_is(s + name, name_len, "style")) *raw = "</style";
    return i + 1;
}

int rf_html_strip_tags(const char *in, size_t n, rf_buf *out, size_t *tags) {
    size_t done = 0, removed = 0, at = 0;
    const char *lt;
    while (at < n && (lt = memchr(in + at, '<', n - at)) != NULL) {
        size_t pos = (size_t)(lt - in);
        bool space, eof;
        const char *raw;
        size_t len = tag_len(lt, n - pos, &space, &raw, &eof);
        if (eof) break; /* unterminated: it and all after it stay text (keeps this linear) */
        if (!len) {
            at = pos + 1;
            continue;
        }
        if (rf_buf_append(out, in + done, pos - done)) return RF_ERR_NOMEM;
        if (space && rf_buf_putc(out, ' ')) return RF_ERR_NOMEM;
        removed++;
        at = pos + len;
        if (raw) { /* skip the body up to the closing tag, or to the end */
            const char *end = find_ci(in + at, n - at, raw);
            size_t close = end ? (size_t)(end - in) : n;
            const char *gt = end ? memchr(end, '>', n - close) : NULL;
            at = gt ? (size_t)(gt - in) + 1 : n;
            if (gt) removed++;
            if (rf_buf_putc(out, ' ')) return RF_ERR_NOMEM;
        }
        done = at;
    }
    if (tags) *tags += removed;
    return rf_buf_append(out, in + done, n - done) ? RF_ERR_NOMEM : 0;
}
