/* ppo.c — `tandem ppo`: PPO / GRPO / RLOO with actor, critic, reference and reward as role groups of
 * one job (rlhf/roles.h), and on-policy distillation from a teacher role (rlhf/distill.h). The actor generates with its own training shards (generate/engine.c on
 * the live weights: no copy, no second model), so its rollout logprobs ARE its training logprobs:
 * the first mini-batch of every step asserts it bit for bit (rollout_logprob_diff_max, always 0).
 * One step, every rank running the same control flow (the same collectives in the same order):
 *   1. rollout     experience_rollout                       (rlhf/experience.h); with --dynamic-sampling
 *                  rollouts and rewards until B groups of unequal rewards (rlhf/dynamic_sampling.h)
 *   2. experience  experience_ref / _teacher / _reward / _values
 *   3. advantages  experience_advantages
 *   4. update      actor and critic, each a Learner (train/learner.h) on its own mesh: --ppo-epochs
 *                  passes over shuffled mini-batches, one optimizer step each
 * then the adaptive KL controller, the metrics (verl's names) and checkpoints. --device puts every
 * role's model on one backend (rlhf/roles.c, at any placement); results move between roles as host
 * copies.
 * With --rollout-ranks (rlhf/async.h) the ranks are two sides with collectives of their own
 * (Roles.world), and only the step's 1. differs on the trainer side:
 *   rollout ranks   (after setup) receive weights version v0, then for each batch j: receive the
 *                   versions up to max(j - L, v0), generate batch j (experience_rollout), send it
 *   trainer ranks   (after setup) send version v0; then each step k:
 *     1. rollout     async_take: batch k from the rollout ranks (received now if not yet: the trainer's
 *                    idle time); with --async-lag L >= 1 batch k came from version max(0, k - L)
 *     2. experience  as above, and with L >= 1 the actor's proximal logprobs (experience_prox, timed
 *                    with the reference's pass): decoupled PPO's, and the exactness check where the
 *                    batch is of version k (async_check); with one mini-batch of one epoch the
 *                    update's own forward is the proximal pass (Experience.prox_self), except at
 *                    steps with sequences of version k, whose check needs the pass
 *     3-4.           as above
 *     end            async_end_step: batch k + L received (L >= 1), then version k + 1 sent to the
 *                    rollout ranks if a later batch needs it
 * With L = 0 the batches and weights are the colocated run's, bit for bit; with L >= 1 the rollout
 * ranks generate batch k + L while the trainer ranks train step k.
 * Owns: setup, the step loop, the adaptive KL, --bench-alone; the options and the Ppo struct:
 * rlhf/ppo_options.c; checkpoints and ppo_state.json: rlhf/ppo_checkpoint.c; the metrics line:
 * rlhf/ppo_log.c; --dump-rollouts' records: rlhf/ppo_dump.c; --eval-prompts' held-out eval: rlhf/ppo_eval.c. */
#include "rlhf/ppo.h"
#include "rlhf/ppo_options.h"
#include "train/optim_state.h"
#include "runtime/adapter.h"
#include "runtime/device.h"
#include "runtime/lora.h"
#include "rlhf/ppo_checkpoint.h"
#include "rlhf/ppo_log.h"
#include "kernels/kernels.h"
#include "rlhf/dynamic_sampling.h"
#include "rlhf/episode.h"
#include "rlhf/experience.h"
#include "rlhf/ppo_dump.h"
#include "rlhf/ppo_eval.h"
#include "rlhf/roles.h"
#include "runtime/args.h"
#include "runtime/util.h"
#include "train/learner.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- 4. update ----------------------------------------------------------------------------- */

/* sequences per micro-batch: --micro-batch-size, at most (and by default) a dp rank's share */
static int micro_size(const Ppo *p, const Role *r) {
    int share = p->mini / r->mesh.dp;
    return p->micro > 0 && p->micro < share ? p->micro : share;
}

/* A mini-batch step of role ri whose loss or gradient norm was not finite was not applied
 * (learner_step); the run stops before the step's metrics and checkpoint, naming the step and its
 * prompts (their lines in --prompts). Every rank of the role's mesh gets here together. */
