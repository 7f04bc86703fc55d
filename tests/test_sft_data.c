/* test_sft_data.c — driver for tests/sft_data.bats: train/data.c without a model.
 *   dump    TOK FILE [opt=val ...]       every sample in load order as {"line","input_ids","mask"},
 *                                        then "stats ..." (bats compares with `tandem tokenize`)
 *   batches TOK FILE [opt=val ...]       walks every batch and checks the invariants (below);
 *                                        prints one line per batch and "N failures"
 *   full    TOK FILE [opt=val ...]       every batch with its tokens, seq_start and targets
 *   order   TOK FILE [opt=val ...]       the order of epochs 0 and 1
 *   eval    TOK FILE [opt=val ...]       shuffle=0 epochs=1 (an eval split): batches in file order,
 *                                        and a second pass after data_rewind is identical
 *   resume  TOK FILE K [opt=val ...]     K batches, save the cursor, reopen, restore: the rest must
 *                                        equal an uninterrupted run; a cursor restored into data
 *                                        with another seed must be refused
 * TOK: a tokenizer path (tokenizer_open). Options: seq_len batch_size pack shuffle seed epochs
 * overlong=truncate|drop train_on_prompt skip_bad pairs_as_chat chat=NAME and every *_key.
 * Invariants checked by `batches`, independently of data.c's own loop:
 *   seq_start starts at 0, strictly increases, ends at N; N <= batch_size * seq_len; rows <= batch_size;
 *   each sequence is exactly its sample's ids (from data_sample), its length <= seq_len;
 *   target[t] = mask[t+1] ? ids[t+1] : -1 inside the sample, -1 on its last token (never crosses);
 *   n_loss = targets >= 0; every sample appears exactly once per epoch; with pack = 0 one sample per row. */
#include "train/data.h"
#include "runtime/util.h"
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_KEY(f) {#f, offsetof(DataConfig, f)}
static const struct { const char *opt; size_t at; } NAME_KEYS[] = {
    NAME_KEY(prompt_key), NAME_KEY(response_key), NAME_KEY(instruction_key), NAME_KEY(input_key),
    NAME_KEY(output_key), NAME_KEY(messages_key), NAME_KEY(role_key), NAME_KEY(content_key),
    NAME_KEY(conversations_key), NAME_KEY(from_key), NAME_KEY(value_key), NAME_KEY(system_key),
};
enum { N_NAME_KEYS = sizeof(NAME_KEYS) / sizeof(NAME_KEYS[0]) };

static void parse_opts(DataConfig *c, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq - argv[i] >= 64) { fprintf(stderr, "option \"%s\" is not key=value\n", argv[i]); exit(2); }
        char k[64];
        memcpy(k, argv[i], (size_t)(eq - argv[i]));
        k[eq - argv[i]] = 0;
        const char *v = eq + 1;
        if (!strcmp(k, "seq_len")) c->seq_len = atoi(v);
        else if (!strcmp(k, "batch_size")) c->batch_size = atoi(v);
        else if (!strcmp(k, "pack")) c->pack = atoi(v);
        else if (!strcmp(k, "shuffle")) c->shuffle = atoi(v);
        else if (!strcmp(k, "seed")) c->seed = strtoull(v, NULL, 10);
        else if (!strcmp(k, "epochs")) c->n_epochs = atoi(v);
        else if (!strcmp(k, "overlong")) c->overlong = !strcmp(v, "drop") ? OVERLONG_DROP : OVERLONG_TRUNCATE;
        else if (!strcmp(k, "train_on_prompt")) c->train_on_prompt = atoi(v);
        else if (!strcmp(k, "skip_bad")) c->skip_bad_records = atoi(v);
        else if (!strcmp(k, "pairs_as_chat")) c->pairs_as_chat = atoi(v);
        else if (!strcmp(k, "preference")) c->preference = atoi(v);
        else if (!strcmp(k, "chat")) c->chat_template = v;
        else {   /* the field-name options: X_key=NAME sets DataConfig.X_key */
            int i = 0;
            while (i < N_NAME_KEYS && strcmp(k, NAME_KEYS[i].opt)) i++;
            if (i == N_NAME_KEYS) { fprintf(stderr, "unknown option \"%s\"\n", k); exit(2); }
            *(const char **)((char *)c + NAME_KEYS[i].at) = v;
        }
    }
}

