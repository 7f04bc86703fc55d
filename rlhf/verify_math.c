/* verify_math.c — the math and format graders (verify.h), and verify_quote.
 *
 * Math, in order (each step linear in its input; the answer is at most VERIFY_ANSWER_MAX bytes):
 *  1. Extract: the last `\boxed` or `\fbox` in the response's last VERIFY_SCAN_MAX bytes, followed
 *     by `{...}` (braces balanced, every `{` and `}` counted, as verl's last_boxed_only_string does)
 *     or by spaces and one token (`\boxed 5`, up to a space or `$`); when there is none, the last
 *     `####` (GSM8K): the number after it (GSM8K's -?[0-9.,]+, after an optional `$`), else the rest
 *     of its line. A last \boxed that is malformed (unbalanced, empty) is a 0: no earlier one is
 *     taken instead.
 *  2. Normalise the extracted answer and the reference alike: whitespace, `\left` `\right` `\!`
 *     `\,` `\;` `\:` `\displaystyle`, `$`, `\$`, `%`, `\%`, `^\circ`, `°`, `{,}` and math delimiters
 *     dropped; `\dfrac` `\tfrac` -> `\frac`; `\mbox` `\textbf` `\mathrm` `\mathbf` -> `\text`; the
 *     part after the last `=` kept (verl math_dapo's split("=")[-1]); a trailing `\text{unit}`
 *     after a value dropped, then `\text{X}` -> X; trailing unit words of math_dapo's list
 *     ("5 square feet") dropped; a trailing `.` and one pair of outer braces
 *     dropped; `\sqrtX` -> `\sqrt{X}`; U+2212 is a minus; NBSP and thin spaces are spaces.
 *  3. Compare: equal strings; else, when the reference is one capital letter (`B`, `(B)`), the
 *     answer must be that letter; else as exact rationals when both parse as one (sign, digits with
 *     optional `,ddd` groups, decimals, `a/b`, `\frac{a}{b}` and `\frac12`; at most 18 digits per
 *     number: longer ones compare as strings); else, when either is a tuple or interval (`(a, b]`,
 *     or top-level commas), element by element in order with the same brackets.
 * Format: see verify_format. Not here: code (rlhf/sandbox.c), the pool (rlhf/verify.c). */
#include "rlhf/verify.h"
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __int128 i128;
typedef struct { i128 num, den; } Rational;

/* ---- reasons ---------------------------------------------------------------------------------- */

void verify_quote(char *dst, size_t cap, const char *s, size_t len) {
    if (!cap) return;
    size_t o = 0, i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = k > 0 && i + k <= len;
        for (size_t j = 1; ok && j < k; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (!ok) k = 1;
        if (o + k + 4 > cap) {                      /* no room for it, "..." and the NUL */
            size_t dots = cap - 1 - o < 3 ? cap - 1 - o : 3;
            memcpy(dst + o, "...", dots);
            o += dots;
            break;
        }
        if (!ok) dst[o++] = '?';
        else if (c < 0x20 || c == 0x7f) dst[o++] = ' ';
        else { memcpy(dst + o, s + i, k); o += k; }
        i += k;
    }
    dst[o] = 0;
}

/* ---- extraction --------------------------------------------------------------------------------- */

/* The start of the last pat in s[0..n), NULL if none. Linear: each memmem scans up to the next hit. */
static const char *last_of(const char *s, size_t n, const char *pat) {
    const char *last = NULL;
    size_t m = strlen(pat);
    for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), pat, m)); p++) last = p;
    return last;
}

enum { EXTRACT_NONE, EXTRACT_OK, EXTRACT_BAD };

