/* data.c — see data.h. The Data object and the iteration half: open (config checks, then the
 * records through records_load, then the iteration buffers), free, summary, sample access, epoch
 * order, packing, batches and the resumable cursor. Does not own: reading files, parsing records
 * or tokenizing them (records.c, behind records.h). */
#include "train/data.h"
#include "train/records.h"
#include "runtime/util.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void data_config_default(DataConfig *c) {
    memset(c, 0, sizeof(*c));
    c->seq_len = 1024;
    c->batch_size = 8;
    c->pack = 1;
    c->shuffle = 1;
    c->seed = 1234;
    c->n_epochs = 1;
    c->overlong = OVERLONG_TRUNCATE;
}

void data_open(Data *d, const char *path, Tokenizer *t, const DataConfig *cfg) {
    memset(d, 0, sizeof(*d));
    if (cfg->seq_len < 2) user_error("data: seq_len must be at least 2 (got %d)", cfg->seq_len);
    if (cfg->batch_size < 1) user_error("data: batch_size must be at least 1 (got %d)", cfg->batch_size);
    if ((int64_t)cfg->seq_len * cfg->batch_size > INT_MAX / 2)
        user_error("data: batch_size x seq_len = %lld tokens is too many for one batch",
                   (long long)cfg->seq_len * cfg->batch_size);
    if (cfg->n_epochs < 0) user_error("data: n_epochs must be >= 0 (got %d)", cfg->n_epochs);
    d->path = xstrdup(path);
    d->cfg = *cfg;
    records_load(d, path, t, cfg);
    d->group = cfg->preference ? 2 : 1;
    if (cfg->preference) d->cfg.pack = 0;
    d->stats.n_pairs = cfg->preference ? d->n_samples / 2 : 0;
    d->cfg.chat_template = NULL;     /* the caller's strings: not kept */
    d->cfg.prompt_key = d->cfg.response_key = d->cfg.instruction_key = d->cfg.input_key = NULL;
    d->cfg.output_key = d->cfg.messages_key = d->cfg.role_key = d->cfg.content_key = NULL;
    d->cfg.conversations_key = d->cfg.from_key = d->cfg.value_key = d->cfg.system_key = NULL;
    d->stats.n_samples = d->n_samples;
    if (d->n_samples == 0) {
        user_error("%s: no %s left (%d records, %d bad, %d over-long dropped, %d with no loss "
                   "token after truncation)", path, cfg->preference ? "pairs" : "samples", d->stats.n_records, d->stats.n_bad,
                   d->stats.n_dropped_long, d->stats.n_dropped_no_loss);
    }
    /* iteration state */
    int max_tok = data_max_batch_tokens(d);
    d->order = xmalloc((size_t)d->n_samples * sizeof(int));   /* n_samples / group used */
    data_epoch_order(d, 0, d->order);
    d->order_epoch = 0;
    d->b_tokens = xmalloc((size_t)max_tok * sizeof(int));
    d->b_targets = xmalloc((size_t)max_tok * sizeof(int));
    d->b_seq_start = xmalloc(((size_t)max_tok + 1) * sizeof(int));
    d->b_sample = xmalloc((size_t)max_tok * sizeof(int));
    d->b_margin = xmalloc((size_t)max_tok * sizeof(float));
}

void data_free(Data *d) {
    free(d->path);
    free(d->sample_off);
    free(d->ids);
    free(d->mask);
    free(d->sample_line);
    free(d->order);
    free(d->b_tokens);
    free(d->b_targets);
    free(d->b_seq_start);
    free(d->b_sample);
    free(d->b_margin);
    free(d->margin);
    memset(d, 0, sizeof(*d));
}

void data_print_summary(const Data *d, FILE *f) {
    const DataStats *s = &d->stats;
    fprintf(f, "data %s: %d records -> %d samples, %lld tokens, %lld loss tokens; %d bad records "
            "skipped; %d truncated to %d tokens (%d of them dropped: no loss token left); "
            "%d over-long dropped\n", d->path, s->n_records, s->n_samples, (long long)s->n_tokens,
            (long long)s->n_loss_tokens, s->n_bad, s->n_truncated, d->cfg.seq_len,
            s->n_dropped_no_loss, s->n_dropped_long);
}

int data_sample(const Data *d, int i, const int32_t **ids, const uint8_t **mask) {
    CHECK(i >= 0 && i < d->n_samples);
    if (ids) *ids = d->ids + d->sample_off[i];
    if (mask) *mask = d->mask + d->sample_off[i];
    return (int)(d->sample_off[i + 1] - d->sample_off[i]);
}

int data_max_batch_tokens(const Data *d) { return d->cfg.batch_size * d->cfg.seq_len * (d->group ? d->group : 1); }

/* ---------------------------------------------------------------- iteration */

void data_epoch_order(const Data *d, uint64_t epoch, int *out) {
    int n = d->n_samples / d->group;   /* units: samples, or pairs */
    for (int i = 0; i < n; i++) out[i] = i;
    if (!d->cfg.shuffle) return;
    uint64_t e = epoch;
    uint64_t s = d->cfg.seed ^ splitmix64_next(&e);   /* seed ^ first output of splitmix64(epoch) */
    shuffle_ints(out, n, &s);
}

