/* ppo_eval.c — see ppo_eval.h. */
#include "rlhf/ppo_eval.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EVAL_CHUNK = 256 };   /* prompts per rollout at most: the eval engine's batch and KV cache */

void ppo_eval_init(PpoEval *e, const ExperienceMaker *x, const Role *actor, int reward_model, int steps, const char *path,
                   const char *key, const char *chat_template, int truncate, const ModelConfig *acfg) {
    memset(e, 0, sizeof *e);
    ExperienceMaker *v = &e->x;
    *v = *x;   /* the run's settings: tokenizer, stops, reward source, max_new */
    v->n_prompts = 0;
    v->prompts = NULL; v->prompt_text = NULL; v->labels = NULL; v->prompt_line = NULL; v->prompt_id = NULL; v->refs = NULL;
    v->lines = NULL;
    v->B = 0;   /* the count is checked below, in the eval's words */
    experience_read_prompts(v, path, key, chat_template, truncate, acfg->vocab_size, acfg->max_pos);
    if (v->n_prompts == 0) user_error("--eval-prompts %s: no prompts", path);
    v->max_len = 0;
    for (int i = 0; i < v->n_prompts; i++) {
        int L = (int)v->prompts[i].n + experience_resp_max(v);
        /* a reward model's forward state is sized for the run's sequences (init_learners) */
        if (reward_model && L > x->max_len)
            user_error("--eval-prompts %s:%d: %d prompt tokens + --max-new-tokens %d exceed the longest --prompts sequence "
                       "(%d tokens), which the reward model is sized for", path, v->prompt_line[i], (int)v->prompts[i].n,
                       experience_resp_max(v), x->max_len);
        if (L > v->max_len) v->max_len = L;
    }
    e->chunk = v->n_prompts < EVAL_CHUNK ? v->n_prompts : EVAL_CHUNK;
    e->n_chunks = (v->n_prompts + e->chunk - 1) / e->chunk;
    /* episode ids (rlhf/episode.h: (step * draws + draw) * S + s) past every id the run's steps use */
    long used = (long)steps * (x->dynamic_sampling ? x->max_draws : 1) * x->B * x->G;
    e->step0 = (int)(used / e->chunk + 1);
    v->B = e->chunk; v->G = 1; v->draw = 0; v->dynamic_sampling = 0;
    sampling_params_default(&v->sp);
    v->sp.temperature = 0;   /* greedy: argmax, no draw */
    v->sp.seed = x->sp.seed;
    if (v->n_stops) {   /* the stop-string scan's per-sequence text, the eval's own */
        v->ts = xcalloc(e->chunk, sizeof(TokStream));
        v->txt = xcalloc(e->chunk, sizeof(char *));
        v->tlen = xcalloc(e->chunk, sizeof(size_t));
        v->tcap = xcalloc(e->chunk, sizeof(size_t));
    }
    v->engine = NULL;
    if (actor->member) {
        int share = (e->chunk + actor->mesh.dp - 1) / actor->mesh.dp;
        EngineConfig ec = {share, 4096, 0, 16, acfg->max_pos, actor->pp, 1, v->n_stops ? experience_stop_on_token : NULL,
                           NULL, v, NULL, share * ((v->max_len + 15) / 16 + 1), 0.0f, 0};
        v->engine = engine_new((Model *)&actor->m, &ec, v->max_len);
    }
    experience_alloc(&e->b, e->chunk, v->max_len, 0);
    e->pidx = xmalloc(sizeof(int) * e->chunk);
}

double ppo_eval_run(PpoEval *e, Roles *rs, int step, const char *when, MetricsLog *ml) {
    ExperienceMaker *v = &e->x;
    int n = v->n_prompts;
    double t0 = now_seconds(), sum = 0, len = 0;
    roles_gather_weights(rs);   /* ZeRO-3: whole weights (each update releases them) */
    for (int c = 0; c < e->n_chunks; c++) {
        int k0 = c * e->chunk, m = n - k0 < e->chunk ? n - k0 : e->chunk;
        /* a short last chunk is padded with its first prompt (scored, not counted): a rollout is B prompts,
         * and its episode ids (s < B) stay apart from the other chunks' */
        for (int i = 0; i < e->chunk; i++) e->pidx[i] = k0 + (i < m ? i : 0);
        experience_rollout(v, rs, e->step0 + e->n_evals * e->n_chunks + c, e->pidx, &e->b);
        experience_reward(v, rs, &e->b, e->pidx);
        for (int s = 0; s < m; s++) sum += e->b.score[s], len += e->b.resp_len[s];
    }
    e->n_evals++;
    double mean = sum / n, secs = now_seconds() - t0;
    if (!strcmp(when, "before")) e->before = mean;
    if (rs->world_rank == 0) {
        if (!strcmp(when, "after"))
            fprintf(stderr, "eval step %d (after): reward_mean %.4f over %d prompts (before %.4f)\n", step, mean, n, e->before);
        else
            fprintf(stderr, "eval step %d%s: reward_mean %.4f over %d prompts\n", step, *when ? " (before)" : "", mean, n);
    }
    if (ml) {
        metrics_begin(ml, step);
        metrics_num(ml, "eval/reward_mean", mean);
        metrics_num(ml, "eval/n", n);
        metrics_num(ml, "eval/response_length/mean", len / n);
        metrics_fmt(ml, "timing_s/eval", "%.6f", secs);
        metrics_end(ml);
    }
    return mean;
}

void ppo_eval_free(PpoEval *e) {
    ExperienceMaker *v = &e->x;
    /* what the copy shares with the run's maker is the run's to free */
    v->rcmd = NULL; v->env = NULL; v->tok = NULL; v->stop_ids = NULL; v->stops = NULL; v->n_stops = 0; v->urls = NULL; v->n_urls = 0;
    experience_maker_free(v);
    experience_free(&e->b);
    free(e->pidx);
}