/* The answer of a response: *a, *alen point into s. EXTRACT_BAD with why in reason. */
static int extract_answer(const char *s, size_t n, const char **a, size_t *alen, char *reason, size_t rlen) {
    const char *bx = last_of(s, n, "\\boxed"), *fb = last_of(s, n, "\\fbox");
    const char *cmd = bx && (!fb || bx > fb) ? bx : fb;
    const char *end = s + n;
    if (cmd) {
        const char *p = cmd + (cmd == bx ? 6 : 5);
        if (p < end && *p == '{') {
            int depth = 0;
            for (const char *q = p; q < end; q++) {
                if (*q == '{') depth++;
                else if (*q == '}' && --depth == 0) {
                    *a = p + 1, *alen = (size_t)(q - p - 1);
                    if (*alen) return EXTRACT_OK;
                    snprintf(reason, rlen, "the last \\boxed{} is empty");
                    return EXTRACT_BAD;
                }
            }
            snprintf(reason, rlen, "the last \\boxed{ has unbalanced braces");
            return EXTRACT_BAD;
        }
        if (p < end && *p == ' ') {
            while (p < end && *p == ' ') p++;
            const char *q = p;
            while (q < end && *q != '$' && *q != ' ' && *q != '\n' && *q != '\t' && *q != '\r') q++;
            if (q > p) { *a = p, *alen = (size_t)(q - p); return EXTRACT_OK; }
        }
        snprintf(reason, rlen, "the last \\boxed is not followed by {...} or a token");
        return EXTRACT_BAD;
    }
    const char *h = last_of(s, n, "####");
    if (!h) return EXTRACT_NONE;
    const char *p = h + 4, *q;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    /* GSM8K's number (-?[0-9.,]+, after an optional $) when there is one, else the rest of the line */
    const char *num = p + (p < end && *p == '$' ? 1 : p + 1 < end && p[0] == '\\' && p[1] == '$' ? 2 : 0);
    int digits = 0;
    for (q = num; q < end && (strchr("0123456789.,", *q) || (q == num && *q == '-')) && *q; q++) digits += *q >= '0' && *q <= '9';
    if (digits) p = num;
    else
        for (q = p; q < end && *q != '\n'; q++) {}
    while (q > p && (q[-1] == ' ' || q[-1] == '\t' || q[-1] == '\r')) q--;
    if (q == p) {
        snprintf(reason, rlen, "the last #### line has no answer");
        return EXTRACT_BAD;
    }
    *a = p, *alen = (size_t)(q - p);
    return EXTRACT_OK;
}

/* ---- normalisation (in place on a NUL-terminated buffer) ------------------------------------------ */

/* Replaces every `from` by `to` (strlen(to) <= strlen(from)), one left-to-right pass. */
static void replace_all(char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to);
    char *w = s;
    for (const char *r = s; *r;) {
        if (!strncmp(r, from, fl)) { memcpy(w, to, tl); w += tl; r += fl; }
        else *w++ = *r++;
    }
    *w = 0;
}

/* The index of the brace closing the one at s[i], or -1. */
static long match_brace(const char *s, size_t i) {
    int depth = 0;
    for (size_t j = i; s[j]; j++) {
        if (s[j] == '{') depth++;
        else if (s[j] == '}' && --depth == 0) return (long)j;
    }
    return -1;
}

/* \text{X} -> X everywhere; a trailing \text{...} after something else (a unit) dropped first. */
static void strip_text(char *s) {
    char *t = (char *)last_of(s, strlen(s), "\\text{");
    if (t && t > s) {
        long close = match_brace(t, 5);
        if (close >= 0 && t[close + 1] == 0) *t = 0;
    }
    for (char *p; (p = strstr(s, "\\text{"));) {
        long close = match_brace(p, 5);
        if (close < 0) { memmove(p, p + 6, strlen(p + 6) + 1); continue; }
        memmove(p + close, p + close + 1, strlen(p + close + 1) + 1);   /* the closing brace */
        memmove(p, p + 6, strlen(p + 6) + 1);                           /* "\text{" */
    }
}

/* \sqrtX -> \sqrt{X} for one character X (verl math_dapo's shorthand rule). s has room for
 * NORM_CAP bytes: each \sqrt (5 bytes) grows by 2, so an answer of VERIFY_ANSWER_MAX bytes fits. */
#define NORM_CAP (2 * VERIFY_ANSWER_MAX)
static void sqrt_braces(char *s) {
    for (char *p = s; (p = strstr(p, "\\sqrt"));) {
        p += 5;
        if (!*p || *p == '{' || *p == '\\' || (unsigned char)*p >= 0x80 || strlen(s) + 3 > NORM_CAP) continue;
        memmove(p + 3, p + 1, strlen(p + 1) + 1);
        p[1] = p[0], p[0] = '{', p[2] = '}';
    }
}

/* Trailing unit words after a value ("5 square feet", "12 inches."): verl math_dapo's list of
 * REMOVED_EXPRESSIONS words, taken off the end only and only as whole words (math_dapo deletes
 * them anywhere, "sue" out of "issue" too); before the whitespace goes. */
