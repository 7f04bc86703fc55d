/* request.c — see request.h. */
#include "generate/request.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- a line's fields ------------------------------------------------------------------- */

/* A line's field; null counts as absent (the default applies), for every field. */
static cJSON *field(const cJSON *o, const char *key) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* v is a JSON number holding an integer in [lo, hi). */
static int json_int_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo && v->valuedouble < hi;
}
/* 2^53 + 1 reads as 2^53: integers of magnitude below 2^53 are the ones a double is sure to hold */
#define EXACT_INT 0x1p53

static float get_num(cJSON *o, const char *key, float dflt, const char *file, int line) {
    cJSON *v = field(o, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v)) user_error("%s:%d: field \"%s\" must be a number", file, line, key);
    return (float)v->valuedouble;
}
static int get_int(cJSON *o, const char *key, int dflt, const char *file, int line) {
    cJSON *v = field(o, key);
    if (!v) return dflt;
    if (!json_int_in(v, -INT_MAX, INT_MAX + 1.0))
        user_error("%s:%d: field \"%s\" must be an integer in [%d, %d]", file, line, key, -INT_MAX, INT_MAX);
    return (int)v->valuedouble;
}
/* A seed is any integer a double is sure to hold exactly, taken modulo 2^64 as the --seed option is:
 * -1 and 2^64 - 1 are the same seed. */
static uint64_t get_seed(cJSON *v, const char *file, int line) {
    if (!json_int_in(v, -EXACT_INT + 1, EXACT_INT))
        user_error("%s:%d: field \"seed\" must be an integer of magnitude below 2^53", file, line);
    return (uint64_t)(int64_t)v->valuedouble;
}

/* See request.h. Numbers are printed exactly: cJSON's own printing rounds to 15 digits, which
 * merges ids such as 9007199254740990 and ...991. */
char *id_text(const cJSON *id, const char *where) {
    if (!cJSON_IsNumber(id)) return cJSON_PrintUnformatted(id);
    double v = id->valuedouble;
    if (!json_int_in(id, -EXACT_INT + 1, EXACT_INT)) user_error("%s: a numeric \"id\" must be an integer of magnitude below 2^53 (use a string)", where);
    char *t = xmalloc(24);
    snprintf(t, 24, "%.0f", v);
    return t;
}

/* ---- stop strings and stop ids ---------------------------------------------------------- */

static void add_stop(char **stops, int *n, const char *s, const char *where) {
    if (!*s) user_error("%s: empty stop string", where);
    if (*n == MAX_STOPS) user_error("%s: more than %d stop strings", where, MAX_STOPS);
    stops[(*n)++] = xstrdup(s);
}
static void parse_stops(char **stops, int *n, const cJSON *v, const char *where) {
    if (cJSON_IsString(v)) { add_stop(stops, n, v->valuestring, where); return; }
    if (!cJSON_IsArray(v)) user_error("%s: \"stop\" must be a string or a list of strings", where);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e)) user_error("%s: \"stop\" must be a string or a list of strings", where);
        add_stop(stops, n, e->valuestring, where);
    }
}
static void parse_stop_ids(Seq *s, const cJSON *v, const char *where, int vocab) {
    if (!cJSON_IsArray(v)) user_error("%s: \"stop_token_ids\" must be a list of token ids", where);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_int_in(e, 0, vocab))
            user_error("%s: \"stop_token_ids\" entries must be token ids in [0, %d)", where, vocab);
        s->stop_ids = xrealloc(s->stop_ids, sizeof(int) * (s->n_stop_ids + 1));
        s->stop_ids[s->n_stop_ids++] = e->valueint;
    }
}

/* See request.h. */
int stops_parse_flag(const char *text, char *stops[MAX_STOPS]) {
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1);
    if (!cJSON_IsArray(j)) { cJSON_Delete(j); j = cJSON_CreateString(text); }
    int n = 0;
    parse_stops(stops, &n, j, "--stop");
    cJSON_Delete(j);
    return n;
}

