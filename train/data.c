/* data.c — see data.h. Reading (records -> samples) first, then iteration (order, packing,
 * batches, cursor). */
#include "train/data.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_WARNINGS = 5 };

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

/* ---------------------------------------------------------------- reading */

typedef struct {
    const char *prompt, *response, *instruction, *input, *output;
    const char *messages, *role, *content, *conversations, *from, *value, *system;
} Keys;

typedef struct {
    Data *d;
    Tokenizer *t;
    const DataConfig *c;
    Keys k;
    int chat_format;         /* -1 until the first record that needs it */
    int n_warned;
    TokIds ids, mask;        /* the record being built */
    int64_t cap_tokens;
    int cap_samples;
} Loader;

#define KEY(field, dflt) ((field) ? (field) : (dflt))

/* A bad record: stop (user_error "path:line: msg") or count it and maybe warn. Returns -1. */
__attribute__((format(printf, 3, 4)))
static int bad(Loader *L, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!L->c->skip_bad_records) user_error("%s:%d: %s", L->d->path, line, msg);
    L->d->stats.n_bad++;
    if (L->n_warned++ < MAX_WARNINGS && util_is_reporter())   /* bad-input lines: the error reporter */
        fprintf(stderr, "tandem: warning: %s:%d: %s (record skipped)\n", L->d->path, line, msg);
    return -1;
}

/* Field key of object o as a string into *out. Returns 0, 1 if absent and optional (or null
 * where null_ok), or -1 after reporting. where: "" or "messages[2]: ". */
static int get_str(Loader *L, int line, const cJSON *o, const char *key, int optional, int null_ok,
                   const char *where, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = "";
    if (!v) return optional ? 1 : bad(L, line, "%sfield \"%s\" missing", where, key);
    if (cJSON_IsNull(v) && null_ok) return 1;
    if (!cJSON_IsString(v)) return bad(L, line, "%sfield \"%s\" is not a string", where, key);
    *out = v->valuestring;
    return 0;
}

static int resolve_chat_format(Loader *L, int line) {
    if (L->chat_format >= 0) return L->chat_format;
    char err[512];
    L->chat_format = chat_format_resolve(L->t, L->c->chat_template, err, sizeof(err));
    if (L->chat_format < 0) user_error("%s:%d: chat record: %s", L->d->path, line, err);
    return L->chat_format;
}

static int render_chat(Loader *L, int line, const ChatMessage *m, int n, const char *what) {
    char err[512];
    int f = resolve_chat_format(L, line);
    if (chat_render(L->t, (ChatFormat)f, m, n, 0, &L->ids, &L->mask, err, sizeof(err)))
        return bad(L, line, "%s%s", what, err);
    return 0;
}

/* [BOS] + encode(prompt) + encode(response) + [EOS], mask 1 from the response on. */
static int build_pair(Loader *L, int line, const char *prompt, const char *response, const char *resp_key) {
    if (!response[0]) return bad(L, line, "field \"%s\" is empty", resp_key);
    if (L->c->pairs_as_chat) {
        ChatMessage m[2] = {{"user", prompt}, {"assistant", response}};
        return render_chat(L, line, m, 2, "");
    }
    int bos = tokenizer_bos_id(L->t), eos = tokenizer_eos_id(L->t);
    if (eos < 0) user_error("%s:%d: the tokenizer has no EOS token; prompt/response records need one", L->d->path, line);
    if (bos >= 0) { tok_ids_push(&L->ids, bos); tok_ids_push(&L->mask, 0); }
    tokenizer_encode(L->t, prompt, strlen(prompt), 0, &L->ids, NULL);
    while (L->mask.n < L->ids.n) tok_ids_push(&L->mask, 0);
    tokenizer_encode(L->t, response, strlen(response), 0, &L->ids, NULL);
    tok_ids_push(&L->ids, eos);
    while (L->mask.n < L->ids.n) tok_ids_push(&L->mask, 1);
    return 0;
}

