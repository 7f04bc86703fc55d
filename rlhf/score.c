/* score.c — `tandem rm --score`: the reward of each line of a jsonl ({"prompt","response"},
 * {"text"} or {"messages"}) from a reward model, tokenized as rm trains (BOS + text + EOS; messages:
 * the chat template up to the last assistant turn's end), read at the EOS, the lines in batches over
 * the dp replicas. A line longer than --seq-len or max_position_embeddings keeps its end and is
 * counted.
 * Owns: the scoring and its output file. Does not own: loading (runtime/session.h model_open),
 * training the reward model (rlhf/pref.c). */
#include "rlhf/score.h"
#include "runtime/adapter.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One line's ids, tokenized as in training: [BOS] + encode(prompt + response) + [EOS] (text: the
 * same with the text), messages: chat_render, cut after the last end-of-turn token. */
static void score_tokens(Tokenizer *t, int chat_format, JsonlReader *r, const cJSON *o, TokIds *ids) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *rs = cJSON_GetObjectItemCaseSensitive(o, "response");
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(o, "text"), *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    ids->n = 0;
    if (ms) {
        if (!cJSON_IsArray(ms) || !cJSON_GetArraySize(ms)) user_error("%s:%d: field \"messages\" is not a non-empty list", r->path, r->line);
        int n = cJSON_GetArraySize(ms);
        ChatMessage *m = xcalloc((size_t)n, sizeof(ChatMessage));
        char err[512];
        if (chat_messages_parse(ms, "messages", "role", "content", m, err, sizeof err) < 0)
            user_error("%s:%d: %s", r->path, r->line, err);
        if (chat_format < 0) user_error("%s:%d: messages need a chat template (--chat-template)", r->path, r->line);
        TokIds mask = {0};
        if (chat_render(t, (ChatFormat)chat_format, m, n, 0, ids, &mask, err, sizeof err))
            user_error("%s:%d: %s", r->path, r->line, err);
        while (ids->n > 0 && !mask.ids[ids->n - 1]) ids->n--;   /* ends with the answer's end-of-turn */
        if (!ids->n) user_error("%s:%d: messages: no assistant turn to score", r->path, r->line);
        tok_ids_free(&mask);
        free(m);
        return;
    }
    const char *a = "", *b;
    if (tx) {
        if (!cJSON_IsString(tx)) user_error("%s:%d: field \"text\" is not a string", r->path, r->line);
        b = tx->valuestring;
    } else if (pr || rs) {
        if (!cJSON_IsString(pr)) user_error("%s:%d: field \"prompt\" missing or not a string", r->path, r->line);
        if (!cJSON_IsString(rs)) user_error("%s:%d: field \"response\" missing or not a string", r->path, r->line);
        a = pr->valuestring;
        b = rs->valuestring;
    } else {
        user_error("%s:%d: no \"prompt\"/\"response\", \"text\" or \"messages\" field", r->path, r->line);
    }
    size_t la = strlen(a), lb = strlen(b);
    char *text = xmalloc(la + lb + 1);
    memcpy(text, a, la);
    memcpy(text + la, b, lb + 1);
    if (tokenizer_bos_id(t) >= 0) tok_ids_push(ids, tokenizer_bos_id(t));
    tokenizer_encode(t, text, la + lb, 0, ids, NULL);
    tok_ids_push(ids, tokenizer_eos_id(t));
    free(text);
}

/* Every line of input as its object and token ids (a tail of seq_len kept, after BOS; *n_cut: how
 * many were cut); every rank reads and tokenizes every line. Returns how many. */
static int read_score_lines(Tokenizer *t, int chat_format, const char *input, int seq_len, cJSON ***objs_out,
                            TokIds **ids_out, int *n_cut) {
    JsonlReader r;
    jsonl_open(&r, input);
    int n = 0, cap = 0;
    cJSON **objs = NULL;
    TokIds *ids = NULL;
    *n_cut = 0;
    for (cJSON *o; (o = jsonl_next(&r));) {
        if (n == cap) {
            cap = cap * 2 + 64;
            objs = xrealloc(objs, sizeof(cJSON *) * cap);
            ids = xrealloc(ids, sizeof(TokIds) * cap);
        }
        ids[n] = (TokIds){0};
        score_tokens(t, chat_format, &r, o, &ids[n]);
        if ((int)ids[n].n > seq_len) {   /* keep the end (the answer and its EOS), after BOS */
            size_t cut = ids[n].n - (size_t)seq_len, keep = tokenizer_bos_id(t) >= 0;
            memmove(ids[n].ids + keep, ids[n].ids + keep + cut, sizeof(int32_t) * (ids[n].n - keep - cut));
            ids[n].n = (size_t)seq_len;
            (*n_cut)++;
        }
        objs[n++] = o;
    }
    jsonl_close(&r);
    *objs_out = objs;
    *ids_out = ids;
    return n;
}

