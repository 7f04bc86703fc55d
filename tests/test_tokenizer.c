/* test_tokenizer.c — checks behind tests/tokenizer.bats, one subcommand per check:
 *   vectors TOK INP OUT        llama.cpp test vectors (strings split by "\n__ggml_vocab_test__\n"),
 *                              exact ids without BOS
 *   corpus N                   print N deterministic test strings, one per line (emoji, CJK,
 *                              combining marks, control chars, whitespace runs, empty lines)
 *   compare TOK CORPUS IDS     our ids (no BOS) == IDS file line by line (spm_encode --output_format=id)
 *   roundtrip TOK CORPUS       decode(encode(s)) == s for every line
 *   stream TOK CORPUS          streaming decode: after every token the emitted text is valid UTF-8,
 *                              a prefix of the full decode, and (with a flush) equals decode(prefix)
 *   invalid TOK                invalid UTF-8 input encodes as U+FFFD and never crashes
 *   bench TOK FILE [REPEATS]   encode MB/s (tokenizer_bench_mbps)
 *   info TOK                   kind, vocab size, special ids, BOS default, detected chat format
 * Each prints what failed and exits 1, or prints one "ok" summary line. */
#include "tokenizer/tok_internal.h" /* utf8_sanitize */
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Tokenizer *open_or_die(const char *path) {
    char err[1024];
    Tokenizer *t = tokenizer_open(path, err, sizeof(err));
    if (!t) { fprintf(stderr, "open failed: %s\n", err); exit(1); }
    return t;
}

static char *slurp(const char *path, size_t *len) {
    char *s = read_file(path, len);
    if (!s) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    return s;
}

/* Split s into lines in place (a trailing '\n' ends the last line, it does not start another). */
static char **split_lines(char *s, size_t len, int *n_out) {
    int n = 0, cap = 1024;
    char **v = xmalloc((size_t)cap * sizeof(char *));
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '\n') continue;
        if (i == len && start == len) break;
        if (n == cap) { cap *= 2; v = xrealloc(v, (size_t)cap * sizeof(char *)); }
        s[i] = 0;
        v[n++] = s + start;
        start = i + 1;
    }
    *n_out = n;
    return v;
}

static void print_ids(const char *label, const TokIds *v) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < v->n; i++) fprintf(stderr, " %d", v->ids[i]);
    fprintf(stderr, "\n");
}

static int cmd_vectors(const char *tok, const char *inp, const char *outp) {
    Tokenizer *t = open_or_die(tok);
    size_t in_len, out_len;
    char *in = slurp(inp, &in_len), *out = slurp(outp, &out_len);
    const char *sep = "\n__ggml_vocab_test__\n";
    int n_out, fails = 0, n = 0;
    char **want = split_lines(out, out_len, &n_out);
    char *p = in;
    TokIds ids = {0}, ref = {0};
    while (p < in + in_len) {
        char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (n >= n_out) { fprintf(stderr, "%s: more strings than lines in %s\n", inp, outp); return 1; }
        ids.n = ref.n = 0;
        tokenizer_encode(t, p, len, 0, &ids, NULL);
        for (char *q = want[n], *end; ; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            tok_ids_push(&ref, (int32_t)v);
        }
        if (ids.n != ref.n || memcmp(ids.ids, ref.ids, ids.n * sizeof(int32_t))) {
            fprintf(stderr, "vector %d \"%.*s\" differs\n", n, (int)len, p);
            print_ids("want", &ref);
            print_ids("got ", &ids);
            fails++;
        }
        n++;
        if (!e) break;
        p = e + strlen(sep);
    }
    if (n != n_out) { fprintf(stderr, "%d strings but %d expected lines\n", n, n_out); fails++; }
    printf("%d/%d vectors match\n", n - fails, n);
    tok_ids_free(&ids);
    tok_ids_free(&ref);
    free(want); free(in); free(out);
    tokenizer_free(t);
    return fails ? 1 : 0;
}

/* ---------------------------------------------------------------- corpus */

static uint64_t rng_state = 1;
static uint32_t rnd(uint32_t n) { return (uint32_t)(splitmix64_next(&rng_state) >> 32) % n; } /* deterministic */