static _Noreturn void stop_non_finite(const Ppo *p, int ri, int step, const int *pidx, int epoch, int k0,
                                      const LearnerStep *r) {
    const ExperienceMaker *x = &p->x;
    char lines[512];
    experience_prompt_lines(x, pidx, lines, sizeof lines);
    user_error("step %d: the %s's update (epoch %d, mini-batch %d): %s is not finite (NaN or inf; lr %g): the update "
               "was not applied and no checkpoint was written after it; the step's prompts: %s lines %s; lower "
               "--%s-lr or check the rewards", step + 1, ROLE_NAMES[ri], epoch + 1, k0 / p->mini + 1, r->non_finite,
               r->lr, x->prompts_path, lines, ROLE_NAMES[ri]);
}

/* One role's update: --ppo-epochs passes over shuffled mini-batches of the batch's sequences, each
 * an optimizer step; a dp replica takes every dp-th sequence of a mini-batch, in micro-batches of
 * --micro-batch-size sequences through 1F1B. Each action weighs as the actor's --loss-agg says
 * (the critic's: token-mean), times dp (optim_step averages over dp). dump (may be NULL): the
 * actor's first epoch keeps its training logprobs there (--dump-rollouts). Returns the mean
 * gradient norm. */
static double update(Ppo *p, int ri, int step, const int *pidx, Experience *b, RolloutDump *dump) {
    Role *r = &p->roles.role[ri];
    int dp = r->mesh.dp, S = b->S, actor = ri == R_ACTOR;
    PpoHook *h = actor ? &p->actor_hook : &p->critic_hook;
    LossHook lh = {actor ? loss_ppo_actor : loss_ppo_critic, h, actor ? p->x.sp.temperature : 1.0f,
                   actor ? (float)p->entropy_coef : 0.0f, actor ? p->entropy : NULL,
                   actor && sampler_truncates(&p->x.sp) ? &p->x.sp : NULL};   /* the rollout's kept sets */
    int micro = micro_size(p, r);
    Minibatch mb;
    minibatch_alloc(&mb, (p->mini / dp + micro - 1) / micro, micro, p->x.max_len);
    if (actor) mb.agg = p->loss_agg, mb.agg_norm = episode_model_tokens_max(&p->x);   /* the critic: token-mean (verl's default) */
    int *perm = xmalloc(sizeof(int) * S);
    double gsum = 0;
    int n_steps = 0;
    for (int e = 0; e < p->ppo_epochs; e++) {
        for (int i = 0; i < S; i++) perm[i] = i;
        uint64_t rs = splitmix64_mix(p->x.seed ^ (0xC0FFEEull + (uint64_t)ri)) + (uint64_t)step * 131 + (uint64_t)e;
        shuffle_ints(perm, S, &rs);
        for (int k0 = 0; k0 < S; k0 += p->mini) {
            int n_mb = experience_minibatch(b, perm, k0, p->mini, dp, r->mesh.dp_rank, actor, e == 0 && k0 == 0, &mb);
            LossHook dh = lh;   /* --dump-rollouts: the first epoch's logprobs caught on their way to the loss */
            if (actor && dump && e == 0) {
                rollout_dump_map(dump, b, perm, k0, p->mini, dp, r->mesh.dp_rank, &mb, n_mb);
                dh.fn = rollout_dump_hook;
                dh.user = dump;
            }
            LearnerStep ls = learner_step(&p->learner[ri], mb.mbs, n_mb, &dh);
            if (ls.non_finite) stop_non_finite(p, ri, step, pidx, e, k0, &ls);
            gsum += ls.grad_norm;
            n_steps++;
        }
    }
    minibatch_free(&mb);
    free(perm);
    return n_steps ? gsum / n_steps : 0.0;
}

/* ---- --bench-alone ----------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return (x > y) - (x < y); }
static float median(float *x, int n) { qsort(x, n, sizeof(float), cmp_float); return x[n / 2]; }


/* Each phase of a step run by itself, `rounds` times on the last step's shapes (a world barrier
 * before each, so nothing overlaps it), against the run's median step: what a step costs beyond
 * its parts. The updates change the weights: run it only after the real steps. */