/* See request.h. */
void stop_ids_parse_flag(const char *text, int vocab, int **ids, int *n) {
    char *list = xstrdup(text), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || end == t || v < 0 || v >= vocab)
            user_error("--stop-token-ids %s: \"%s\" is not a token id in [0, %d)", text, t, vocab);
        *ids = xrealloc(*ids, sizeof(int) * (*n + 1));
        (*ids)[(*n)++] = (int)v;
    }
    free(list);
}

/* See request.h. */
char *stop_find(char *const *stops, int n_stops, char *text, size_t len, size_t before) {
    char *first = NULL;
    for (int k = 0; k < n_stops; k++) {
        size_t sl = strlen(stops[k]), from = before >= sl ? before - sl + 1 : 0;
        char *hit = len >= sl ? memmem(text + from, len - from, stops[k], sl) : NULL;
        if (hit && (!first || hit < first)) first = hit;
    }
    return first;
}

/* ---- EOS ids ---------------------------------------------------------------------------- */

/* EOS ids of generation_config.json (int or list), added to eos[] without duplicates. */
static int add_generation_eos(const char *dir, int *eos, int n_eos) {
    char *path = path_join(dir, "generation_config.json");
    char *text = read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    if (text && !j) user_error("%s: not valid JSON", path);
    cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "eos_token_id") : NULL, *e;
    if (cJSON_IsNull(v)) v = NULL;   /* null: none given, as config.json's reader and HF take it */
    if (v && !cJSON_IsNumber(v) && !cJSON_IsArray(v)) user_error("%s: eos_token_id must be an integer or a list", path);
    cJSON *one = cJSON_IsNumber(v) ? cJSON_CreateIntArray(&v->valueint, 1) : NULL, *list = one ? one : v;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsNumber(e)) user_error("%s: eos_token_id entries must be integers", path);
        int have = 0;
        for (int k = 0; k < n_eos; k++) have |= eos[k] == e->valueint;
        if (!have && n_eos < 2 * MAX_EOS_IDS) eos[n_eos++] = e->valueint;
    }
    cJSON_Delete(one);
    cJSON_Delete(j);
    free(text);
    free(path);
    return n_eos;
}

/* See request.h. */
int eos_ids_load(const char *model_dir, const ModelConfig *cfg, const Tokenizer *tok, int *eos) {
    int n_eos = 0;
    for (int k = 0; k < cfg->n_eos; k++) eos[n_eos++] = cfg->eos_ids[k];
    n_eos = add_generation_eos(model_dir, eos, n_eos);
    if (tok && tokenizer_eos_id(tok) >= 0) {
        int e = tokenizer_eos_id(tok), have = 0;
        for (int k = 0; k < n_eos; k++) have |= eos[k] == e;
        if (!have) eos[n_eos++] = e;
    }
    return n_eos;
}

/* ---- the prompt ------------------------------------------------------------------------- */