static Tokenizer *open_tok(const char *path) {
    char err[1024];
    Tokenizer *t = tokenizer_open(path, err, sizeof(err));
    if (!t) user_error("%s", err);
    return t;
}

static void open_data(Data *d, const char *tok, const char *file, int argc, char **argv, DataConfig *c) {
    data_config_default(c);
    c->seq_len = 256;
    c->batch_size = 2;
    parse_opts(c, argc, argv);
    Tokenizer *t = open_tok(tok);
    data_open(d, file, t, c);
    tokenizer_free(t);
}

static void print_ints(const char *name, const int *v, int n) {
    printf("%s", name);
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", v[i]);
    printf("\n");
}

static void print_stats(const Data *d) {
    const DataStats *s = &d->stats;
    printf("stats records=%d samples=%d bad=%d truncated=%d dropped_long=%d dropped_no_loss=%d "
           "tokens=%lld loss=%lld", s->n_records, s->n_samples, s->n_bad, s->n_truncated,
           s->n_dropped_long, s->n_dropped_no_loss, (long long)s->n_tokens, (long long)s->n_loss_tokens);
    if (d->group == 2) printf(" pairs=%d", s->n_pairs);
    printf("\n");
}

static int cmd_dump(Data *d) {
    for (int i = 0; i < d->n_samples; i++) {
        const int32_t *ids;
        const uint8_t *mask;
        int n = data_sample(d, i, &ids, &mask);
        printf("{\"line\":%d,", d->sample_line[i]);
        if (d->group == 2) printf("\"side\":\"%s\",\"margin\":%g,", i % 2 ? "rejected" : "chosen", d->margin[i / 2]);
        printf("\"input_ids\":[");
        for (int t = 0; t < n; t++) printf("%s%d", t ? "," : "", ids[t]);
        printf("],\"mask\":[");
        for (int t = 0; t < n; t++) printf("%s%d", t ? "," : "", mask[t]);
        printf("]}\n");
    }
    print_stats(d);
    data_print_summary(d, stderr);
    return 0;
}

/* One batch against the invariants in the header; returns the number of failures (each printed). */
static int check_batch(const Data *d, const DataBatch *b, int *seen) {
    int fails = 0, n_loss = 0;
#define FAIL(...) do { printf("FAIL: " __VA_ARGS__); printf("\n"); fails++; } while (0)
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens) FAIL("seq_start ends");
    if (b->n_tokens > data_max_batch_tokens(d)) FAIL("batch of %d tokens > max %d", b->n_tokens, data_max_batch_tokens(d));
    if (b->n_rows > d->cfg.batch_size) FAIL("%d rows > batch_size", b->n_rows);
    if (!d->cfg.pack && b->n_rows * d->group != b->n_seqs)
        FAIL("pack=0 but %d rows for %d samples (%d per unit)", b->n_rows, b->n_seqs, d->group);
    for (int j = 0; d->group == 2 && j + 1 < b->n_seqs; j += 2)   /* a pair: chosen 2i, rejected 2i + 1 */
        if (b->sample_index[j] % 2 || b->sample_index[j + 1] != b->sample_index[j] + 1)
            FAIL("sequences %d, %d are samples %d, %d: not one pair", j, j + 1, b->sample_index[j], b->sample_index[j + 1]);
    for (int j = 0; j < b->n_seqs; j++) {
        int s0 = b->seq_start[j], s1 = b->seq_start[j + 1], len = s1 - s0;
        if (len <= 0 || len > d->cfg.seq_len) { FAIL("sequence %d has length %d", j, len); continue; }
        const int32_t *ids;
        const uint8_t *mask;
        int si = b->sample_index[j];
        if (si < 0 || si >= d->n_samples) { FAIL("sample index %d", si); continue; }
        if (seen[si]++) FAIL("sample %d twice in one epoch", si);
        int n = data_sample(d, si, &ids, &mask);
        if (n != len) { FAIL("sequence %d: length %d, sample %d has %d", j, len, si, n); continue; }
        for (int t = s0; t < s1; t++) {
            int pos = t - s0;  /* the position restarts at each sample */
            if (b->tokens[t] != ids[pos]) FAIL("seq %d pos %d: token %d != sample id %d", j, pos, b->tokens[t], ids[pos]);
            int want = pos + 1 < len ? (mask[pos + 1] ? ids[pos + 1] : -1) : -1;
            if (b->targets[t] != want) FAIL("seq %d pos %d: target %d, want %d", j, pos, b->targets[t], want);
            n_loss += b->targets[t] >= 0;
        }
    }
    if (n_loss != b->n_loss) FAIL("n_loss %d, counted %d", b->n_loss, n_loss);