/* rew (n) = the value at each line's EOS, batch_size lines per forward, the dp replicas taking turns
 * (the same on every rank after the dp sum) */
static void score_lines(Model *m, const Mesh *mesh, const TokIds *ids, int n, int batch_size, int seq_len, double *rew) {
    int *tok = xmalloc(sizeof(int) * (size_t)batch_size * seq_len), *start = xmalloc(sizeof(int) * (batch_size + 1));
    float *vals = xmalloc(sizeof(float) * (size_t)batch_size * seq_len);
    for (int b0 = 0, k = 0; b0 < n; b0 += batch_size, k++) {
        if (k % mesh->dp != mesh->dp_rank) continue;   /* dp replicas take turns */
        int nb = n - b0 < batch_size ? n - b0 : batch_size, N = 0;
        start[0] = 0;
        for (int i = 0; i < nb; i++) {
            for (size_t j = 0; j < ids[b0 + i].n; j++) tok[N++] = ids[b0 + i].ids[j];
            start[i + 1] = N;
        }
        model_forward(m, tok, start, nb);
        if (m->is_last) m->be->to_host(vals, m->s.logits, sizeof(float) * N);
        comm_broadcast(&mesh->pp_comm, vals, sizeof(float) * N, mesh->pp_comm.size - 1);
        for (int i = 0; i < nb; i++) rew[b0 + i] = vals[start[i + 1] - 1];   /* the value at EOS */
    }
    moe_drain(m);   /* --ep > 1: the replicas ran different numbers of batches (runtime/moe_ep.c) */
    comm_all_reduce_sum_f64(&mesh->dp_comm, rew, n);   /* each line was scored by one dp replica */
    free(tok); free(start); free(vals);
}

/* See score.h. */
int rm_score_main(ModelOpen *mo, const char *input, const char *output, const char *chat_template, int seq_len,
               int batch_size) {
    if (!input || !output) user_error("rm --score: --input and --output are required");
    const char *model_dir = mo->dir;
    ModelConfig cfg;
    config_load(&cfg, model_dir);
    /* a sequence-classification adapter brings its score head: its base may be a causal LM */
    int adapter_head = mo->adapter && adapter_has_score(mo->adapter);
    if (!cfg.score_head && !adapter_head)
        user_error("%s: a causal LM, not a reward model (rm --score needs a *ForSequenceClassification directory, "
                   "e.g. one `tandem rm` saved, or an --adapter with a score head)", model_dir);
    Mesh mesh;
    Model m;
    model_open(mo, &mesh, &m);   /* a causal LM's new head is replaced by the adapter's */
    int len = seq_len < cfg.max_pos ? seq_len : cfg.max_pos;   /* positions the model has */
    char err[1024];
    Tokenizer *t = tokenizer_open(model_dir, err, sizeof err);
    if (!t) user_error("%s", err);
    if (tokenizer_eos_id(t) < 0) user_error("%s: the tokenizer has no EOS token; rewards are read there", model_dir);
    cJSON **objs;
    TokIds *ids;
    int n_cut, n = read_score_lines(t, chat_format_resolve(t, chat_template, err, sizeof err), input, len, &objs, &ids, &n_cut);
    tokenizer_free(t);
    if (!n) user_error("%s: no lines to score", input);
    model_alloc_state(&m, batch_size * len, len);
    double *rew = xcalloc((size_t)n, sizeof(double));
    score_lines(&m, &mesh, ids, n, batch_size, len, rew);
    if (mesh_is_root(&mesh)) {
        size_t used = 0, cap = 1 << 16;
        char *buf = xmalloc(cap);
        for (int i = 0; i < n; i++) {
            cJSON_AddNumberToObject(objs[i], "reward", rew[i]);
            if (m.cfg.has_reward_stats)
                cJSON_AddNumberToObject(objs[i], "reward_normalized", (rew[i] - m.cfg.reward_mean) / m.cfg.reward_std);
            jsonl_append(&buf, &used, &cap, objs[i]);
        }
        if (write_file_atomic(output, buf, used)) user_error("%s: cannot write: %s", output, strerror(errno));
        free(buf);
        if (n_cut)
            fprintf(stderr, "rm --score: %d of %d lines longer than %d tokens (%s) scored on their last %d tokens\n", n_cut,
                    n, len, len < seq_len ? "max_position_embeddings" : "--seq-len", len);
        fprintf(stderr, "scored %d lines -> %s\n", n, output);
    }
    for (int i = 0; i < n; i++) { cJSON_Delete(objs[i]); tok_ids_free(&ids[i]); }
    free(objs); free(ids); free(rew);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