static void strip_unit_words(char *s) {
    static const char *const units[] = {
        "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "points", "feet",
        "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
        "multiples",
    };
    for (int changed = 1; changed;) {
        changed = 0;
        size_t n = strlen(s);
        while (n && strchr(" \t\n\r.", s[n - 1])) s[--n] = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0] && !changed; i++) {
            size_t k = strlen(units[i]);
            if (n > k && !strcmp(s + n - k, units[i]) && strchr(" \t\n\r}~0123456789", s[n - k - 1])) {
                s[n - k] = 0;
                changed = 1;
            }
        }
    }
}

/* Normalises s (room for NORM_CAP bytes) in place; see the file comment, step 2. */
static void normalize(char *s) {
    static const char *const drop[] = {
        "\xe2\x80\x89", "\xe2\x80\xaf", "\xc2\xa0", "\xc2\xb0", "\\left", "\\right", "\\displaystyle",
        "\\!", "\\,", "\\;", "\\:", "\\ ", "^\\circ", "^{\\circ}", "\\%", "%", "\\$", "$", "\\(", "\\)",
        "\\[", "\\]", "{,}",
    };
    static const char *const swap[][2] = {
        {"\xe2\x88\x92", "-"}, {"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"}, {"\\mbox", "\\text"},
        {"\\textbf", "\\text"}, {"\\mathrm", "\\text"}, {"\\mathbf", "\\text"},
    };
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) replace_all(s, drop[i], "");
    strip_unit_words(s);
    char *w = s;                                     /* whitespace out */
    for (const char *r = s; *r; r++)
        if (*r != ' ' && *r != '\t' && *r != '\n' && *r != '\r') *w++ = *r;
    *w = 0;
    for (size_t i = 0; i < sizeof swap / sizeof swap[0]; i++) replace_all(s, swap[i][0], swap[i][1]);
    char *eq = strrchr(s, '=');
    if (eq) memmove(s, eq + 1, strlen(eq + 1) + 1);
    strip_text(s);
    sqrt_braces(s);
    size_t n = strlen(s);
    while (n && s[n - 1] == '.') s[--n] = 0;
    if (n >= 2 && s[0] == '{' && match_brace(s, 0) == (long)n - 1) {
        memmove(s, s + 1, n - 2);
        s[n - 2] = 0;
    }
}

/* ---- numbers ------------------------------------------------------------------------------------ */

static i128 gcd128(i128 a, i128 b) {
    if (a < 0) a = -a;
    while (b) { i128 t = a % b; a = b; b = t; }
    return a;
}

/* An unsigned decimal at s: digits (first group 1-3 digits then ",ddd" groups, or plain digits),
 * optionally "." and digits. At most 18 digits. Returns the bytes read (0: none) and the value. */
static size_t parse_decimal(const char *s, Rational *v) {
    size_t i = 0, digits = 0, group = 0;
    i128 num = 0, den = 1;
    int commas = 0;
    for (;; i++) {
        if (s[i] >= '0' && s[i] <= '9') { num = num * 10 + (s[i] - '0'); digits++; group++; }
        else if (s[i] == ',' && group >= 1 && (commas ? group == 3 : group <= 3) && s[i + 1] >= '0' &&
                 s[i + 1] <= '9' && s[i + 2] >= '0' && s[i + 2] <= '9' && s[i + 3] >= '0' && s[i + 3] <= '9' &&
                 !(s[i + 4] >= '0' && s[i + 4] <= '9')) { commas = 1; group = 0; }
        else break;
        if (digits > 18) return 0;
    }
    if (commas && group != 3) return 0;
    if (s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
        for (i++; s[i] >= '0' && s[i] <= '9'; i++) {
            num = num * 10 + (s[i] - '0'), den *= 10;
            if (++digits > 18) return 0;
        }
    }
    if (!digits) return 0;
    v->num = num, v->den = den;
    return i;
}

/* A signed decimal, or a {braced} one (the argument of \frac), or one digit (\frac12). */
static size_t parse_frac_arg(const char *s, Rational *v) {
    if (*s >= '0' && *s <= '9') { v->num = *s - '0', v->den = 1; return 1; }
    if (*s != '{') return 0;
    size_t i = 1;
    int neg = s[i] == '-';
    if (neg || s[i] == '+') i++;
    size_t k = parse_decimal(s + i, v);
    if (!k || s[i + k] != '}') return 0;
    if (neg) v->num = -v->num;
    return i + k + 1;
}