#undef FAIL
    return fails;
}

static int cmd_batches(Data *d, int full) {
    int *seen = xcalloc((size_t)d->n_samples, sizeof(int));
    DataBatch b;
    int k = 0, fails = 0;
    uint64_t epoch = 0;
    int64_t loss_total = 0;
    while (data_next_batch(d, &b)) {
        if (b.epoch != epoch) {
            for (int i = 0; i < d->n_samples; i++)
                if (seen[i] != 1) { printf("FAIL: epoch %llu saw sample %d %d times\n", (unsigned long long)epoch, i, seen[i]); fails++; }
            memset(seen, 0, (size_t)d->n_samples * sizeof(int));
            epoch = b.epoch;
        }
        fails += check_batch(d, &b, seen);
        loss_total += b.n_loss;
        printf("batch %d epoch %llu rows %d seqs %d tokens %d loss %d samples ", k, (unsigned long long)b.epoch,
               b.n_rows, b.n_seqs, b.n_tokens, b.n_loss);
        print_ints("", b.sample_index, b.n_seqs);
        if (full) {
            print_ints("  seq_start ", b.seq_start, b.n_seqs + 1);
            print_ints("  tokens ", b.tokens, b.n_tokens);
            print_ints("  targets ", b.targets, b.n_tokens);
        }
        k++;
        if (k > 1000000) { printf("FAIL: endless\n"); fails++; break; }
    }
    for (int i = 0; i < d->n_samples; i++)
        if (seen[i] != 1) { printf("FAIL: epoch %llu saw sample %d %d times\n", (unsigned long long)epoch, i, seen[i]); fails++; }
    printf("%d batches, %llu epochs, %lld loss tokens, %d failures\n", k, (unsigned long long)epoch + 1,
           (long long)loss_total, fails);
    free(seen);
    return fails ? 1 : 0;
}

static int cmd_order(Data *d) {
    int *o = xmalloc((size_t)d->n_samples * sizeof(int));
    for (int e = 0; e < 2; e++) {
        data_epoch_order(d, (uint64_t)e, o);
        printf("epoch %d: ", e);
        print_ints("", o, d->n_samples);
    }
    free(o);
    return 0;
}

/* FNV-1a over a batch: tokens, seq_start, targets, sample_index, epoch. */
static uint64_t batch_hash(const DataBatch *b) {
    uint64_t h = 1469598103934665603ULL;
#define MIX(p, n) for (size_t q = 0; q < (n); q++) { h ^= ((const unsigned char *)(p))[q]; h *= 1099511628211ULL; }
    MIX(b->tokens, (size_t)b->n_tokens * sizeof(int));
    MIX(b->seq_start, ((size_t)b->n_seqs + 1) * sizeof(int));
    MIX(b->targets, (size_t)b->n_tokens * sizeof(int));
    MIX(b->sample_index, (size_t)b->n_seqs * sizeof(int));
    MIX(&b->epoch, sizeof(b->epoch));
#undef MIX
    return h;
}

static int cmd_eval(Data *d) {
    int fails = 0, next = 0, n_batches = 0, cap = 1024;
    uint64_t *h = xmalloc((size_t)cap * sizeof(uint64_t));
    DataBatch b;
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;
        while (data_next_batch(d, &b)) {
            if (pass == 0) {
                for (int j = 0; j < b.n_seqs; j++)
                    if (b.sample_index[j] != next++) { printf("FAIL: batch %d is not in file order\n", k); fails++; }
                if (k == cap) h = xrealloc(h, (size_t)(cap *= 2) * sizeof(uint64_t));
                h[k] = batch_hash(&b);
            } else if (k >= n_batches || h[k] != batch_hash(&b)) {
                printf("FAIL: pass 2 batch %d differs\n", k);
                fails++;
            }
            k++;
        }
        if (pass == 0) n_batches = k;
        else if (k != n_batches) { printf("FAIL: pass 2 has %d batches, pass 1 %d\n", k, n_batches); fails++; }
        data_rewind(d);
    }
    if (next != d->n_samples) { printf("FAIL: %d of %d samples seen\n", next, d->n_samples); fails++; }
    printf("eval: %d batches, %d samples in file order, second pass identical; %d failures\n", n_batches, next, fails);
    free(h);
    return fails ? 1 : 0;
}

