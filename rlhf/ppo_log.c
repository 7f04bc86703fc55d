/* ppo_log.c — see ppo_log.h. */
#include "rlhf/ppo_log.h"
#include <stdio.h>

const char *const PPO_TIMING_NAMES[N_T] = {"gen", "ref", "reward", "values", "adv", "update_actor", "update_critic", "step"};

void ppo_log_step(MetricsLog *ml, const Roles *rs, const ExperienceMaker *x, const double entropy[2], int step, int steps,
                  int print, const Experience *b, const StepOut *so, double seq_kl, double kl_used) {
    const Role *R = rs->role;
    int S = b->S, N = b->N;
    double resp_len = 0, clipped = 0, rew_sum = 0;
    for (int s = 0; s < S; s++) {
        double r = 0;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) if (b->mask[n] > 0) r += b->rewards[n];
        rew_sum += advantage_kl_in_reward(x->adv_kind) ? r : b->score[s];
        resp_len += b->resp_len[s];
        clipped += b->finish[s] == FINISH_LENGTH;
    }
    const PpoStats *as = &so->as, *cs = &so->cs;
    double na = as->n_tokens > 0 ? as->n_tokens : 1, nc = cs->n_tokens > 0 ? cs->n_tokens : 1;
    double vsum = 0, vn = 0;   /* the critic's values over the actions */
    for (int n = 0; n < N; n++) if (b->mask[n] > 0) { vsum += b->values[n]; vn += 1; }
    metrics_begin(ml, step + 1);
    metrics_num(ml, "critic/score/mean", so->score_raw / S);
    metrics_num(ml, "critic/rewards/mean", rew_sum / S);
    metrics_num(ml, "critic/advantages/mean", masked_mean(b->adv, b->mask, N));
    metrics_num(ml, "critic/returns/mean", masked_mean(b->ret, b->mask, N));
    metrics_num(ml, "critic/values/mean", R[R_CRITIC].active && vn ? vsum / vn : 0.0);
    metrics_num(ml, "actor/pg_loss", as->pg_loss / na);
    metrics_num(ml, "actor/pg_clipfrac", as->pg_clipfrac / na);
    metrics_num(ml, "actor/pg_clipfrac_lower", as->pg_clipfrac_lower / na);
    metrics_num(ml, "actor/ppo_kl", as->ppo_kl / na);
    metrics_num(ml, "actor/entropy", entropy[1] > 0 ? entropy[0] / entropy[1] : 0.0);
    metrics_num(ml, "actor/kl", R[R_REF].active || x->lora_ref ? seq_kl : 0.0);
    metrics_num(ml, "actor/kl_loss", as->kl_loss / na);
    metrics_num(ml, "actor/kl_coef", kl_used);
    if (R[R_TEACHER].active) metrics_num(ml, "actor/teacher_kl", b->teacher_kl);   /* --teacher: mean reverse KL per token */
    metrics_num(ml, "actor/grad_norm", so->gn[0]);
    metrics_num(ml, "critic/vf_loss", cs->vf_loss / nc);
    metrics_num(ml, "critic/vf_clipfrac", cs->vf_clipfrac / nc);
    metrics_num(ml, "critic/vf_explained_var", R[R_CRITIC].active ? explained_variance(b->ret, b->values, b->mask, N) : 0.0);
    metrics_num(ml, "critic/grad_norm", so->gn[1]);
    metrics_num(ml, "response_length/mean", resp_len / S);
    metrics_num(ml, "response_length/clip_ratio", clipped / S);
    metrics_num(ml, "rollout_logprob_diff_max", as->logprob_diff_max);
    if (x->reward_fn) metrics_num(ml, "reward/timeouts", b->n_timed_out);
    if (x->env_cmd || x->env_url) {   /* the batch's episodes (rlhf/episode.h) */
        double turns = 0, model = 0, faults = 0, timeouts = 0;
        for (int s = 0; s < S; s++) {
            turns += b->turns[s];
            faults += b->fault[s] != ENV_OK;
            timeouts += b->fault[s] == ENV_TIMEOUT;
            for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) model += b->targets[n] >= 0;
        }
        metrics_num(ml, "env/turns_mean", turns / S);
        metrics_num(ml, "env/episode_tokens_mean", resp_len / S);
        metrics_num(ml, "env/model_tokens_mean", model / S);
        metrics_num(ml, "env/faults", faults);
        metrics_num(ml, "env/timeouts", timeouts);
    }
    const DrawStats *ds = &so->ds;
    if (x->dynamic_sampling) {   /* verl's num_gen_batches; the groups of equal rewards dropped, and refilled at the cap */
        metrics_num(ml, "dynamic_sampling/num_gen_batches", ds->draws);
        metrics_num(ml, "dynamic_sampling/drop_fraction", ds->drawn ? (double)ds->dropped / ds->drawn : 0.0);
        metrics_num(ml, "dynamic_sampling/filled_groups", ds->filled);
    }
    if (x->overlong_buffer > 0) {   /* the mean overlong penalty, and the fraction of the batch it hit */
        double ol, sum = 0, hit = 0;
        for (int s = 0; s < S; s++) experience_shape_score(x, b, s, b->raw[s], &ol, NULL), sum += ol, hit += ol < 0;
        metrics_num(ml, "critic/overlong_penalty/mean", sum / S);
        metrics_num(ml, "response_length/overlong_ratio", hit / S);
    }
    char key[64];
    for (int k = 0; k < N_T; k++) {
        snprintf(key, sizeof key, "timing_s/%s", PPO_TIMING_NAMES[k]);
        metrics_fmt(ml, key, "%.6f", so->tm[k]);
    }
    metrics_fmt(ml, "samples_per_s", "%.3f", S / (so->tm[T_STEP] > 0 ? so->tm[T_STEP] : 1e-9));
    metrics_end(ml);
    if (print)
        fprintf(stderr, "step %d/%d | score %.4f | pg_loss %.4f | clipfrac %.3f | kl %.4f | vf_loss %.4f | len %.1f | "
                        "logprob diff %g | %.2f s (gen %.2f, update %.2f)",
                step + 1, steps, so->score_raw / S, as->pg_loss / na, as->pg_clipfrac / na, seq_kl, cs->vf_loss / nc,
                resp_len / S, as->logprob_diff_max, so->tm[T_STEP], so->tm[T_GEN], so->tm[T_ACTOR] + so->tm[T_CRITIC]);
    if (print && x->dynamic_sampling)
        fprintf(stderr, " | %d draw(s), %d of %d groups dropped, %d refilled", ds->draws, ds->dropped, ds->drawn, ds->filled);
    if (print) fputc('\n', stderr);
}