/* messages / conversations -> ChatMessage list, then the chat template. sharegpt selects the
 * ShareGPT keys and role names. */
static int build_chat(Loader *L, int line, const cJSON *o, const cJSON *arr, int sharegpt) {
    const Keys *k = &L->k;
    const char *arr_key = sharegpt ? k->conversations : k->messages;
    const char *role_key = sharegpt ? k->from : k->role;
    const char *text_key = sharegpt ? k->value : k->content;
    if (!cJSON_IsArray(arr)) return bad(L, line, "field \"%s\" is not an array", arr_key);
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(L, line, "field \"%s\" is empty", arr_key);
    ChatMessage *m = xcalloc((size_t)n + 1, sizeof(ChatMessage));
    int nm = 0, i = 0, n_assistant = 0, rc = -1;
    if (sharegpt) {
        const char *sys;
        int r = get_str(L, line, o, k->system, 1, 1, "", &sys);
        if (r < 0) goto free_msgs;
        if (r == 0 && sys[0]) m[nm++] = (ChatMessage){"system", sys};
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        char where[96];
        snprintf(where, sizeof(where), "%s[%d]: ", arr_key, i);
        if (!cJSON_IsObject(e)) { bad(L, line, "%s[%d] is not an object", arr_key, i); goto free_msgs; }
        const char *role, *text;
        if (get_str(L, line, e, role_key, 0, 0, where, &role) < 0) goto free_msgs;
        if (get_str(L, line, e, text_key, 0, 1, where, &text) < 0) goto free_msgs;
        const char *r = NULL;
        if (sharegpt) {
            if (!strcmp(role, "human") || !strcmp(role, "user")) r = "user";
            else if (!strcmp(role, "gpt") || !strcmp(role, "assistant")) r = "assistant";
            else if (!strcmp(role, "system")) r = "system";
            if (!r) {
                bad(L, line, "%sunknown \"%s\" value \"%s\" (expected human, user, gpt, assistant or system)",
                    where, role_key, role);
                goto free_msgs;
            }
        } else {
            if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant")) r = role;
            if (!r) {
                bad(L, line, "%sunknown %s \"%s\" (expected system, user or assistant)", where, role_key, role);
                goto free_msgs;
            }
        }
        if (!strcmp(r, "assistant")) {
            if (!text[0]) { bad(L, line, "%sassistant field \"%s\" is empty", where, text_key); goto free_msgs; }
            n_assistant++;
        }
        m[nm++] = (ChatMessage){r, text};
        i++;
    }
    if (!n_assistant) { bad(L, line, "field \"%s\": no assistant turn (nothing to train on)", arr_key); goto free_msgs; }
    rc = render_chat(L, line, m, nm, sharegpt ? "conversations as chat: " : "");
free_msgs:
    free(m);
    return rc;
}

/* One record -> L->ids / L->mask. Returns 0, or -1 (reported). */
static int build_record(Loader *L, int line, const cJSON *o) {
    const Keys *k = &L->k;
    const char *a, *b, *in;
    const cJSON *v;
    if (cJSON_GetObjectItemCaseSensitive(o, k->prompt)) {
        if (get_str(L, line, o, k->prompt, 0, 0, "", &a) < 0 ||
            get_str(L, line, o, k->response, 0, 0, "", &b) < 0) return -1;
        return build_pair(L, line, a, b, k->response);
    }
    if (cJSON_GetObjectItemCaseSensitive(o, k->instruction)) {
        if (get_str(L, line, o, k->instruction, 0, 0, "", &a) < 0 ||
            get_str(L, line, o, k->input, 1, 1, "", &in) < 0 ||
            get_str(L, line, o, k->output, 0, 0, "", &b) < 0) return -1;
        if (!in[0]) return build_pair(L, line, a, b, k->output);
        size_t na = strlen(a), ni = strlen(in);
        char *p = xmalloc(na + 2 + ni + 1);   /* the Alpaca template: instruction "\n\n" input */
        memcpy(p, a, na);
        memcpy(p + na, "\n\n", 2);
        memcpy(p + na + 2, in, ni + 1);
        int rc = build_pair(L, line, p, b, k->output);
        free(p);
        return rc;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, k->messages))) return build_chat(L, line, o, v, 0);
    if ((v = cJSON_GetObjectItemCaseSensitive(o, k->conversations))) return build_chat(L, line, o, v, 1);
    return bad(L, line, "no SFT fields: expected \"%s\"/\"%s\", \"%s\"/\"%s\", \"%s\" or \"%s\"", k->prompt,
               k->response, k->instruction, k->output, k->messages, k->conversations);
}