/* The whole of s as an exact rational: [sign] (\frac A B | decimal [/ decimal]). 0 if it is not one. */
static int parse_rational(const char *s, Rational *out) {
    int neg = 0;
    if (*s == '-' || *s == '+') neg = *s++ == '-';
    Rational a, b = {1, 1};
    size_t k;
    if (!strncmp(s, "\\frac", 5)) {
        s += 5;
        if (!(k = parse_frac_arg(s, &a))) return 0;
        s += k;
        if (!(k = parse_frac_arg(s, &b))) return 0;
        s += k;
    } else {
        if (!(k = parse_decimal(s, &a))) return 0;
        s += k;
        if (*s == '/') {
            int bneg = *++s == '-';
            if (bneg) s++;
            if (!(k = parse_decimal(s, &b))) return 0;
            s += k;
            if (bneg) b.num = -b.num;
        }
    }
    if (*s || b.num == 0) return 0;
    i128 num = a.num * b.den, den = a.den * b.num;   /* each part < 1e18: products < 1e36 */
    if (den < 0) num = -num, den = -den;
    if (neg) num = -num;
    i128 g = gcd128(num, den);
    out->num = num / g, out->den = den / g;
    return 1;
}

/* ---- comparison --------------------------------------------------------------------------------- */

/* The capital letter of a multiple-choice answer ("B", "(B)", "B)"), else 0. */
static char choice_letter(const char *s) {
    size_t n = strlen(s);
    if (n == 1 && s[0] >= 'A' && s[0] <= 'Z') return s[0];
    if (n == 2 && s[1] == ')' && s[0] >= 'A' && s[0] <= 'Z') return s[0];
    if (n == 3 && s[0] == '(' && s[2] == ')' && s[1] >= 'A' && s[1] <= 'Z') return s[1];
    return 0;
}

static int scalar_equal(const char *a, const char *b) {
    if (!strcmp(a, b)) return 1;
    Rational x, y;
    return parse_rational(a, &x) && parse_rational(b, &y) && x.num == y.num && x.den == y.den;
}

#define MAX_ELEMS 64
/* Splits s (modified) into its top-level comma-separated elements; open/close: the outer brackets
 * when s is "(...)" / "[...]" / "(...]" / "[...)" (else 0). Returns the count, 0 if not a list. */
static int split_tuple(char *s, char *open, char *close, char **elem) {
    size_t n = strlen(s);
    *open = *close = 0;
    if (n >= 2 && (s[0] == '(' || s[0] == '[') && (s[n - 1] == ')' || s[n - 1] == ']')) {
        int depth = 0, outer = 1;
        for (size_t i = 0; i < n - 1 && outer; i++) {
            if (s[i] == '(' || s[i] == '[' || s[i] == '{') depth++;
            else if ((s[i] == ')' || s[i] == ']' || s[i] == '}') && --depth == 0) outer = 0;
        }
        if (outer) { *open = s[0], *close = s[n - 1]; s[n - 1] = 0; s++; }
    }
    int count = 0, depth = 0;
    elem[count++] = s;
    for (char *p = s; *p; p++) {
        if (*p == '(' || *p == '[' || *p == '{') depth++;
        else if (*p == ')' || *p == ']' || *p == '}') depth--;
        else if (*p == ',' && depth == 0) {
            if (count == MAX_ELEMS) return 0;
            *p = 0;
            elem[count++] = p + 1;
        }
    }
    return count > 1 || *open ? count : 0;
}

static int tuple_equal(const char *a0, const char *b0) {
    char a[NORM_CAP + 1], b[NORM_CAP + 1];   /* split in copies: the callers quote the originals */
    snprintf(a, sizeof a, "%s", a0);
    snprintf(b, sizeof b, "%s", b0);
    char *ea[MAX_ELEMS], *eb[MAX_ELEMS], oa, ca, ob, cb;
    int na = split_tuple(a, &oa, &ca, ea), nb = split_tuple(b, &ob, &cb, eb);
    if (!na || na != nb || oa != ob || ca != cb) return 0;
    for (int i = 0; i < na; i++)
        if (!scalar_equal(ea[i], eb[i])) return 0;
    return 1;
}

/* ---- the graders -------------------------------------------------------------------------------- */