static void bench_phases_alone(Ppo *p, int step, const int *pidx, Experience *b, int rounds, float *steps, int n_steps) {
    enum { K = 6 };
    static const char *names[K] = {"gen", "ref", "reward", "values", "update_actor", "update_critic"};
    Role *R = p->roles.role;
    float *t = xcalloc((size_t)K * rounds, sizeof(float));
    for (int k = 0; k < rounds; k++) {
        for (int ph = 0; ph < K; ph++) {
            comm_barrier(&p->roles.world);
            double t0 = now_seconds();
            if (ph == 0) roles_gather_weights(&p->roles), experience_rollout(&p->x, &p->roles, step, pidx, b);
            else if (ph == 1) experience_ref(&p->x, &p->roles, b), experience_teacher(&p->x, &p->roles, b);
            else if (ph == 2) experience_reward(&p->x, &p->roles, b, pidx);
            else if (ph == 3) experience_values(&p->x, &p->roles, b);
            else if (ph == 4 && R[R_ACTOR].member) update(p, R_ACTOR, step, pidx, b, NULL);
            else if (ph == 5 && R[R_CRITIC].member) update(p, R_CRITIC, step, pidx, b, NULL);
            comm_barrier(&p->roles.world);
            t[(size_t)ph * rounds + k] = (float)(now_seconds() - t0);
        }
    }
    comm_all_reduce_max(&p->roles.world, t, (size_t)K * rounds);
    if (p->roles.world_rank == 0) {
        double sum = 0;
        fprintf(stdout, "{\"bench\": \"ppo_phases_alone\", \"rounds\": %d, \"median_s\": {", rounds);
        for (int ph = 0; ph < K; ph++) {
            float m = median(t + (size_t)ph * rounds, rounds);
            sum += m;
            fprintf(stdout, "%s\"%s\": %.6f", ph ? ", " : "", names[ph], m);
        }
        float st = median(steps, n_steps);
        fprintf(stdout, "}, \"sum_alone_s\": %.6f, \"step_median_s\": %.6f, \"step_over_sum_alone\": %.4f}\n", sum, st, st / sum);
        fflush(stdout);
    }
    free(t);
    memset(&p->actor_hook.stats, 0, sizeof(PpoStats));
    memset(&p->critic_hook.stats, 0, sizeof(PpoStats));
}

/* ---- setup ------------------------------------------------------------------------------------ */

/* Roles, placement and models: each role's weights (the trained roles' from --resume; with LoRA
 * the base, the adapters come later), the adapters merged into them; resume_dir: the trained
 * roles' checkpoint directories (NULL: none). */
static void open_roles(Ppo *p, PpoOptions *o, const char **resume_dir) {
    Roles *rs = &p->roles;
    Role *R = rs->role;
    int lora = o->t.lora_r > 0, kl = o->kl_coef > 0 || o->kl_loss_coef > 0;
    rs->device = o->t.device;
    /* LoRA without --ref: the reference is the actor's base with its adapters off (no second copy) */
    p->x.lora_ref = lora && !R[R_REF].dir && !o->adapter[R_ACTOR] && kl;
    if (!R[R_REF].dir && !o->adapter[R_REF]) o->adapter[R_REF] = o->adapter[R_ACTOR];   /* the starting policy */
    rs->score_head[R_REWARD] = o->adapter[R_REWARD] && adapter_has_score(o->adapter[R_REWARD]);
    roles_open(rs, kl && !p->x.lora_ref, o->colocate);
    DType dtype[N_ROLES];
    for (int r = 0; r < N_ROLES; r++) {   /* the reference stays the starting weights on resume */
        p->load_dir[r] = R[r].dir;
        dtype[r] = o->t.dtype;
        if (o->t.resume && (r == R_ACTOR || r == R_CRITIC) && R[r].active) resume_dir[r] = path_join(o->t.resume, ROLE_NAMES[r]);
        if (resume_dir[r] && !lora) p->load_dir[r] = resume_dir[r];   /* LoRA: the base, then the adapter */
        /* --dtype auto on resume: a trained role runs at its optimizer state's dtype (weights saved
         * with --save-dtype fp32 are a bf16 run's exact upcast) */
        if (resume_dir[r] && !lora && R[r].member) dtype[r] = optim_state_dtype(resume_dir[r], dtype[r]);
    }
    p->load_dir[R_ROLLOUT] = p->load_dir[R_ACTOR];   /* the actor's weights and dtype (then synced: rlhf/async.h) */
    if (resume_dir[R_ACTOR] && !lora) dtype[R_ROLLOUT] = optim_state_dtype(resume_dir[R_ACTOR], dtype[R_ROLLOUT]);
    roles_load(rs, p->load_dir, dtype);
    const char *merged[N_ROLES];   /* adapters merged: the frozen roles', and a trained role's unless LoRA trains it */
    for (int r = 0; r < N_ROLES; r++)
        merged[r] = (r == R_ACTOR || r == R_CRITIC) && (lora || resume_dir[r]) ? NULL : o->adapter[r];
    roles_merge_adapters(rs, merged);
}