/* Applies the over-long policy to the built record and appends it as a sample. */
static void keep_record(Loader *L, int line) {
    Data *d = L->d;
    int64_t n = (int64_t)L->ids.n;
    CHECK(L->mask.n == L->ids.n);
    if (n > L->c->seq_len) {
        if (L->c->overlong == OVERLONG_DROP) { d->stats.n_dropped_long++; return; }
        d->stats.n_truncated++;
        n = L->c->seq_len;
    }
    if (L->c->train_on_prompt)
        for (int64_t i = 0; i < n; i++) L->mask.ids[i] = i > 0;
    int64_t n_loss = 0;
    for (int64_t i = 1; i < n; i++) n_loss += L->mask.ids[i] != 0;
    if (!n_loss) { d->stats.n_dropped_no_loss++; return; }
    int64_t off = d->sample_off[d->n_samples];
    if (off + n > L->cap_tokens) {
        L->cap_tokens = (off + n) * 2 + 4096;
        d->ids = xrealloc(d->ids, (size_t)L->cap_tokens * sizeof(int32_t));
        d->mask = xrealloc(d->mask, (size_t)L->cap_tokens);
    }
    if (d->n_samples + 1 >= L->cap_samples) {
        L->cap_samples = L->cap_samples * 2 + 256;
        d->sample_off = xrealloc(d->sample_off, ((size_t)L->cap_samples + 1) * sizeof(int64_t));
        d->sample_line = xrealloc(d->sample_line, (size_t)L->cap_samples * sizeof(int));
    }
    for (int64_t i = 0; i < n; i++) {
        d->ids[off + i] = L->ids.ids[i];
        d->mask[off + i] = (uint8_t)(L->mask.ids[i] != 0);
    }
    d->sample_line[d->n_samples] = line;
    d->sample_off[++d->n_samples] = off + n;
    d->stats.n_tokens += n;
    d->stats.n_loss_tokens += n_loss;
}

/* text[0..len) holds one record starting at line `line` of the file. */
static void load_record(Loader *L, const char *text, size_t len, int line) {
    L->d->stats.n_records++;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (o) {   /* one record per line: anything but whitespace after it is a bad record too */
        while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
        if (end < text + len) {
            cJSON_Delete(o);
            bad(L, line, "text after the JSON object (one record per line)");
            return;
        }
    }
    if (!o) {
        /* name the line of the error when cJSON points into this record */
        const char *ep = cJSON_GetErrorPtr();
        int eline = line;
        if (ep && ep >= text && ep <= text + len)
            for (const char *p = text; p < ep; p++) eline += *p == '\n';
        bad(L, eline, "invalid JSON");
        return;
    }
    if (!cJSON_IsObject(o)) { bad(L, line, "not a JSON object"); cJSON_Delete(o); return; }
    L->ids.n = L->mask.n = 0;
    if (build_record(L, line, o) == 0) keep_record(L, line);
    cJSON_Delete(o);
}

