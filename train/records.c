/* records.c — the reading half of Data: a jsonl file or a JSON array -> records -> tokenized
 * samples (ids + loss masks) in Data's sample arrays. Owns: file format detection and record
 * delimiting, the SFT record formats (prompt/response, Alpaca, chat, ShareGPT), preference pairs,
 * tokenization of each record, the bad-record and over-long policies. Does not own: config checks,
 * the Data lifetime or the summary (data.c, data_open / data_free), nor epoch order, packing,
 * batches or the cursor (data.c). The formats are specified in data.h; records.h is the one entry
 * point, records_load. */
#include "train/records.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_WARNINGS = 5 };

/* ---------------------------------------------------------------- SFT records */

typedef struct {
    const char *prompt, *response, *instruction, *input, *output;
    const char *messages, *role, *content, *conversations, *from, *value, *system;
} Keys;

typedef struct {
    Data *d;
    Tokenizer *t;
    const DataConfig *c;
    Keys k;
    const char *file;        /* the whole file's text (a bad byte's line starts in it) */
    int chat_format;         /* -1 until the first record that needs it */
    int n_warned;
    TokIds ids, mask;        /* the record being built */
    TokIds c_ids, c_mask;    /* preference: the chosen sample, while the rejected one is built */
    float margin;            /* preference: the pair's margin */
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

/* Appends the entries of a messages / conversations array to m (room for all of them): sharegpt
 * selects the ShareGPT keys and role names. Counts assistant turns into *n_assistant. Returns 0,
 * or -1 (reported). */
static int collect_msgs(Loader *L, int line, const cJSON *arr, const char *arr_key, int sharegpt, ChatMessage *m,
                        int *nm, int *n_assistant) {
    const Keys *k = &L->k;
    const char *role_key = sharegpt ? k->from : k->role;
    const char *text_key = sharegpt ? k->value : k->content;
    char err[512];
    int n = chat_messages_parse(arr, arr_key, role_key, text_key, m + *nm, err, sizeof(err));
    if (n < 0) return bad(L, line, "%s", err);
    for (int i = 0; i < n; i++) {
        const char *role = m[*nm].role, *r = NULL;
        if (sharegpt) {
            if (!strcmp(role, "human") || !strcmp(role, "user")) r = "user";
            else if (!strcmp(role, "gpt") || !strcmp(role, "assistant")) r = "assistant";
            else if (!strcmp(role, "system")) r = "system";
            if (!r)
                return bad(L, line, "%s[%d]: unknown \"%s\" value \"%s\" (expected human, user, gpt, assistant or system)",
                           arr_key, i, role_key, role);
        } else {
            if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant")) r = role;
            if (!r) return bad(L, line, "%s[%d]: unknown %s \"%s\" (expected system, user or assistant)", arr_key, i, role_key, role);
        }
        if (!strcmp(r, "assistant")) {
            if (!m[*nm].content[0]) return bad(L, line, "%s[%d]: assistant field \"%s\" is empty", arr_key, i, text_key);
            (*n_assistant)++;
        }
        m[(*nm)++].role = r;
    }
    return 0;
}

/* ShareGPT's top-level "system" string as a leading system message. Returns 0 or -1. */
static int sharegpt_system(Loader *L, int line, const cJSON *o, ChatMessage *m, int *nm) {
    const char *sys;
    int r = get_str(L, line, o, L->k.system, 1, 1, "", &sys);
    if (r < 0) return -1;
    if (r == 0 && sys[0]) m[(*nm)++] = (ChatMessage){"system", sys};
    return 0;
}

/* messages / conversations -> ChatMessage list, then the chat template. sharegpt selects the
 * ShareGPT keys and role names. */
static int build_chat(Loader *L, int line, const cJSON *o, const cJSON *arr, int sharegpt) {
    const char *arr_key = sharegpt ? L->k.conversations : L->k.messages;
    if (!cJSON_IsArray(arr)) return bad(L, line, "field \"%s\" is not an array", arr_key);
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(L, line, "field \"%s\" is empty", arr_key);
    ChatMessage *m = xcalloc((size_t)n + 1, sizeof(ChatMessage));
    int nm = 0, n_assistant = 0, rc = -1;
    if (sharegpt && sharegpt_system(L, line, o, m, &nm) < 0) goto free_msgs;
    if (collect_msgs(L, line, arr, arr_key, sharegpt, m, &nm, &n_assistant) < 0) goto free_msgs;
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

/* Appends ids / mask [0, n) as a sample (n_loss: its mask-1 tokens after the first). */
static void append_sample(Loader *L, int line, const int32_t *ids, const int32_t *mask, int64_t n, int64_t n_loss) {
    Data *d = L->d;
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
        d->margin = xrealloc(d->margin, ((size_t)L->cap_samples / 2 + 1) * sizeof(float));
    }
    for (int64_t i = 0; i < n; i++) {
        d->ids[off + i] = ids[i];
        d->mask[off + i] = (uint8_t)(mask[i] != 0);
    }
    d->sample_line[d->n_samples] = line;
    d->sample_off[++d->n_samples] = off + n;
    d->stats.n_tokens += n;
    d->stats.n_loss_tokens += n_loss;
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
    append_sample(L, line, L->ids.ids, L->mask.ids, n, n_loss);
}

/* ---------------------------------------------------------------- preference pairs */

/* [BOS] + encode(prompt + response) + [EOS] as one text; mask 1 from the token holding the first
 * response byte. */
static int build_text_pair(Loader *L, int line, const char *prompt, const char *response, const char *resp_key) {
    if (!response[0]) return bad(L, line, "field \"%s\": empty response", resp_key);
    int bos = tokenizer_bos_id(L->t), eos = tokenizer_eos_id(L->t);
    if (eos < 0) user_error("%s:%d: the tokenizer has no EOS token; preference pairs need one", L->d->path, line);
    size_t pl = strlen(prompt), rl = strlen(response);
    char *text = xmalloc(pl + rl + 1);
    memcpy(text, prompt, pl);
    memcpy(text + pl, response, rl + 1);
    TokIds starts = {0};
    if (bos >= 0) { tok_ids_push(&L->ids, bos); tok_ids_push(&starts, 0); }
    size_t first = L->ids.n;
    tokenizer_encode(L->t, text, pl + rl, 0, &L->ids, &starts);
    size_t resp = first;                       /* the last token that starts at or before the boundary */
    for (size_t i = first; i < L->ids.n; i++)
        if ((size_t)starts.ids[i] <= pl) resp = i;
    for (size_t i = 0; i < L->ids.n; i++) tok_ids_push(&L->mask, i >= resp);
    tok_ids_push(&L->ids, eos);
    tok_ids_push(&L->mask, 1);
    tok_ids_free(&starts);
    free(text);
    return 0;
}

/* chat_render of m, then the loss mask kept on the last assistant turn only (its last run of 1s),
 * and the sequence cut after it: the last token is the answer's end-of-turn token, where a reward
 * model reads its score */
static int build_chat_pair(Loader *L, int line, const ChatMessage *m, int nm, const char *what) {
    if (nm == 0 || strcmp(m[nm - 1].role, "assistant"))
        return bad(L, line, "%s: the conversation must end with the assistant's answer", what);
    if (render_chat(L, line, m, nm, "") < 0) return -1;
    size_t n = L->mask.n, end = n;
    while (end > 0 && !L->mask.ids[end - 1]) end--;
    size_t start = end;
    while (start > 0 && L->mask.ids[start - 1]) start--;
    for (size_t i = 0; i < start; i++) L->mask.ids[i] = 0;
    L->ids.n = L->mask.n = end;   /* ends with the end-of-turn token (the template's "\n" after it goes) */
    return 0;
}

/* the prompt of two full texts: their common prefix, cut after its last "\n\nAssistant:", else at
 * the last space before they part. Returns its length, 0 when there is none. */
static size_t common_prompt(const char *a, const char *b) {
    size_t n = 0;
    while (a[n] && a[n] == b[n]) n++;
    const char *tag = "\n\nAssistant:";
    size_t tl = strlen(tag), cut = 0;
    for (size_t i = 0; i + tl <= n; i++)
        if (!memcmp(a + i, tag, tl)) cut = i + tl;
    if (cut) return cut;
    while (n > 0 && a[n - 1] != ' ' && a[n] && b[n]) n--;   /* do not split a word */
    return n;
}

/* the two halves of a pair into (c_ids, c_mask) and (ids, mask) */
static int build_pref(Loader *L, int line, const cJSON *o) {
    const Keys *k = &L->k;
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "chosen"), *rj = cJSON_GetObjectItemCaseSensitive(o, "rejected");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, k->prompt), *conv = cJSON_GetObjectItemCaseSensitive(o, k->conversations);
    const cJSON *mg = cJSON_GetObjectItemCaseSensitive(o, "margin");
    if (!ch) return bad(L, line, "field \"chosen\" missing (a preference pair needs \"chosen\" and \"rejected\")");
    if (!rj) return bad(L, line, "field \"rejected\" missing (a preference pair needs \"chosen\" and \"rejected\")");
    if (mg && !cJSON_IsNumber(mg)) return bad(L, line, "field \"margin\" is not a number");
    L->margin = mg ? (float)mg->valuedouble : 0.0f;
    const cJSON *side[2] = {ch, rj};
    const char *name[2] = {"chosen", "rejected"};
    int rc = 0;
    ChatMessage *m = NULL;
    if (cJSON_IsString(ch) || cJSON_IsString(rj)) {                      /* text */
        if (!cJSON_IsString(ch) || !cJSON_IsString(rj))
            return bad(L, line, "fields \"chosen\" and \"rejected\" must both be strings or both lists");
        const char *prompt = "";
        size_t cut = 0;
        if (pr) {
            if (!cJSON_IsString(pr)) return bad(L, line, "field \"%s\" is not a string", k->prompt);
            prompt = pr->valuestring;
        } else {
            cut = common_prompt(ch->valuestring, rj->valuestring);
            if (!cut) return bad(L, line, "\"chosen\" and \"rejected\" share no prompt text (and no \"%s\" field)", k->prompt);
        }
        if (!strcmp(ch->valuestring, rj->valuestring)) return bad(L, line, "\"chosen\" and \"rejected\" are identical");
        for (int s = 0; s < 2; s++) {
            if (s) { TokIds t = L->c_ids; L->c_ids = L->ids; L->ids = t; t = L->c_mask; L->c_mask = L->mask; L->mask = t; }
            L->ids.n = L->mask.n = 0;
            if (pr) {
                if (build_text_pair(L, line, prompt, side[s]->valuestring, name[s]) < 0) return -1;
            } else {
                char *p = xmalloc(cut + 1);
                memcpy(p, ch->valuestring, cut);
                p[cut] = 0;
                rc = build_text_pair(L, line, p, side[s]->valuestring + cut, name[s]);
                free(p);
                if (rc < 0) return -1;
            }
        }
        return 0;
    }
    /* chat: ShareGPT {conversations, chosen: {from, value}} or lists of messages */
    int sharegpt = conv != NULL;
    int cap = 2 + (conv ? cJSON_GetArraySize(conv) : 0) + (pr ? cJSON_GetArraySize(pr) : 0) +
              (cJSON_IsArray(ch) ? cJSON_GetArraySize(ch) : 1) + (cJSON_IsArray(rj) ? cJSON_GetArraySize(rj) : 1);
    m = xcalloc((size_t)cap, sizeof(ChatMessage));
    for (int s = 0; s < 2 && rc == 0; s++) {
        if (s) { TokIds t = L->c_ids; L->c_ids = L->ids; L->ids = t; t = L->c_mask; L->c_mask = L->mask; L->mask = t; }
        L->ids.n = L->mask.n = 0;
        int nm = 0, n_asst = 0;
        if (sharegpt) {
            if (!cJSON_IsArray(conv)) { rc = bad(L, line, "field \"%s\" is not an array", k->conversations); break; }
            if (!cJSON_IsObject(side[s])) { rc = bad(L, line, "field \"%s\" is not an object {\"%s\", \"%s\"}", name[s], k->from, k->value); break; }
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemReferenceToArray(one, (cJSON *)side[s]);
            rc = sharegpt_system(L, line, o, m, &nm);
            if (rc == 0) rc = collect_msgs(L, line, conv, k->conversations, 1, m, &nm, &n_asst);
            if (rc == 0) rc = collect_msgs(L, line, one, name[s], 1, m, &nm, &n_asst);
            cJSON_Delete(one);
        } else {
            if (!cJSON_IsArray(side[s])) { rc = bad(L, line, "field \"%s\" is not a string or a list of messages", name[s]); break; }
            if (pr && !cJSON_IsArray(pr)) { rc = bad(L, line, "field \"%s\" is not a list of messages", k->prompt); break; }
            if (pr) rc = collect_msgs(L, line, pr, k->prompt, 0, m, &nm, &n_asst);
            if (rc == 0) rc = collect_msgs(L, line, side[s], name[s], 0, m, &nm, &n_asst);
        }
        if (rc == 0) rc = build_chat_pair(L, line, m, nm, name[s]);
    }
    free(m);
    if (rc == 0 && L->ids.n == L->c_ids.n && !memcmp(L->ids.ids, L->c_ids.ids, sizeof(int32_t) * L->ids.n))
        return bad(L, line, "\"chosen\" and \"rejected\" are identical");
    return rc;
}