/* The tokenizer, prompts, stops, the reward program, the sizes of a step and the reward
 * normalisation; acfg: the actor's config. */
static void read_inputs(Ppo *p, const PpoOptions *o, ModelConfig *acfg) {
    ExperienceMaker *x = &p->x;
    const Role *R = p->roles.role;
    char err[1024];
    x->tok = tokenizer_open(R[R_ACTOR].dir, err, sizeof err);
    if (!x->tok) user_error("%s", err);
    config_load(acfg, R[R_ACTOR].dir);
    experience_read_prompts(x, o->prompts_path, o->key, o->t.chat_template, o->truncate, acfg->vocab_size, acfg->max_pos);
    experience_stops(x, R[R_ACTOR].dir, acfg, o->stop_json, o->stop_ids);
    x->max_len = 0;
    for (int i = 0; i < x->n_prompts; i++)
        if ((int)x->prompts[i].n + experience_resp_max(x) > x->max_len) x->max_len = (int)x->prompts[i].n + experience_resp_max(x);
    episode_env_open(x, &p->roles, o->env_chat, o->t.chat_template);
    if (x->reward_cmd && p->roles.world_rank == 0) {
        x->rcmd = reward_cmd_start(x->reward_cmd, err, sizeof err);
        if (!x->rcmd) rank_error("%s", err);
    }
    int maxN = x->B * x->G * x->max_len;
    x->fwd_tokens = 8 * x->max_len > 2048 ? 8 * x->max_len : 2048;
    if (x->fwd_tokens > maxN) x->fwd_tokens = maxN;
    x->whiten = !o->no_whiten;
    if (o->normalize_reward && R[R_REWARD].active) {   /* the reward model's saved eval mean / std */
        ModelConfig norm;
        config_load(&norm, R[R_REWARD].dir);
        x->has_norm = norm.has_reward_stats;
        x->norm_mean = norm.reward_mean;
        x->norm_std = norm.reward_std;
        float mu, sd;
        if (o->adapter[R_REWARD] && adapter_reward_stats(o->adapter[R_REWARD], &mu, &sd))
            x->has_norm = 1, x->norm_mean = mu, x->norm_std = sd;   /* a LoRA reward model's */
    }
}

/* Per role: LoRA adapters on the trained roles (seeded by --seed), a run state; the actor and the
 * critic: a Learner each, resumed from resume_dir. */