static int cmd_resume(const char *tok, const char *file, int k, int argc, char **argv) {
    Data ref, a, r;
    DataConfig c;
    DataBatch b;
    open_data(&ref, tok, file, argc, argv, &c);
    int n_ref = 0, cap = 1024;
    uint64_t *h = xmalloc((size_t)cap * sizeof(uint64_t));
    while (data_next_batch(&ref, &b)) {
        if (n_ref == cap) h = xrealloc(h, (size_t)(cap *= 2) * sizeof(uint64_t));
        h[n_ref++] = batch_hash(&b);
    }
    if (k >= n_ref) { printf("FAIL: only %d batches, cannot stop after %d\n", n_ref, k); return 1; }
    /* run k batches, save */
    open_data(&a, tok, file, argc, argv, &c);
    for (int i = 0; i < k; i++) CHECK(data_next_batch(&a, &b));
    uint8_t buf[DATA_CURSOR_BYTES];
    data_cursor_save(&a, buf);
    DataCursor cur = data_cursor(&a);
    data_free(&a);
    /* a fresh process-like start: reopen, restore, continue */
    open_data(&r, tok, file, argc, argv, &c);
    char err[512];
    if (data_cursor_restore(&r, buf, sizeof(buf), err, sizeof(err))) { printf("FAIL: restore: %s\n", err); return 1; }
    int fails = 0, i = k;
    while (data_next_batch(&r, &b)) {
        if (i >= n_ref || batch_hash(&b) != h[i]) { printf("FAIL: batch %d differs after resume\n", i); fails++; }
        i++;
    }
    if (i != n_ref) { printf("FAIL: %d batches after resume, want %d\n", i - k, n_ref - k); fails++; }
    printf("resume at epoch %llu position %llu after %d batches: %d remaining batches, %d differ\n",
           (unsigned long long)cur.epoch, (unsigned long long)cur.position, k, n_ref - k, fails);
    /* the cursor refuses data with another seed, and garbage */
    Data o;
    char **argv2 = xmalloc(((size_t)argc + 1) * sizeof(char *));
    for (int j = 0; j < argc; j++) argv2[j] = argv[j];
    argv2[argc] = "seed=987654321";
    open_data(&o, tok, file, argc + 1, argv2, &c);
    if (!c.shuffle || data_cursor_restore(&o, buf, sizeof(buf), err, sizeof(err)) == 0) {
        if (c.shuffle) { printf("FAIL: cursor accepted by data with another seed\n"); fails++; }
    } else {
        printf("other seed refused: %s\n", err);
    }
    buf[0] ^= 0xff;
    if (data_cursor_restore(&o, buf, sizeof(buf), err, sizeof(err)) == 0) { printf("FAIL: bad magic accepted\n"); fails++; }
    else printf("bad magic refused: %s\n", err);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_sft_data dump|batches|full|order TOK FILE [opt=val...]\n"
                        "       test_sft_data resume TOK FILE K [opt=val...]\n");
        return 2;
    }
    const char *cmd = argv[1], *tok = argv[2], *file = argv[3];
    if (!strcmp(cmd, "resume")) {
        if (argc < 5) { fprintf(stderr, "resume needs K\n"); return 2; }
        return cmd_resume(tok, file, atoi(argv[4]), argc - 5, argv + 5);
    }
    Data d;
    DataConfig c;
    if (!strcmp(cmd, "eval")) {
        char **opts = xmalloc(((size_t)argc) * sizeof(char *));
        int n = 0;
        for (int i = 4; i < argc; i++) opts[n++] = argv[i];
        opts[n++] = "shuffle=0";
        opts[n++] = "epochs=1";
        open_data(&d, tok, file, n, opts, &c);
        int rc = cmd_eval(&d);
        data_free(&d);
        free(opts);
        return rc;
    }
    open_data(&d, tok, file, argc - 4, argv + 4, &c);
    int rc;
    if (!strcmp(cmd, "dump")) rc = cmd_dump(&d);
    else if (!strcmp(cmd, "batches")) rc = cmd_batches(&d, 0);
    else if (!strcmp(cmd, "full")) rc = cmd_batches(&d, 1);
    else if (!strcmp(cmd, "order")) rc = cmd_order(&d);
    else { fprintf(stderr, "unknown sub-command %s\n", cmd); rc = 2; }
    data_free(&d);
    return rc;
}