/* Fits one half into seq_len: drops prompt tokens from the left (after a BOS). Returns the new
 * length, or -1 when the response does not fit with one token before it. */
static int64_t fit_half(Loader *L, int32_t *ids, int32_t *mask, int64_t n, int *truncated) {
    int64_t seq = L->c->seq_len, r = 0;
    while (r < n && !mask[r]) r++;                /* first response token */
    if (n - r + 1 > seq) return -1;
    if (n <= seq) return n;
    int keep_bos = tokenizer_bos_id(L->t) >= 0 && ids[0] == tokenizer_bos_id(L->t);
    int64_t cut = n - seq, from = keep_bos;          /* drop [from, from + cut) */
    memmove(ids + from, ids + from + cut, sizeof(int32_t) * (size_t)(n - from - cut));
    memmove(mask + from, mask + from + cut, sizeof(int32_t) * (size_t)(n - from - cut));
    *truncated = 1;
    return seq;
}

static void keep_pair(Loader *L, int line) {
    Data *d = L->d;
    int truncated = 0;
    int64_t nc = fit_half(L, L->c_ids.ids, L->c_mask.ids, (int64_t)L->c_ids.n, &truncated);
    int64_t nr = fit_half(L, L->ids.ids, L->mask.ids, (int64_t)L->ids.n, &truncated);
    if (nc < 0 || nr < 0) { d->stats.n_dropped_long++; return; }
    d->stats.n_truncated += truncated;
    int32_t *ids[2] = {L->c_ids.ids, L->ids.ids}, *mask[2] = {L->c_mask.ids, L->mask.ids};
    int64_t len[2] = {nc, nr};
    for (int s = 0; s < 2; s++) {
        int64_t n_loss = 0;
        for (int64_t i = 1; i < len[s]; i++) n_loss += mask[s][i] != 0;
        append_sample(L, line, ids[s], mask[s], len[s], n_loss);
    }
    d->margin[d->n_samples / 2 - 1] = L->margin;
}