static void put_cp(char *b, size_t *n, uint32_t cp) {
    if (cp < 0x80) b[(*n)++] = (char)cp;
    else if (cp < 0x800) { b[(*n)++] = (char)(0xC0 | (cp >> 6)); b[(*n)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        b[(*n)++] = (char)(0xE0 | (cp >> 12)); b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        b[(*n)++] = (char)(0xF0 | (cp >> 18)); b[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static const char *WORDS[] = {"the", "Hello", "world", "tokenizer", "don't", "I'm", "we'll", "UPPER",
                              "café", "naïve", "Straße", "été", "123", "3.14159", "x86_64", "foo.bar",
                              "https://example.com/a?b=c", "C++", "e-mail", "it's", "'ll", "____"};

static int cmd_corpus(int n) {
    char b[4096];
    for (int line = 0; line < n; line++) {
        size_t len = 0;
        int parts = line % 97 == 0 ? 0 : 1 + (int)rnd(12); /* some empty lines */
        for (int k = 0; k < parts && len < 3000; k++) {
            switch (rnd(12)) {
            case 0: case 1: case 2: { const char *w = WORDS[rnd(sizeof(WORDS) / sizeof(WORDS[0]))]; memcpy(b + len, w, strlen(w)); len += strlen(w); break; }
            case 3: { int r = 1 + (int)rnd(rnd(4) == 0 ? 40 : 3); while (r--) b[len++] = ' '; break; } /* space runs */
            case 4: { int r = 1 + (int)rnd(4); while (r--) b[len++] = "\t \r\v\f"[rnd(5)]; break; }   /* other whitespace */
            case 5: put_cp(b, &len, 0x1F600 + rnd(80)); if (rnd(3) == 0) { put_cp(b, &len, 0x200D); put_cp(b, &len, 0x1F466 + rnd(4)); } break; /* emoji, ZWJ */
            case 6: { int r = 1 + (int)rnd(6); while (r--) put_cp(b, &len, 0x4E00 + rnd(0x5000)); break; } /* CJK */
            case 7: put_cp(b, &len, "aeiouAEIOU"[rnd(10)]); put_cp(b, &len, 0x0300 + rnd(0x70)); break; /* combining marks */
            case 8: { uint32_t cc = 1 + rnd(31); put_cp(b, &len, cc == '\n' ? 0x7F : cc); break; } /* control chars */
            case 9: { static const uint32_t cps[] = {0xA0, 0x3000, 0x2028, 0x0416, 0x05D0, 0x0627, 0x0E01, 0xAC00, 0x1D11E, 0xFEFF, 0x00BD, 0x2013};
                      put_cp(b, &len, cps[rnd(sizeof(cps) / sizeof(cps[0]))]); break; }
            case 10: { int r = 1 + (int)rnd(5); static const char punct[] = "!?.,;:()[]{}\"'#$%&*+-/=@\\^`|~_>";
                       while (r--) b[len++] = punct[rnd(sizeof(punct) - 1)];
                       break; }
            default: { int r = 1 + (int)rnd(8); while (r--) b[len++] = (char)('0' + rnd(10)); break; }
            }
        }
        fwrite(b, 1, len, stdout);
        fputc('\n', stdout);
    }
    return 0;
}

static int cmd_compare(const char *tok, const char *corpus, const char *ref_path) {
    Tokenizer *t = open_or_die(tok);
    size_t cl, rl;
    char *c = slurp(corpus, &cl), *r = slurp(ref_path, &rl);
    int nc, nr, fails = 0;
    char **cs = split_lines(c, cl, &nc), **rs = split_lines(r, rl, &nr);
    if (nc != nr) { fprintf(stderr, "%d corpus lines but %d reference lines\n", nc, nr); return 1; }
    TokIds ids = {0}, ref = {0};
    for (int i = 0; i < nc; i++) {
        ids.n = ref.n = 0;
        tokenizer_encode(t, cs[i], strlen(cs[i]), 0, &ids, NULL);
        for (char *q = rs[i], *end; ; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            tok_ids_push(&ref, (int32_t)v);
        }
        if (ids.n != ref.n || memcmp(ids.ids, ref.ids, ids.n * sizeof(int32_t))) {
            if (fails < 5) {
                fprintf(stderr, "line %d differs\n", i + 1);
                print_ids("want", &ref);
                print_ids("got ", &ids);
            }
            fails++;
        }
    }
    printf("%d/%d lines match\n", nc - fails, nc);
    return fails ? 1 : 0;
}

static int cmd_roundtrip(const char *tok, const char *corpus) {
    Tokenizer *t = open_or_die(tok);
    size_t cl;
    char *c = slurp(corpus, &cl);
    int nc, fails = 0;
    char **cs = split_lines(c, cl, &nc);
    TokIds ids = {0};
    for (int i = 0; i < nc; i++) {
        ids.n = 0;
        size_t len = strlen(cs[i]), dl;
        tokenizer_encode(t, cs[i], len, 0, &ids, NULL);
        char *d = tokenizer_decode(t, ids.ids, ids.n, 0, &dl);
        if (dl != len || memcmp(d, cs[i], len)) {
            if (fails < 5) fprintf(stderr, "line %d: decode(encode(s)) != s\n  s: \"%s\"\n  d: \"%s\"\n", i + 1, cs[i], d);
            fails++;
        }
        free(d);
    }
    printf("%d/%d lines round-trip\n", nc - fails, nc);
    return fails ? 1 : 0;
}

static int valid_utf8(const char *s, size_t n) {
    size_t clean_len;
    char *c = utf8_sanitize(s, n, &clean_len);
    free(c);
    return c == NULL;
}

static int cmd_stream(const char *tok, const char *corpus) {
    Tokenizer *t = open_or_die(tok);
    size_t cl;
    char *c = slurp(corpus, &cl);
    int nc, fails = 0;
    long checks = 0;
    char **cs = split_lines(c, cl, &nc);
    TokIds ids = {0};
    for (int i = 0; i < nc && fails < 5; i++) {
        ids.n = 0;
        tokenizer_encode(t, cs[i], strlen(cs[i]), TOK_ADD_BOS, &ids, NULL);
        size_t full_len;
        char *full = tokenizer_decode(t, ids.ids, ids.n, 0, &full_len);
        TokStream s;
        tok_stream_init(&s, t, 0);
        char *buf = NULL;
        size_t len = 0, cap = 0;
        for (size_t k = 0; k < ids.n; k++) {
            tok_stream_push(&s, ids.ids[k], &buf, &len, &cap);
            checks++;
            if (len > full_len || (len && memcmp(buf, full, len)) || !valid_utf8(buf, len)) {
                fprintf(stderr, "line %d token %zu: streamed text is not a valid prefix of the decode\n", i + 1, k);
                fails++;
                break;
            }
            /* emitted + flush == decode(ids[0..k]) */
            TokStream s2 = s;
            char *b2 = xmalloc(len + 1);
            size_t l2 = len, c2 = len + 1, pl;
            if (len) memcpy(b2, buf, len);
            tok_stream_flush(&s2, &b2, &l2, &c2);
            char *pre = tokenizer_decode(t, ids.ids, k + 1, 0, &pl);
            if (pl != l2 || memcmp(pre, b2, pl)) {
                fprintf(stderr, "line %d token %zu: stream+flush != decode(prefix)\n", i + 1, k);
                fails++;
            }
            free(pre);
            free(b2);
        }
        tok_stream_flush(&s, &buf, &len, &cap);
        if (len != full_len || memcmp(buf ? buf : "", full, len)) {
            fprintf(stderr, "line %d: full stream != decode\n", i + 1);
            fails++;
        }
        free(buf);
        free(full);
    }
    printf("%ld streaming prefixes checked, %d failures\n", checks, fails);
    return fails ? 1 : 0;
}

static int cmd_invalid(const char *tok) {
    Tokenizer *t = open_or_die(tok);
    /* lone continuation, truncated 3-byte, overlong, surrogate, 0xFF, truncated at end */
    const char *bad[] = {"a\x80" "b", "x\xE4\xB8" "y", "\xC0\xAF", "\xED\xA0\x80", "\xFF\xFE", "end\xF0\x9F\x98"};
    const char *fixed[] = {"a\xEF\xBF\xBD" "b", "x\xEF\xBF\xBD" "y", "\xEF\xBF\xBD\xEF\xBF\xBD",
                           "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD", "end\xEF\xBF\xBD"};
    int fails = 0;
    TokIds a = {0}, b = {0};
    for (int i = 0; i < 6; i++) {
        a.n = b.n = 0;
        tokenizer_encode(t, bad[i], strlen(bad[i]), 0, &a, NULL);
        tokenizer_encode(t, fixed[i], strlen(fixed[i]), 0, &b, NULL);
        if (a.n != b.n || memcmp(a.ids, b.ids, a.n * sizeof(int32_t))) {
            fprintf(stderr, "invalid input %d does not encode like its U+FFFD form\n", i);
            fails++;
        }
    }
    /* decoding ids whose bytes are not UTF-8 gives U+FFFD, never broken text */
    int byte_ids[3] = {-1, -1, -1};
    const char *pieces_spm[] = {"<0xE4>", "<0xB8>", "<0xFF>"};
    const char *pieces_bpe[] = {"\xC3\xA4", "\xC2\xB8", "\xC3\xBF"}; /* GPT-2 stand-ins of E4 B8 FF */
    for (int i = 0; i < 3; i++) {
        byte_ids[i] = tokenizer_piece_to_id(t, pieces_spm[i]);
        if (byte_ids[i] < 0) byte_ids[i] = tokenizer_piece_to_id(t, pieces_bpe[i]);
    }
    if (byte_ids[0] >= 0 && byte_ids[1] >= 0 && byte_ids[2] >= 0) {
        int32_t ids[3] = {byte_ids[0], byte_ids[1], byte_ids[2]};
        size_t n;
        char *d = tokenizer_decode(t, ids, 3, 0, &n);
        if (strcmp(d, "\xEF\xBF\xBD\xEF\xBF\xBD")) { fprintf(stderr, "decode of E4 B8 FF is \"%s\"\n", d); fails++; }
        free(d);
    } else {
        fprintf(stderr, "byte tokens not found\n");
        fails++;
    }
    printf("invalid UTF-8: %d failures\n", fails);
    return fails ? 1 : 0;
}

static int cmd_bench(const char *tok, const char *file, int repeats) {
    Tokenizer *t = open_or_die(tok);
    size_t len;
    char *s = slurp(file, &len);
    printf("%.2f MB/s\n", tokenizer_bench_mbps(t, s, len, repeats));
    return 0;
}

static int cmd_info(const char *tok) {
    Tokenizer *t = open_or_die(tok);
    int f = chat_format_detect(tokenizer_chat_template(t));
    printf("kind=%s vocab=%d bos=%d eos=%d pad=%d add_bos=%d chat=%s\n",
           tokenizer_kind(t) == TOK_KIND_SPM ? "spm" : "bpe", tokenizer_vocab_size(t), tokenizer_bos_id(t),
           tokenizer_eos_id(t), tokenizer_pad_id(t), tokenizer_add_bos_default(t),
           f >= 0 ? chat_format_name((ChatFormat)f) : "none");
    tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "vectors")) return cmd_vectors(argv[2], argv[3], argv[4]);
    if (argc >= 3 && !strcmp(argv[1], "corpus")) return cmd_corpus(atoi(argv[2]));
    if (argc >= 5 && !strcmp(argv[1], "compare")) return cmd_compare(argv[2], argv[3], argv[4]);
    if (argc >= 4 && !strcmp(argv[1], "roundtrip")) return cmd_roundtrip(argv[2], argv[3]);
    if (argc >= 4 && !strcmp(argv[1], "stream")) return cmd_stream(argv[2], argv[3]);
    if (argc >= 3 && !strcmp(argv[1], "invalid")) return cmd_invalid(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "bench")) return cmd_bench(argv[2], argv[3], argc >= 5 ? atoi(argv[4]) : 3);
    if (argc >= 3 && !strcmp(argv[1], "info")) return cmd_info(argv[2]);
    fprintf(stderr, "usage: test_tokenizer vectors|corpus|compare|roundtrip|stream|invalid|bench|info ...\n");
    return 2;
}