static void init_learners(Ppo *p, const PpoOptions *o, const char *const *resume_dir) {
    Roles *rs = &p->roles;
    Role *R = rs->role;
    const ExperienceMaker *x = &p->x;
    OptimConfig oc = optim_config_default();
    oc.weight_decay = o->t.wd; oc.clip = o->t.clip; oc.warmup = 0; oc.total_steps = o->steps; oc.zero = o->t.zero;
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].member) continue;
        Model *m = &R[r].m;
        if (o->t.lora_r && (r == R_ACTOR || r == R_CRITIC)) {
            int target[LORA_TARGETS];
            lora_targets_parse("--lora-target", o->t.lora_target, target);
            lora_new(m, o->t.lora_r, o->t.lora_alpha, o->t.lora_rslora, target, (uint64_t)o->t.seed + (uint64_t)r);
            if (resume_dir[r]) lora_load(m, resume_dir[r]);
            else if (o->adapter[r]) lora_load(m, o->adapter[r]);   /* the adapters to continue training */
        }
        if ((r != R_ACTOR && r != R_ROLLOUT) || x->lora_ref || (r == R_ACTOR && p->lag > 0))   /* the forward-only passes' */
            model_alloc_state(m, x->fwd_tokens, x->max_len);
        if (r != R_ACTOR && r != R_CRITIC) continue;
        if (p->mini % R[r].mesh.dp) user_error("--mini-batch-size %d: must be a multiple of the %s's dp %d", p->mini, ROLE_NAMES[r], R[r].mesh.dp);
        oc.lr = r == R_ACTOR ? o->actor_lr : o->critic_lr;
        oc.schedule = r == R_ACTOR ? o->sched : o->critic_sched;
        int micro = micro_size(p, &R[r]), n_mb = (p->mini / R[r].mesh.dp + micro - 1) / micro;
        learner_init(&p->learner[r], m, oc, micro * x->max_len, x->max_len, n_mb, o->t.sp ? TRAIN_SEQ_PARALLEL : 0);
        p->learner[r].save_dtype = o->t.save_dtype;
        if (r == R_ACTOR) train_moe_z_check(o->t.moe_z_coef, &m->cfg);   /* the actor's routers */
        if (r == R_ACTOR) p->learner[r].moe_z_coef = o->t.moe_z_coef;
    }
    if (!o->t.resume) return;
    p->kl_coef = o->state.kl_coef;
    int same = !strcmp(o->state.placement, rs->placement);
    for (int r = R_ACTOR; r <= R_CRITIC; r++)
        if (R[r].member) learner_resume(&p->learner[r], resume_dir[r], same);
    if (rs->world_rank == 0)
        fprintf(stderr, "resuming at step %d from %s%s\n", o->state.step, o->t.resume,
                same ? "" : ": another placement, so the weights, the step and the optimizer states (resharded) continue");
}

/* Everything before the first step: roles and models, inputs, learners, the actor's engine; prints
 * each role's memory plan. acfg: the actor's config. */
static void setup(Ppo *p, PpoOptions *o, ModelConfig *acfg) {
    Role *R = p->roles.role;
    ExperienceMaker *x = &p->x;
    const char *resume_dir[N_ROLES] = {0};
    open_roles(p, o, resume_dir);
    read_inputs(p, o, acfg);
    init_learners(p, o, resume_dir);
    int g = rollout_role(&p->roles);   /* the role that generates */
    if (R[g].member) {
        int share = (x->B * x->G + R[g].mesh.dp - 1) / R[g].mesh.dp;
        EngineConfig ec = {share, 4096, 0, 16, acfg->max_pos, R[g].pp, 1, x->n_stops ? experience_stop_on_token : NULL,
                           NULL, x, NULL, share * ((x->max_len + 15) / 16 + 1), o->temperature, sampler_truncates(&x->sp)};
        x->engine = engine_new(&R[g].m, &ec, x->max_len);
    }
    for (int r = 0; r < N_ROLES; r++) {   /* memory plan per role */
        if (!R[r].member) continue;
        MemPlan plan = model_mem_plan(&R[r].m);
        if (r == R_ACTOR || r == R_CRITIC) learner_mem_plan(&p->learner[r], &plan);
        plan.acts += sizeof(float) * (double)R[r].m.s.n_floats;
        if (r == g) { EngineStats es = engine_stats(x->engine); plan.kv = es.kv_bytes; plan.acts += es.act_bytes; }
        if (mesh_is_root(&R[r].mesh)) fprintf(stderr, "%s: ", ROLE_NAMES[r]);
        model_print_memory_plan(&R[r].m, &plan);
    }
}

static void teardown(Ppo *p) {
    ExperienceMaker *x = &p->x;
    Role *R = p->roles.role;
    for (int r = R_ACTOR; r <= R_CRITIC; r++) if (R[r].member) learner_free(&p->learner[r]);
    experience_maker_free(x);
    roles_free(&p->roles);
}

/* ---- one step ------------------------------------------------------------------------------------ */