/* See request.h. */
char *prompt_tokens(Tokenizer *tok, const cJSON *j, const char *key, const char *chat_template, int no_bos, int vocab,
                    const char *file, int line, TokIds *t) {
    const cJSON *ids = field(j, "input_ids"), *msgs = field(j, "messages"), *text = field(j, key);
    t->n = 0;
    char *given;
    if (ids) {
        if (!cJSON_IsArray(ids)) user_error("%s:%d: field \"input_ids\" must be a list of token ids", file, line);
        const cJSON *e;
        cJSON_ArrayForEach(e, ids) {
            if (!json_int_in(e, 0, vocab))
                user_error("%s:%d: \"input_ids\" entries must be token ids in [0, %d)", file, line, vocab);
            tok_ids_push(t, e->valueint);
        }
        given = cJSON_PrintUnformatted(ids);
    } else if (msgs) {
        if (!tok) user_error("%s:%d: \"messages\" needs a tokenizer in the model directory", file, line);
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            user_error("%s:%d: field \"messages\" must be a non-empty list", file, line);
        int n = cJSON_GetArraySize(msgs);
        ChatMessage *m = xcalloc(n, sizeof(ChatMessage));
        char err[512];
        if (chat_messages_parse(msgs, "messages", "role", "content", m, err, sizeof err) < 0)
            user_error("%s:%d: %s", file, line, err);
        int fmt = chat_format_resolve(tok, chat_template, err, sizeof err);
        if (fmt < 0) user_error("%s:%d: %s", file, line, err);
        TokIds mask = {0};
        if (chat_render(tok, (ChatFormat)fmt, m, n, 1, t, &mask, err, sizeof err))
            user_error("%s:%d: %s", file, line, err);
        tok_ids_free(&mask);
        free(m);
        given = cJSON_PrintUnformatted(msgs);
    } else if (text) {
        if (!cJSON_IsString(text)) user_error("%s:%d: field \"%s\" must be a string", file, line, key);
        if (!tok) user_error("%s:%d: text prompts need a tokenizer in the model directory", file, line);
        unsigned flags = (!no_bos && tokenizer_add_bos_default(tok)) ? TOK_ADD_BOS : 0;
        tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), flags, t, NULL);
        given = cJSON_PrintUnformatted(text);
    } else {
        user_error("%s:%d: field \"%s\" missing (or give \"messages\" or \"input_ids\")", file, line, key);
    }
    if (t->n == 0) user_error("%s:%d: the prompt is empty", file, line);
    return given;
}

/* See request.h. */
void prompt_fit(TokIds *t, int max_new, int max_pos, int truncate, const char *where) {
    if ((long)t->n + max_new <= max_pos) return;   /* long: max_new may be up to INT_MAX */
    if (!truncate)
        user_error("%s: prompt of %d tokens + max_new_tokens %d exceeds max_position_embeddings %d "
                   "(use --truncate to keep the prompt's last tokens)", where, (int)t->n, max_new, max_pos);
    int keep = max_pos - max_new;
    if (keep < 1) user_error("%s: max_new_tokens %d leaves no room for the prompt (max positions %d)", where, max_new, max_pos);
    memmove(t->ids, t->ids + t->n - keep, sizeof(int32_t) * keep);
    t->n = (size_t)keep;
}

/* ---- a line ------------------------------------------------------------------------------ */