/* The reference as text: a string, or a number printed exactly (integers without a point). */
static int answer_text(const cJSON *answer, char *buf, size_t cap) {
    if (cJSON_IsString(answer)) {
        if (strlen(answer->valuestring) >= cap) return 0;
        strcpy(buf, answer->valuestring);
        return 1;
    }
    if (!cJSON_IsNumber(answer)) return 0;
    double v = answer->valuedouble;
    if (v > -9e18 && v < 9e18 && v == (double)(long long)v) { snprintf(buf, cap, "%lld", (long long)v); return 1; }
    for (int prec = 15; prec <= 17; prec++) {   /* the shortest text that reads back as v: 0.1, not 0.10000000000000001 */
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return 1;
}

double verify_math(const char *response, const cJSON *answer, char *reason, size_t rlen) {
    char got[NORM_CAP + 1], want[NORM_CAP + 1], qg[64], qw[64];
    size_t n = strlen(response), alen = 0;
    if (n > VERIFY_SCAN_MAX) response += n - VERIFY_SCAN_MAX, n = VERIFY_SCAN_MAX;
    if (!answer_text(answer, want, VERIFY_ANSWER_MAX + 1)) {
        snprintf(reason, rlen, "the reference answer is not a string or number of at most %d bytes", VERIFY_ANSWER_MAX);
        return 0;
    }
    const char *a = NULL;
    int how = extract_answer(response, n, &a, &alen, reason, rlen);
    if (how == EXTRACT_NONE) snprintf(reason, rlen, "no \\boxed{} answer and no #### line");
    if (how != EXTRACT_OK) return 0;
    if (alen > VERIFY_ANSWER_MAX) {
        snprintf(reason, rlen, "the answer is longer than %d bytes", VERIFY_ANSWER_MAX);
        return 0;
    }
    memcpy(got, a, alen);
    got[alen] = 0;
    normalize(got);
    normalize(want);
    char letter = choice_letter(want);
    int ok = letter ? choice_letter(got) == letter : scalar_equal(got, want) || tuple_equal(got, want);
    if (ok) {
        snprintf(reason, rlen, "correct");
        return 1;
    }
    verify_quote(qg, sizeof qg, got, strlen(got));
    verify_quote(qw, sizeof qw, want, strlen(want));
    snprintf(reason, rlen, "wrong answer: got \"%s\", expected \"%s\"", qg, qw);
    return 0;
}

/* Whether s ends with suffix (lengths known). */
static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

double verify_format(const char *response, char *reason, size_t rlen) {
    size_t n = strlen(response);
    if (n > VERIFY_SCAN_MAX) response += n - VERIFY_SCAN_MAX, n = VERIFY_SCAN_MAX;
    while (n && strchr(" \t\r\n", response[n - 1])) n--;
    /* a `#### N` last line: a GSM8K number (-?[0-9.,]+ with a digit) and nothing else */
    size_t ls = n;
    while (ls && response[ls - 1] != '\n') ls--;
    if (n - ls > 4 && !strncmp(response + ls, "####", 4)) {
        size_t i = ls + 4, digits = 0;
        while (i < n && response[i] == ' ') i++;
        if (i < n && response[i] == '-') i++;
        for (; i < n && strchr("0123456789.,", response[i]); i++) digits += response[i] >= '0' && response[i] <= '9';
        if (i == n && digits) { snprintf(reason, rlen, "ends with a #### line"); return 1; }
    }
    /* a \boxed{...} at the end, perhaps inside closing math delimiters and a full stop */
    if (n && response[n - 1] == '.') n--;
    for (int again = 1; again;) {
        again = 0;
        static const char *const close[] = {"$", "\\]", "\\)"};
        for (int k = 0; k < 3; k++)
            if (ends_with(response, n, close[k])) { n -= strlen(close[k]); again = 1; }
        while (n && strchr(" \t\r\n", response[n - 1])) n--;
    }
    const char *a;
    size_t alen;
    char why[120];
    int how = extract_answer(response, n, &a, &alen, why, sizeof why);
    if (how == EXTRACT_OK && a + alen + 1 == response + n && a[-1] == '{') {
        snprintf(reason, rlen, "ends with \\boxed{...}");
        return 1;
    }
    if (how == EXTRACT_BAD) snprintf(reason, rlen, "%s", why);
    else snprintf(reason, rlen, "does not end with a \\boxed{...} answer or a #### line");
    return 0;
}