/* 1-4 of one step, every rank. dyn: --dynamic-sampling's (NULL: off); dump: --dump-rollouts' (NULL: off). */
static void ppo_step(Ppo *p, int step, int *pidx, Experience *b, StepOut *so, DynamicSampler *dyn, RolloutDump *dump) {
    Roles *rs = &p->roles;
    Role *R = rs->role;
    float *tm = so->tm;
    memset(so, 0, sizeof *so);
    double t0 = now_seconds(), t = t0;
#define LAP(k) do { double t_ = now_seconds(); tm[k] = (float)(t_ - t); t = t_; } while (0)
    roles_gather_weights(rs);   /* ZeRO-3: the trained roles whole for the experience phases */
    if (dyn) {   /* rollouts and rewards until B groups of unequal rewards (rlhf/dynamic_sampling.h) */
        dynamic_sample(dyn, &p->x, rs, step, pidx, b, &so->ds, &tm[T_GEN], &tm[T_REWARD]);
        t = now_seconds();
        experience_ref(&p->x, rs, b);
        experience_teacher(&p->x, rs, b);   /* timed with the reference's pass */
        LAP(T_REF);
    } else {
        if (p->async.on) {   /* from the rollout ranks (rlhf/async.h): a wait that may span their episodes */
            double d = comm_timeout();
            comm_set_timeout(episode_deadline(&p->x, d));
            async_take(&p->async, &p->x, rs, step, pidx, b);
            comm_set_timeout(d);
        }
        else experience_step_prompts(&p->x, step, pidx), experience_rollout(&p->x, rs, step, pidx, b);
        LAP(T_GEN);
        experience_ref(&p->x, rs, b);
        experience_teacher(&p->x, rs, b);   /* timed with the reference's pass */
        /* --async-lag: decoupled PPO's proximal logprobs, a pass of their own unless the update is one
         * mini-batch of one epoch (its forward gives them) and no sequence is of the current version
         * (whose check, proximal == behaviour, needs the pass) */
        if (b->prox_lp) b->prox_self = p->mini == b->S && p->ppo_epochs == 1 && !async_fresh(b, step);
        if (b->prox_lp && !b->prox_self) experience_prox(&p->x, rs, b);
        LAP(T_REF);
        if (p->async.on) async_check(&p->async, b, step);
        experience_reward(&p->x, rs, b, pidx);
        LAP(T_REWARD);
    }
    experience_values(&p->x, rs, b);
    LAP(T_VALUES);
    so->score_raw = experience_advantages(&p->x, b, p->kl_coef, step, pidx);
    if (p->x.mask_truncated) experience_mask_truncated(b);
    LAP(T_ADV);
    memset(&p->actor_hook.stats, 0, sizeof(PpoStats));
    p->entropy[0] = p->entropy[1] = 0;
    memset(&p->critic_hook.stats, 0, sizeof(PpoStats));
    if (dump) memset(dump->train_lp, 0, sizeof(float) * b->N);
    if (R[R_ACTOR].member) so->gn[0] = update(p, R_ACTOR, step, pidx, b, dump);
    LAP(T_ACTOR);
    if (R[R_CRITIC].member) so->gn[1] = update(p, R_CRITIC, step, pidx, b, NULL);
    LAP(T_CRITIC);
#undef LAP
    so->as = p->actor_hook.stats;
    so->cs = p->critic_hook.stats;
    if (R[R_ACTOR].member) {   /* the entropy (last stage; dp sum) to every rank */
        comm_all_reduce_sum_f64(&R[R_ACTOR].mesh.dp_comm, p->entropy, 2);
        comm_broadcast(&R[R_ACTOR].mesh.pp_comm, p->entropy, sizeof p->entropy, R[R_ACTOR].mesh.pp_comm.size - 1);
    }
    comm_broadcast(&rs->world, p->entropy, sizeof p->entropy, R[R_ACTOR].root);
    roles_share_stats(rs, &R[R_ACTOR], &so->as);
    if (dump) rollout_dump_share(dump, rs, b);
    comm_broadcast(&rs->world, &so->gn[0], sizeof(double), R[R_ACTOR].root);
    if (R[R_CRITIC].active) {
        roles_share_stats(rs, &R[R_CRITIC], &so->cs);
        comm_broadcast(&rs->world, &so->gn[1], sizeof(double), R[R_CRITIC].root);
    }
    double d = comm_timeout();   /* --rollout-ranks: the next batches in (a wait that may span episodes), the new weights out */
    comm_set_timeout(episode_deadline(&p->x, d));
    async_end_step(&p->async, rs, step);
    comm_set_timeout(d);
    so->async_on = p->async.on;
    so->async = p->async.st;
    tm[T_STEP] = (float)(now_seconds() - t0);
    comm_all_reduce_max(&rs->world, tm, N_T);   /* a role's phase as long as its slowest rank */
    int actions = 0;   /* episodes all ended at reset (faults) have none: nothing to check */
    for (int n = 0; n < b->N && !actions; n++) actions = b->targets[n] >= 0;
    if (so->as.logprob_diff_max != 0 || (so->as.n_checked == 0 && actions))
        user_error("step %d: the actor's training logprobs differ from its rollout logprobs (max |diff| %.3g over %.0f "
                   "tokens): the one-engine guarantee is broken", step + 1, so->as.logprob_diff_max, so->as.n_checked);
}