/* The rules of every text input (jsonl.h), checked before the record is parsed: at most
 * jsonl_max_bytes(seq_len) bytes, and UTF-8 (a bad byte named by its line and its byte in that
 * line, as generate names it). Returns 0, or -1 (reported). */
static int check_text(Loader *L, const char *text, size_t len, int line) {
    size_t max = jsonl_max_bytes(L->c->seq_len);
    if (len > max)
        return bad(L, line, "a record of %zu bytes, over the limit of %zu bytes for seq_len %d (64 bytes per token, "
                   "at least 1 MiB)", len, max, L->c->seq_len);
    size_t valid = utf8_valid_prefix(text, len);
    if (valid == len) return 0;
    const char *at = text + valid, *line_start = at;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    while (line_start > L->file && line_start[-1] != '\n') line_start--;
    return bad(L, line, "not valid UTF-8 (byte %zu)", (size_t)(at - line_start) + 1);
}

/* text[0..len) holds one record starting at line `line` of the file. */
static void load_record(Loader *L, const char *text, size_t len, int line) {
    L->d->stats.n_records++;
    if (check_text(L, text, len, line) < 0) return;
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
    if (L->c->preference) {
        L->c_ids.n = L->c_mask.n = 0;
        if (build_pref(L, line, o) == 0) keep_pair(L, line);
    } else if (build_record(L, line, o) == 0) {
        keep_record(L, line);
    }
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
                /* at depth 0: ']' is the array's own, after a bare value; a stray '}' belongs to
                 * this (bad) element, so that every element holds at least one byte and the scan
                 * moves on (it used to end empty there, again and again under skip_bad_records) */
                if (depth == 0) {
                    if (c == ']') break;
                } else if (--depth == 0) {
                    pos++;
                    break;
                }
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

void records_load(Data *d, const char *path, Tokenizer *t, const DataConfig *cfg) {
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
    d->margin = xcalloc(1, sizeof(float));
    size_t n;
    char *s = read_file(path, &n);
    if (!s) user_error("%s: cannot read the data file", path);
    L.file = s;
    size_t pos = 0;
    int line = 1;
    while (pos < n && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\r' || s[pos] == '\n'))
        line += s[pos++] == '\n';
    if (pos < n && s[pos] == '[') load_array(&L, s, n, pos, line);
    else load_lines(&L, s, n);
    free(s);
    tok_ids_free(&L.ids);
    tok_ids_free(&L.mask);
    tok_ids_free(&L.c_ids);
    tok_ids_free(&L.c_mask);
}