int data_next_batch(Data *d, DataBatch *b) {
    const DataConfig *c = &d->cfg;
    if (c->n_epochs && d->cur.epoch >= (uint64_t)c->n_epochs) return 0;
    if (d->order_epoch != d->cur.epoch) {
        data_epoch_order(d, d->cur.epoch, d->order);
        d->order_epoch = d->cur.epoch;
    }
    int g = d->group, n = d->n_samples / g, N = 0, n_seqs = 0, n_rows = 0, n_loss = 0;
    uint64_t p = d->cur.position;
    d->b_seq_start[0] = 0;
    while (n_rows < c->batch_size && p < (uint64_t)n) {
        int row_len = 0;
        do {
            int u = d->order[p], len = 0;
            for (int k = 0; k < g; k++) len += (int)(d->sample_off[u * g + k + 1] - d->sample_off[u * g + k]);
            if (row_len > 0 && row_len + len > c->seq_len) break;  /* starts the next row */
            if (g == 2) d->b_margin[n_seqs / 2] = d->margin[u];
            for (int k = 0; k < g; k++) {                           /* the unit's samples */
                int i = u * g + k;
                const int32_t *ids;
                const uint8_t *mask;
                int sl = data_sample(d, i, &ids, &mask);
                for (int t = 0; t < sl; t++) {
                    d->b_tokens[N + t] = ids[t];
                    d->b_targets[N + t] = t + 1 < sl && mask[t + 1] ? ids[t + 1] : -1;
                    n_loss += d->b_targets[N + t] >= 0;
                }
                d->b_sample[n_seqs] = i;
                N += sl;
                d->b_seq_start[++n_seqs] = N;
            }
            row_len += len;
            p++;
        } while (c->pack && p < (uint64_t)n);
        n_rows++;
    }
    *b = (DataBatch){.tokens = d->b_tokens, .seq_start = d->b_seq_start, .targets = d->b_targets,
                     .sample_index = d->b_sample, .margin = g == 2 ? d->b_margin : NULL, .n_tokens = N,
                     .n_seqs = n_seqs, .n_rows = n_rows, .n_loss = n_loss, .epoch = d->cur.epoch};
    d->cur.position = p;
    if (p == (uint64_t)n) { d->cur.epoch++; d->cur.position = 0; }
    return 1;
}

/* ---------------------------------------------------------------- cursor */

static const uint32_t CURSOR_MAGIC = 0x52434454u; /* "TDCR" little-endian */
static const uint32_t CURSOR_VERSION = 1;

static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

DataCursor data_cursor(const Data *d) { return d->cur; }
void data_rewind(Data *d) { d->cur = (DataCursor){0, 0}; }

/* layout: magic u32 | version u32 | epoch | position | n_samples | n_tokens | seed | shuffle u64 */
void data_cursor_save(const Data *d, uint8_t buf[DATA_CURSOR_BYTES]) {
    put_u64(buf, (uint64_t)CURSOR_MAGIC | (uint64_t)CURSOR_VERSION << 32);
    put_u64(buf + 8, d->cur.epoch);
    put_u64(buf + 16, d->cur.position);
    put_u64(buf + 24, (uint64_t)d->n_samples);
    put_u64(buf + 32, (uint64_t)d->stats.n_tokens);
    put_u64(buf + 40, d->cfg.seed);
    put_u64(buf + 48, (uint64_t)d->cfg.shuffle);
}

int data_cursor_restore(Data *d, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    if (len != DATA_CURSOR_BYTES) {
        snprintf(err, errlen, "not a data cursor (%zu bytes, expected %d)", len, DATA_CURSOR_BYTES);
        return -1;
    }
    if ((uint32_t)get_u64(buf) != CURSOR_MAGIC) {
        snprintf(err, errlen, "not a data cursor: its magic is %08x, expected %08x (\"TDCR\")", (unsigned)get_u64(buf),
                 (unsigned)CURSOR_MAGIC);
        return -1;
    }
    uint32_t version = (uint32_t)(get_u64(buf) >> 32);
    if (version != CURSOR_VERSION) {
        snprintf(err, errlen, "data cursor version %u, this build reads version %u", version, CURSOR_VERSION);
        return -1;
    }
    uint64_t epoch = get_u64(buf + 8), pos = get_u64(buf + 16), ns = get_u64(buf + 24);
    uint64_t nt = get_u64(buf + 32), seed = get_u64(buf + 40), shuffle = get_u64(buf + 48);
    if (ns != (uint64_t)d->n_samples || nt != (uint64_t)d->stats.n_tokens || seed != d->cfg.seed ||
        shuffle != (uint64_t)d->cfg.shuffle) {
        snprintf(err, errlen, "data cursor saved for %llu samples / %llu tokens / seed %llu / shuffle %llu, "
                 "but %s gives %d / %lld / %llu / %d: resume with the same data, seq_len, seed and shuffle",
                 (unsigned long long)ns, (unsigned long long)nt, (unsigned long long)seed,
                 (unsigned long long)shuffle, d->path, d->n_samples, (long long)d->stats.n_tokens,
                 (unsigned long long)d->cfg.seed, d->cfg.shuffle);
        return -1;
    }
    if (pos >= ns / (uint64_t)d->group) {
        snprintf(err, errlen, "data cursor position %llu is past the %llu samples", (unsigned long long)pos,
                 (unsigned long long)ns);
        return -1;
    }
    d->cur = (DataCursor){epoch, pos};
    return 0;
}