/* The adaptive KL controller (Ziegler et al.): the batch's mean per-sequence KL against the
 * target, over the sequences in the loss (--mask-truncated leaves some out). Returns that KL. */
static double kl_control(Ppo *p, const Experience *b) {
    double seq_kl = 0;
    int n_seq = 0;
    for (int s = 0; s < b->S; s++) {
        double k = 0;
        int c = 0;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) if (b->mask[n] > 0) k += b->kl[n], c++;
        seq_kl += c ? k / c : 0;
        n_seq += c > 0 || b->resp_len[s] == 0;
    }
    seq_kl /= n_seq ? n_seq : 1;
    if (p->kl_target > 0 && (p->roles.role[R_REF].active || p->x.lora_ref)) {
        double e = seq_kl / p->kl_target - 1;
        e = e < -0.2 ? -0.2 : e > 0.2 ? 0.2 : e;
        p->kl_coef *= 1 + e * b->S / p->kl_horizon;
    }
    return seq_kl;
}

/* ---- the command ------------------------------------------------------------------------------ */

/* The checkpoint after `step` steps, with --async-lag's in-flight batches */
static void save(Ppo *p, const PpoOptions *o, int step) {
    int n;
    size_t bytes = 0;
    char *inflight = async_inflight(&p->async, step, &n, &bytes);
    ppo_checkpoint_save(&p->roles, p->learner, p->load_dir, o->t.out, step, p->kl_coef, p->x.seed, o->t.save_limit, inflight, bytes);
    free(inflight);
}

/* --eval-prompts' held-out eval on the actor's ranks (rlhf/ppo_eval.h), scored by the run's own
 * reward (a reward model's buffers bound its sequences); NULL without the option. */
static PpoEval *eval_open(Ppo *p, const PpoOptions *o, const ModelConfig *acfg) {
    if (!o->t.eval_path) return NULL;
    const ExperienceMaker *x = &p->x;
    PpoEval *ev = xmalloc(sizeof *ev);
    ppo_eval_init(ev, x, &p->roles.role[R_ACTOR], p->roles.role[R_REWARD].active && !x->reward_cmd && !x->n_urls &&
                  !x->reward_fn, o->steps, o->t.eval_path, o->key, o->t.chat_template, o->truncate, acfg);
    return ev;
}

/* The rollout ranks' whole run (--rollout-ranks, rlhf/async.h): batches until the last step, then out. */
static void rollout_side(Ppo *p) {
    async_rollout_loop(&p->async, &p->x, &p->roles);
    comm_barrier(&p->roles.world);
    async_close(&p->async);
    teardown(p);
    comm_finalize();
}