/* One line of `path` (its JSON j) into r. */
static void request_parse(Request *r, int index, cJSON *j, const char *path, int line, const RequestDefaults *d,
                          Tokenizer *tok, const ModelConfig *cfg, const int *eos, int n_eos) {
    memset(r, 0, sizeof(*r));
    Seq *s = &r->seq;
    s->index = index;
    char where[600];
    snprintf(where, sizeof where, "%s:%d", path, line);
    r->in_line = line;
    cJSON *id = field(j, "id");
    if (id) r->id_json = id_text(id, where);
    else { r->id_json = xmalloc(16); snprintf(r->id_json, 16, "%d", line); }
    TokIds t = {0};
    r->prompt_json = prompt_tokens(tok, j, d->key, d->chat_template, d->no_bos, cfg->vocab_size, path, line, &t);

    s->sp = d->sp;
    s->sp.temperature = get_num(j, "temperature", d->sp.temperature, path, line);
    s->sp.top_k = get_int(j, "top_k", d->sp.top_k, path, line);
    s->sp.top_p = get_num(j, "top_p", d->sp.top_p, path, line);
    s->sp.min_p = get_num(j, "min_p", d->sp.min_p, path, line);
    s->sp.repetition_penalty = get_num(j, "repetition_penalty", d->sp.repetition_penalty, path, line);
    s->sp.presence_penalty = get_num(j, "presence_penalty", d->sp.presence_penalty, path, line);
    s->sp.frequency_penalty = get_num(j, "frequency_penalty", d->sp.frequency_penalty, path, line);
    cJSON *seed = field(j, "seed");
    /* a sequence's draws depend only on its seed: the line's, else --seed mixed with the line index */
    s->sp.seed = seed ? get_seed(seed, path, line)
                      : d->sp.seed * 0x9E3779B97F4A7C15ull + (uint64_t)s->index + 1;
    const char *bad = sampling_params_check(&s->sp);
    if (bad) user_error("%s: %s", where, bad);
    s->max_new = get_int(j, "max_new_tokens", d->max_new, path, line);
    /* --min-new-tokens yields to a line's smaller max_new_tokens; a line's own min_new_tokens must fit */
    s->min_new = get_int(j, "min_new_tokens", d->min_new < s->max_new ? d->min_new : s->max_new, path, line);
    s->logprobs_n = get_int(j, "logprobs", d->logprobs, path, line);
    if (s->max_new < 1) user_error("%s: max_new_tokens must be >= 1", where);
    if (s->min_new < 0 || s->min_new > s->max_new) user_error("%s: min_new_tokens must be in [0, max_new_tokens]", where);
    if (s->logprobs_n < 0 || s->logprobs_n > 20) user_error("%s: logprobs must be in [0, 20]", where);
    for (int k = 0; k < n_eos && !d->ignore_eos; k++) {
        s->stop_ids = xrealloc(s->stop_ids, sizeof(int) * (s->n_stop_ids + 1));
        s->stop_ids[s->n_stop_ids++] = eos[k];
    }
    /* a line's "stop" / "stop_token_ids" replace --stop / --stop-token-ids (EOS ids stay) */
    cJSON *st = field(j, "stop"), *sti = field(j, "stop_token_ids");
    if (st) parse_stops(r->stops, &r->n_stops, st, where);
    else for (int k = 0; k < d->n_stops; k++) add_stop(r->stops, &r->n_stops, d->stops[k], "--stop");
    if (sti) parse_stop_ids(s, sti, where, cfg->vocab_size);
    else for (int k = 0; k < d->n_stop_ids; k++) {
        s->stop_ids = xrealloc(s->stop_ids, sizeof(int) * (s->n_stop_ids + 1));
        s->stop_ids[s->n_stop_ids++] = d->stop_ids[k];
    }
    if (r->n_stops && !tok) user_error("%s: stop strings need a tokenizer in the model directory", where);

    prompt_fit(&t, s->max_new, cfg->max_pos, d->truncate, where);
    s->n_prompt = (int)t.n;
    s->prompt = xmalloc(sizeof(int) * t.n);
    for (size_t i = 0; i < t.n; i++) s->prompt[i] = t.ids[i];
    tok_ids_free(&t);
    seq_alloc_results(s);
}

/* See request.h. */
void requests_open(RequestReader *rr, const char *path, const RequestDefaults *d, Tokenizer *tok,
                   const ModelConfig *cfg, const int *eos, int n_eos) {
    memset(rr, 0, sizeof(*rr));
    jsonl_open(&rr->rd, path);
    rr->rd.max_positions = cfg->max_pos;
    rr->path = path;
    rr->d = d;
    rr->tok = tok;
    rr->cfg = cfg;
    rr->eos = eos;
    rr->n_eos = n_eos;
}

/* See request.h. */
int requests_next(RequestReader *rr, Request *r) {
    if (rr->eof) return 0;
    cJSON *j = jsonl_next(&rr->rd);
    if (!j) {
        rr->eof = 1;
        if (rr->n == 0) user_error("%s: no prompts", rr->path);
        return 0;
    }
    request_parse(r, rr->n, j, rr->path, rr->rd.line, rr->d, rr->tok, rr->cfg, rr->eos, rr->n_eos);
    cJSON_Delete(j);
    rr->n++;
    return 1;
}

void requests_close(RequestReader *rr) { jsonl_close(&rr->rd); }

void request_free(Request *r) {
    free(r->seq.prompt); free(r->seq.stop_ids); seq_free(&r->seq);
    free(r->id_json); free(r->prompt_json);
    for (int k = 0; k < r->n_stops; k++) free(r->stops[k]);
}