/* JSON lines: every non-blank line is a record. */
static void load_lines(Loader *L, const char *s, size_t n) {
    int line = 0;
    for (size_t pos = 0; pos < n;) {
        line++;
        const char *nl = memchr(s + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - s) : n, e = end, b = pos;
        while (e > b && (s[e - 1] == '\r' || s[e - 1] == ' ' || s[e - 1] == '\t')) e--;
        while (b < e && (s[b] == ' ' || s[b] == '\t')) b++;
        if (e > b) load_record(L, s + b, e - b, line);
        pos = end + 1;
    }
}

/* One JSON array: each element is a record. Elements are delimited by a scan that follows
 * strings and bracket depth (so a malformed element costs only itself), then parsed alone.
 * Separators are read leniently: any run of whitespace and commas between elements. */
static void load_array(Loader *L, const char *s, size_t n, size_t pos, int line) {
    const char *path = L->d->path;
    pos++; /* '[' */
    for (;;) {
        while (pos < n && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\r' || s[pos] == '\n' || s[pos] == ','))
            line += s[pos++] == '\n';
        if (pos >= n) user_error("%s: the JSON array never closes (truncated file?)", path);
        if (s[pos] == ']') break;
        size_t start = pos;
        int start_line = line, depth = 0, in_str = 0;
        for (; pos < n; pos++) {
            char c = s[pos];
            if (c == '\n') line++;
            if (in_str) {
                if (c == '\\') { if (pos + 1 < n && s[pos + 1] == '\n') line++; pos++; }
                else if (c == '"') in_str = 0;
            } else if (c == '"') {
                in_str = 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (depth == 0) break;          /* the array's own ']' after a bare value */
                if (--depth == 0) { pos++; break; }
            } else if (c == ',' && depth == 0) {
                break;
            }
        }
        if (pos >= n && (depth > 0 || in_str))
            user_error("%s:%d: this array element never closes (truncated file?)", path, start_line);
        load_record(L, s + start, pos - start, start_line);
    }
    for (pos++; pos < n; pos++) {
        if (s[pos] == '\n') line++;
        else if (s[pos] != ' ' && s[pos] != '\t' && s[pos] != '\r')
            user_error("%s:%d: text after the closing ']' of the JSON array", path, line);
    }
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
    Loader L = {.d = d, .t = t, .c = cfg, .chat_format = -1};
    L.k = (Keys){KEY(cfg->prompt_key, "prompt"), KEY(cfg->response_key, "response"),
                 KEY(cfg->instruction_key, "instruction"), KEY(cfg->input_key, "input"),
                 KEY(cfg->output_key, "output"), KEY(cfg->messages_key, "messages"),
                 KEY(cfg->role_key, "role"), KEY(cfg->content_key, "content"),
                 KEY(cfg->conversations_key, "conversations"), KEY(cfg->from_key, "from"),
                 KEY(cfg->value_key, "value"), KEY(cfg->system_key, "system")};
    if (cfg->chat_template) {  /* a bad name fails before any record is read */
        char err[512];
        L.chat_format = chat_format_resolve(t, cfg->chat_template, err, sizeof(err));
        if (L.chat_format < 0) user_error("%s", err);
    }
    d->sample_off = xcalloc(1, sizeof(int64_t));
    size_t n;
    char *s = read_file(path, &n);
    if (!s) user_error("%s: cannot read the data file", path);
    size_t pos = 0;
    int line = 1;
    while (pos < n && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\r' || s[pos] == '\n'))
        line += s[pos++] == '\n';
    if (pos < n && s[pos] == '[') load_array(&L, s, n, pos, line);
    else load_lines(&L, s, n);
    free(s);
    tok_ids_free(&L.ids);
    tok_ids_free(&L.mask);
    d->cfg.chat_template = NULL;     /* the caller's strings: not kept */
    d->cfg.prompt_key = d->cfg.response_key = d->cfg.instruction_key = d->cfg.input_key = NULL;
    d->cfg.output_key = d->cfg.messages_key = d->cfg.role_key = d->cfg.content_key = NULL;
    d->cfg.conversations_key = d->cfg.from_key = d->cfg.value_key = d->cfg.system_key = NULL;
    d->stats.n_samples = d->n_samples;
    if (d->n_samples == 0) {
        user_error("%s: no samples left (%d records, %d bad, %d over-long dropped, %d with no loss "
                   "token after truncation)", path, d->stats.n_records, d->stats.n_bad,
                   d->stats.n_dropped_long, d->stats.n_dropped_no_loss);
    }
    /* iteration state */
    int max_tok = data_max_batch_tokens(d);
    d->order = xmalloc((size_t)d->n_samples * sizeof(int));
    data_epoch_order(d, 0, d->order);
    d->order_epoch = 0;
    d->b_tokens = xmalloc((size_t)max_tok * sizeof(int));
    d->b_targets = xmalloc((size_t)max_tok * sizeof(int));
    d->b_seq_start = xmalloc(((size_t)max_tok + 1) * sizeof(int));
    d->b_sample = xmalloc((size_t)max_tok * sizeof(int));
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

int data_max_batch_tokens(const Data *d) { return d->cfg.batch_size * d->cfg.seq_len; }

/* ---------------------------------------------------------------- iteration */

void data_epoch_order(const Data *d, uint64_t epoch, int *out) {
    int n = d->n_samples;
    for (int i = 0; i < n; i++) out[i] = i;
    if (!d->cfg.shuffle) return;
    uint64_t e = epoch;
    uint64_t s = d->cfg.seed ^ splitmix64_next(&e);   /* seed ^ first output of splitmix64(epoch) */
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(splitmix64_next(&s) % (uint64_t)(i + 1));
        int tmp = out[i];
        out[i] = out[j];
        out[j] = tmp;
    }
}

int data_next_batch(Data *d, DataBatch *b) {
    const DataConfig *c = &d->cfg;
    if (c->n_epochs && d->cur.epoch >= (uint64_t)c->n_epochs) return 0;
    if (d->order_epoch != d->cur.epoch) {
        data_epoch_order(d, d->cur.epoch, d->order);
        d->order_epoch = d->cur.epoch;
    }
    int n = d->n_samples, N = 0, n_seqs = 0, n_rows = 0, n_loss = 0;
    uint64_t p = d->cur.position;
    d->b_seq_start[0] = 0;
    while (n_rows < c->batch_size && p < (uint64_t)n) {
        int row_len = 0;
        do {
            int i = d->order[p];
            const int32_t *ids;
            const uint8_t *mask;
            int len = data_sample(d, i, &ids, &mask);
            if (row_len > 0 && row_len + len > c->seq_len) break;  /* starts the next row */
            for (int t = 0; t < len; t++) {
                d->b_tokens[N + t] = ids[t];
                d->b_targets[N + t] = t + 1 < len && mask[t + 1] ? ids[t + 1] : -1;
                n_loss += d->b_targets[N + t] >= 0;
            }
            d->b_sample[n_seqs] = i;
            N += len;
            d->b_seq_start[++n_seqs] = N;
            row_len += len;
            p++;
        } while (c->pack && p < (uint64_t)n);
        n_rows++;
    }
    *b = (DataBatch){.tokens = d->b_tokens, .seq_start = d->b_seq_start, .targets = d->b_targets,
                     .sample_index = d->b_sample, .n_tokens = N, .n_seqs = n_seqs, .n_rows = n_rows,
                     .n_loss = n_loss, .epoch = d->cur.epoch};
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
    if (len != DATA_CURSOR_BYTES || (uint32_t)get_u64(buf) != CURSOR_MAGIC) {
        snprintf(err, errlen, "not a data cursor (%zu bytes, expected %d starting with \"TDCR\")", len,
                 DATA_CURSOR_BYTES);
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
    if (pos >= ns) {
        snprintf(err, errlen, "data cursor position %llu is past the %llu samples", (unsigned long long)pos,
                 (unsigned long long)ns);
        return -1;
    }
    d->cur = (DataCursor){epoch, pos};
    return 0;
}