int ppo_main(int argc, char **argv) {
    Ppo p;
    PpoOptions o;
    memset(&p, 0, sizeof p);
    memset(&o, 0, sizeof o);
    int n_opts;
    Option *opts = ppo_parse_options(&p, &o, &n_opts, argc, argv);
    ModelConfig acfg;
    setup(&p, &o, &acfg);
    ExperienceMaker *x = &p.x;
    PpoEval *ev = eval_open(&p, &o, &acfg);   /* --eval-prompts (NULL without) */
    int S = x->B * x->G, world0 = p.roles.world_rank == 0;
    int step0 = o.t.resume ? o.state.step : 0, last = o.t.stop_after > 0 && o.t.stop_after < o.steps ? o.t.stop_after : o.steps;
    async_open(&p.async, &p.roles, p.lag, S, x->max_len, step0, last, o.steps, o.t.resume);
    async_initial_sync(&p.async, &p.roles);
    if (p.roles.role[R_ROLLOUT].member) {   /* the rollout ranks' run (rlhf/async.h) */
        rollout_side(&p);
        free(opts);
        return 0;
    }
    if (world0) {
        args_print(opts, n_opts);
        fprintf(stderr, "%d prompts; %d steps of %d prompts x %d samples, %d mini-batch(es) x %d epoch(s)\n", x->n_prompts,
                o.steps, x->B, x->G, S / p.mini, p.ppo_epochs);
    }
    Experience b;
    experience_alloc(&b, S, x->max_len, p.roles.role[R_REF].active || x->lora_ref);
    if (p.roles.role[R_TEACHER].active) b.teacher_lp = xmalloc(sizeof(float) * (size_t)S * x->max_len);
    if (p.lag > 0) b.prox_lp = xmalloc(sizeof(float) * (size_t)S * x->max_len);
    int *pidx = xmalloc(sizeof(int) * x->B);
    if (world0) {
        mkdir_p(o.t.out);
        trainer_remove_stale_tmp(o.t.out);
    }
    MetricsLog ml;
    metrics_open(&ml, o.t.out, o.t.tensorboard, o.t.resume ? o.state.step : -1, world0);
    DynamicSampler dyn;
    if (x->dynamic_sampling) dynamic_sampler_alloc(&dyn, x);
    RolloutDump dump;
    if (o.dump_path) rollout_dump_open(&dump, o.dump_path, o.t.resume ? o.state.step : -1, world0, &p.actor_hook, S, x->max_len);
    if (o.dump_path) dump.versions = p.async.on;
    double t_run = now_seconds();
    float *step_s = xcalloc(last + 1, sizeof(float));
    int every = o.t.eval_every;
    /* resumed, the uninterrupted run has an eval line at step0 only as an --eval-every step (as trainer.c) */
    if (ev) ppo_eval_run(ev, &p.roles, step0, "before", !o.t.resume || (every > 0 && step0 % every == 0 && step0 != last) ? &ml : NULL);
    for (int step = step0; step < last; step++) {
        StepOut so;
        ppo_step(&p, step, pidx, &b, &so, x->dynamic_sampling ? &dyn : NULL, o.dump_path ? &dump : NULL);
        if (o.dump_path) rollout_dump_write(&dump, x, &b, step, pidx);
        step_s[step] = so.tm[T_STEP];
        double kl_used = p.kl_coef, seq_kl = kl_control(&p, &b);
        if (world0) ppo_log_step(&ml, &p.roles, &p.x, p.entropy, step, o.steps, (step + 1) % o.t.log_every == 0 || step + 1 == last, &b, &so, seq_kl, kl_used);
        if (ev && every > 0 && (step + 1) % every == 0 && step + 1 != last) ppo_eval_run(ev, &p.roles, step + 1, "", &ml);
        if (o.t.save_every > 0 && (step + 1) % o.t.save_every == 0 && step + 1 != last) save(&p, &o, step + 1);
    }
    if (ev) ppo_eval_run(ev, &p.roles, last, "after", &ml);
    if (o.bench_alone > 0 && last > step0) bench_phases_alone(&p, last - 1, pidx, &b, o.bench_alone, step_s + step0, last - step0);
    save(&p, &o, last);
    if (o.t.merge) ppo_checkpoint_merge(&p.roles, p.load_dir, o.t.out, last, o.t.save_dtype);
    comm_barrier(&p.roles.world);
    if (world0)
        fprintf(stderr, "ppo: %d steps in %.1f s; actor%s in %s/checkpoint-%d; peak RSS %.1f MiB\n", last - step0,
                now_seconds() - t_run, p.roles.role[R_CRITIC].active ? " and critic" : "", o.t.out, last, peak_rss_mib());
    metrics_close(&ml);
    if (o.dump_path) rollout_dump_close(&dump);
    if (x->dynamic_sampling) dynamic_sampler_free(&dyn);
    async_close(&p.async);
    if (ev) ppo_eval_free(ev), free(ev);
    free(step_s); free(pidx); free(opts);
    experience_free(&b);
    teardown(&p);
    comm_finalize();
    return 0;
}
