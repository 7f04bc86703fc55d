/* ppo.c — `tandem ppo`: PPO / GRPO / RLOO with actor, critic, reference and reward as role groups of
 * one job (rlhf/roles.h). The actor generates with its own training shards (generate/engine.c on
 * the live weights: no copy, no second model), so its rollout logprobs ARE its training logprobs:
 * the first mini-batch of every step asserts it bit for bit (rollout_logprob_diff_max, always 0).
 * One step, every rank running the same control flow (the same collectives in the same order):
 *   1. rollout     experience_rollout                       (rlhf/experience.h)
 *   2. experience  experience_ref / _reward / _values
 *   3. advantages  experience_advantages
 *   4. update      actor and critic, each a Learner (train/learner.h) on its own mesh: --ppo-epochs
 *                  passes over shuffled mini-batches, one optimizer step each
 * then the adaptive KL controller, the metrics (verl's names) and checkpoints. --device puts every
 * role's model on one backend, at any role layout (rlhf/roles.h roles_place); results move
 * between roles as host copies.
 * Owns: the options, setup, the step loop, the adaptive KL, --bench-alone; checkpoints and
 * ppo_state.json: rlhf/ppo_checkpoint.c; the metrics line: rlhf/ppo_log.c. */
#include "rlhf/ppo.h"
#include "runtime/adapter.h"
#include "runtime/device.h"
#include "runtime/lora.h"
#include "rlhf/ppo_checkpoint.h"
#include "rlhf/ppo_log.h"
#include "kernels/kernels.h"
#include "rlhf/experience.h"
#include "rlhf/reward_http.h"
#include "rlhf/roles.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include "train/learner.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>


/* The options that only setup reads (the rest go straight into Ppo). */
typedef struct {
    const char *stop_ids, *critic_sched_name, *stop_json, *reward_urls, *prompts_path, *out, *resume, *key, *tensorboard;
    const char *chat_template, *colocate, *kl_est, *adv_name, *sched_name, *dtype_name, *save_dtype_name, *device;
    int bench_alone, steps, threads, truncate, no_std_norm, top_k, seed, log_every, save_every, stop_after, overwrite;
    int no_whiten, normalize_reward, sp, zero;
    int lora_r, lora_rslora, merge;      /* LoRA on the actor and the critic (runtime/lora.h) */
    const char *adapter[N_ROLES];        /* --ROLE-adapter: a PEFT adapter on that role's model */
    float lora_alpha, lora_dropout;
    const char *lora_target;
    float temperature, top_p, kl_coef, kl_target, kl_horizon, reward_clip, eos_penalty, gamma, lambda, clip_eps,
        clip_high, dual_clip, entropy_coef, kl_loss_coef, value_clip, actor_lr, critic_lr, wd, clip, timeout, comm_timeout;
    LrSchedule sched, critic_sched;
    DType dtype, save_dtype;
    PpoState state;        /* --resume's ppo_state.json */
} PpoOptions;

typedef struct {
    Roles roles;
    ExperienceMaker x;
    Learner learner[2];                  /* [R_ACTOR], [R_CRITIC] on their members */
    int ppo_epochs, mini, micro;         /* update: passes, sequences per optimizer step, per micro-batch */
    PpoHook actor_hook, critic_hook;
    double entropy_coef, entropy[2];     /* the actor's entropy bonus; the step's entropy sum and count */
    double kl_coef, kl_target, kl_horizon;   /* the KL penalty and its adaptive controller */
    const char *load_dir[N_ROLES];       /* where each role's weights were read (--resume: the checkpoint's) */
    int save_limit;                      /* --save-total-limit */
} Ppo;


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
 * --micro-batch-size sequences through 1F1B. Each action weighs dp / (actions in the mini-batch)
 * (token-mean; optim_step averages over dp). Returns the mean gradient norm. */
static double update(Ppo *p, int ri, int step, const int *pidx, Experience *b) {
    Role *r = &p->roles.role[ri];
    int dp = r->mesh.dp, S = b->S, actor = ri == R_ACTOR;
    PpoHook *h = actor ? &p->actor_hook : &p->critic_hook;
    LossHook lh = {actor ? loss_ppo_actor : loss_ppo_critic, h, actor ? p->x.sp.temperature : 1.0f,
                   actor ? (float)p->entropy_coef : 0.0f, actor ? p->entropy : NULL};
    int micro = micro_size(p, r);
    Minibatch mb;
    minibatch_alloc(&mb, (p->mini / dp + micro - 1) / micro, micro, p->x.max_len);
    int *perm = xmalloc(sizeof(int) * S);
    double gsum = 0;
    int n_steps = 0;
    for (int e = 0; e < p->ppo_epochs; e++) {
        for (int i = 0; i < S; i++) perm[i] = i;
        uint64_t rs = splitmix64_mix(p->x.seed ^ (0xC0FFEEull + (uint64_t)ri)) + (uint64_t)step * 131 + (uint64_t)e;
        shuffle_ints(perm, S, &rs);
        for (int k0 = 0; k0 < S; k0 += p->mini) {
            int n_mb = experience_minibatch(b, perm, k0, p->mini, dp, r->mesh.dp_rank, actor, e == 0 && k0 == 0, &mb);
            LearnerStep ls = learner_step(&p->learner[ri], mb.mbs, n_mb, &lh);
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
            else if (ph == 1) experience_ref(&p->x, &p->roles, b);
            else if (ph == 2) experience_reward(&p->x, &p->roles, b, pidx);
            else if (ph == 3) experience_values(&p->x, &p->roles, b);
            else if (ph == 4 && R[R_ACTOR].member) update(p, R_ACTOR, step, pidx, b);
            else if (ph == 5 && R[R_CRITIC].member) update(p, R_CRITIC, step, pidx, b);
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

/* ---- options and setup ------------------------------------------------------------------------ */

/* Parses and checks the options into o and p; returns the table (for the echo). */
static Option *parse_options(Ppo *p, PpoOptions *o, int *n_opts, int argc, char **argv) {
    Role *R = p->roles.role;
    Option opts[] = {
        {"--actor", OPT_MODEL, &R[R_ACTOR].dir, NULL, "the policy to train (HF causal LM, e.g. an SFT checkpoint)"},
        {"--critic", OPT_MODEL, &R[R_CRITIC].dir, NULL, "value model: a reward-model or causal-LM directory (gae only)"},
        {"--reward", OPT_MODEL, &R[R_REWARD].dir, NULL, "reward model directory (*ForSequenceClassification)"},
        {"--actor-adapter", OPT_STR, &o->adapter[R_ACTOR], NULL, "a PEFT adapter on --actor: merged, or with --lora-r the adapters to train on"},
        {"--critic-adapter", OPT_STR, &o->adapter[R_CRITIC], NULL, "a PEFT adapter on --critic (as --actor-adapter)"},
        {"--ref-adapter", OPT_STR, &o->adapter[R_REF], NULL, "a PEFT adapter merged into --ref (default: --actor-adapter without --ref)"},
        {"--reward-adapter", OPT_STR, &o->adapter[R_REWARD], NULL, "a PEFT adapter merged into --reward (a sequence-classification adapter's score head too)"},
        {"--reward-cmd", OPT_STR, &p->x.reward_cmd, NULL, "instead of --reward: a program speaking jsonl (rlhf/reward_cmd.h)"},
        {"--reward-url", OPT_STR, &o->reward_urls, NULL, "instead: reward servers URL[,URL...] (OpenRLHF's remote RM protocol)"},
        {"--reward-timeout", OPT_FLOAT, &o->timeout, "600", "--reward-cmd / --reward-url: seconds to wait for a batch's replies (0 = no limit)"},
        {"--reward-retries", OPT_INT, &p->x.reward_retries, "3", "--reward-url: retries (with backoff) on connection errors, 429, 5xx"},
        {"--ref", OPT_MODEL, &R[R_REF].dir, NULL, "reference for the KL (default: the actor's starting weights, frozen)"},
        {"--prompts", OPT_STR, &o->prompts_path, NULL, "jsonl: \"prompt\" | \"messages\" | \"input_ids\", optional \"label\""},
        {"--input-key", OPT_STR, &o->key, "prompt", "the text prompt's field"},
        {"--chat-template", OPT_STR, &o->chat_template, NULL, "chat format for messages (default: the tokenizer's)"},
        {"--truncate", OPT_FLAG, &o->truncate, NULL, "keep the last tokens of prompts too long for the positions"},
        {"--out", OPT_STR, &o->out, NULL, "output directory: actor/ and critic/ at the end, metrics.jsonl"},
        {"--overwrite", OPT_FLAG, &o->overwrite, NULL, "allow an existing --out"},
        {"--resume", OPT_STR, &o->resume, NULL, "continue from out/checkpoint-STEP (at any placement; bit for bit at the same)"},
        TENSORBOARD_OPTION(&o->tensorboard),
        {"--steps", OPT_INT, &o->steps, "10", "PPO steps (each: rollout, experience, update)"},
        {"--stop-after", OPT_INT, &o->stop_after, "0", "stop after this step (0 = off)"},
        {"--save-every", OPT_INT, &o->save_every, "0", "steps between saved models (0 = only at the end)"},
        {"--save-total-limit", OPT_INT, &p->save_limit, "0", "keep only the newest N complete checkpoints (0 = all)"},
        {"--log-every", OPT_INT, &o->log_every, "1", "steps between progress lines"},
        {"--rollout-batch-size", OPT_INT, &p->x.B, "8", "prompts per step"},
        {"--n-samples-per-prompt", OPT_INT, &p->x.G, "1", "responses per prompt (the group of grpo / rloo)"},
        {"--max-new-tokens", OPT_INT, &p->x.max_new, "32", "response length at most"},
        {"--stop", OPT_STR, &o->stop_json, NULL, "stop string, or a JSON list of them: the response ends with the token completing one"},
        {"--stop-token-ids", OPT_STR, &o->stop_ids, NULL, "comma-separated ids that also end a response (besides EOS)"},
        {"--bench-alone", OPT_INT, &o->bench_alone, "0", "after the run: each phase alone this many times on the last step's shapes (a JSON line)"},
        {"--temperature", OPT_FLOAT, &o->temperature, "1.0", "sampling temperature (> 0); the policy is softmax(logits / T)"},
        {"--top-k", OPT_INT, &o->top_k, "0", "sampling top-k (0 = off)"},
        {"--top-p", OPT_FLOAT, &o->top_p, "1.0", "sampling top-p"},
        {"--seed", OPT_INT, &o->seed, "1234", "prompt order, sampling and mini-batch shuffles"},
        {"--advantage", OPT_STR, &o->adv_name, "gae", "gae | grpo | rloo"},
        {"--no-std-norm", OPT_FLAG, &o->no_std_norm, NULL, "grpo: do not divide by the group's std (Dr. GRPO)"},
        {"--no-whiten", OPT_FLAG, &o->no_whiten, NULL, "gae: do not whiten the advantages over the batch"},
        {"--kl-coef", OPT_FLOAT, &o->kl_coef, "0.001", "KL penalty in the reward (0 = off)"},
        {"--kl-estimator", OPT_STR, &o->kl_est, "k1", "k1 | k2 | k3"},
        {"--kl-target", OPT_FLOAT, &o->kl_target, "0", "adaptive KL controller's target (0 = fixed --kl-coef)"},
        {"--kl-horizon", OPT_FLOAT, &o->kl_horizon, "10000", "adaptive KL controller's horizon"},
        {"--kl-loss-coef", OPT_FLOAT, &o->kl_loss_coef, "0", "KL (k3) to the reference in the actor's loss (GRPO)"},
        {"--reward-clip", OPT_FLOAT, &o->reward_clip, "0", "clip scores to [-x, x] (0 = off)"},
        {"--missing-eos-penalty", OPT_FLOAT, &o->eos_penalty, "0", "subtracted from the score of a response cut off without EOS"},
        {"--normalize-reward", OPT_FLAG, &o->normalize_reward, NULL, "(score - mean) / std by the reward model's saved stats"},
        {"--gamma", OPT_FLOAT, &o->gamma, "1.0", "GAE discount"},
        {"--lambda", OPT_FLOAT, &o->lambda, "0.95", "GAE lambda"},
        {"--ppo-epochs", OPT_INT, &p->ppo_epochs, "1", "passes over each step's batch"},
        {"--mini-batch-size", OPT_INT, &p->mini, "0", "sequences per optimizer step (0 = the whole batch)"},
        {"--micro-batch-size", OPT_INT, &p->micro, "0", "sequences per micro-batch (0 = a dp rank's whole share)"},
        {"--clip-eps", OPT_FLOAT, &o->clip_eps, "0.2", "policy ratio clip"},
        {"--clip-eps-high", OPT_FLOAT, &o->clip_high, "0", "upper ratio clip (DAPO clip-higher; 0 = --clip-eps)"},
        {"--dual-clip", OPT_FLOAT, &o->dual_clip, "0", "dual-clip constant c > 1 for negative advantages (0 = off)"},
        {"--entropy-coef", OPT_FLOAT, &o->entropy_coef, "0", "entropy bonus in the actor's loss (token-mean, at the temperature)"},
        {"--value-clip", OPT_FLOAT, &o->value_clip, "0.2", "value clip around the rollout's values"},
        {"--actor-lr", OPT_FLOAT, &o->actor_lr, "1e-6", "actor learning rate"},
        {"--critic-lr", OPT_FLOAT, &o->critic_lr, "1e-5", "critic learning rate"},
        {"--lr-schedule", OPT_STR, &o->sched_name, "constant", "the actor's: cosine | linear | constant"},
        {"--critic-lr-schedule", OPT_STR, &o->critic_sched_name, NULL, "the critic's (default: --lr-schedule)"},
        {"--weight-decay", OPT_FLOAT, &o->wd, "0.0", "AdamW weight decay"},
        {"--clip", OPT_FLOAT, &o->clip, "1.0", "gradient-norm clipping (0 = off)"},
        {"--colocate", OPT_STR, &o->colocate, NULL, "roles sharing ranks: all, or sets like actor,ref:critic,reward"},
        {"--actor-ranks", OPT_INT, &R[R_ACTOR].count, "0", "ranks of the actor's group"},
        {"--critic-ranks", OPT_INT, &R[R_CRITIC].count, "0", "ranks of the critic's group"},
        {"--ref-ranks", OPT_INT, &R[R_REF].count, "0", "ranks of the reference's group"},
        {"--reward-ranks", OPT_INT, &R[R_REWARD].count, "0", "ranks of the reward model's group"},
        {"--actor-tp", OPT_INT, &R[R_ACTOR].tp, "1", ""}, {"--actor-pp", OPT_INT, &R[R_ACTOR].pp, "1", ""},
        SEQ_PARALLEL_OPTION(&o->sp), ZERO_OPTION(&o->zero), TRAIN_LORA_OPTIONS(o),
        {"--critic-tp", OPT_INT, &R[R_CRITIC].tp, "1", ""}, {"--critic-pp", OPT_INT, &R[R_CRITIC].pp, "1", ""},
        {"--ref-tp", OPT_INT, &R[R_REF].tp, "1", ""}, {"--ref-pp", OPT_INT, &R[R_REF].pp, "1", ""},
        {"--reward-tp", OPT_INT, &R[R_REWARD].tp, "1", ""}, {"--reward-pp", OPT_INT, &R[R_REWARD].pp, "1", ""},
        THREADS_OPTION(&o->threads), DTYPE_OPTION(&o->dtype_name), SAVE_DTYPE_OPTION(&o->save_dtype_name),
        DEVICE_OPTION(&o->device), COMM_TIMEOUT_OPTION(&o->comm_timeout),
    };
    *n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem ppo --actor DIR [--critic DIR] (--reward DIR | --reward-cmd CMD) [--ref DIR] --prompts FILE --out DIR [options]",
               opts, *n_opts, argc, argv);
    comm_set_timeout(o->comm_timeout);
    if (!R[R_ACTOR].dir || !o->prompts_path || !o->out) user_error("ppo: --actor, --prompts and --out are required");
    if ((R[R_REWARD].dir != NULL) + (p->x.reward_cmd != NULL) + (o->reward_urls != NULL) != 1)
        user_error("ppo: give exactly one of --reward DIR, --reward-cmd CMD and --reward-url URL[,URL...]");
    if (p->save_limit < 0) user_error("--save-total-limit %d: must be >= 0", p->save_limit);
    if (p->x.reward_retries < 0) user_error("--reward-retries %d: must be >= 0", p->x.reward_retries);
    if (o->reward_urls) p->x.n_urls = reward_http_parse_urls(o->reward_urls, &p->x.urls);
    p->x.adv_kind = advantage_kind_parse("--advantage", o->adv_name);
    if (p->x.adv_kind == ADV_GAE && !R[R_CRITIC].dir) user_error("--advantage gae needs --critic (or use grpo / rloo)");
    if (p->x.adv_kind != ADV_GAE && R[R_CRITIC].dir) user_error("--critic: --advantage %s uses no critic", o->adv_name);
    if (p->x.adv_kind == ADV_RLOO && p->x.G < 2) user_error("--advantage rloo needs --n-samples-per-prompt >= 2");
    /* a group of one sample is its own mean: advantage 0 for every token, so nothing would be trained */
    if (p->x.adv_kind == ADV_GRPO && p->x.G < 2)
        user_error("--advantage grpo needs --n-samples-per-prompt >= 2 (a group of 1 has advantage 0: nothing would be trained)");
    p->x.kl_est = kl_estimator_parse("--kl-estimator", o->kl_est);
    if (!(o->temperature > 0)) user_error("--temperature %g: must be > 0 (the policy is softmax(logits / T))", o->temperature);
    if (p->x.B < 1 || p->x.G < 1 || p->x.max_new < 1 || o->steps < 1 || p->ppo_epochs < 1 || o->threads < 0)
        user_error("ppo: --rollout-batch-size, --n-samples-per-prompt, --max-new-tokens, --steps, --ppo-epochs, --threads must be >= 1");
    if (!(o->kl_coef >= 0) || !(o->kl_loss_coef >= 0) || !(o->reward_clip >= 0) || !(o->kl_target >= 0) || !(o->kl_horizon > 0))
        user_error("ppo: --kl-coef, --kl-loss-coef, --reward-clip, --kl-target must be >= 0, --kl-horizon > 0");
    if (!(o->gamma >= 0 && o->gamma <= 1) || !(o->lambda >= 0 && o->lambda <= 1)) user_error("ppo: --gamma and --lambda must be in [0, 1]");
    if (!(o->clip_eps > 0 && o->clip_eps < 1) || o->clip_high < 0 || !(o->value_clip > 0)) user_error("ppo: --clip-eps in (0, 1), --clip-eps-high >= 0, --value-clip > 0");
    if (o->dual_clip != 0 && !(o->dual_clip > 1)) user_error("--dual-clip %g: must be > 1 (or 0 = off)", o->dual_clip);
    if (o->sp && R[R_ACTOR].tp < 2 && R[R_CRITIC].tp < 2)
        user_error("--sequence-parallel: needs --actor-tp or --critic-tp > 1 (it shares a trained role's tp ranks' rows)");
    if (!(o->actor_lr > 0) || !(o->critic_lr > 0)) user_error("ppo: --actor-lr and --critic-lr must be > 0");
    if (o->zero < 0 || o->zero > 3) user_error("--zero %d: must be 0, 1, 2 or 3", o->zero);
    if (o->merge && !o->lora_r) user_error("--merge: merges LoRA adapters; give --lora-r");
    if (o->merge && o->zero == 3) user_error("--merge with --zero 3: the merge needs the whole weights (merge from the checkpoint with --adapter)");
    for (int r = 0; r < N_ROLES; r++)
        if (o->adapter[r] && !dir_exists(o->adapter[r]))
            user_error("--%s-adapter %s: not a directory (a PEFT adapter directory: adapter_config.json and "
                       "adapter_model.safetensors)", ROLE_NAMES[r], o->adapter[r]);
    if (o->lora_dropout != 0)
        user_error("--lora-dropout %g: ppo runs its adapters without dropout (the rollout's logprobs must be the training "
                   "forward's)", o->lora_dropout);
    if (o->lora_r < 0) user_error("--lora-r %d: must be >= 0", o->lora_r);
    o->sched = lr_schedule_parse("--lr-schedule", o->sched_name);
    o->dtype = dtype_parse("--dtype", o->dtype_name), o->save_dtype = dtype_parse("--save-dtype", o->save_dtype_name);
    o->critic_sched = o->critic_sched_name ? lr_schedule_parse("--critic-lr-schedule", o->critic_sched_name) : o->sched;
    int S = p->x.B * p->x.G;
    if (p->mini == 0) p->mini = S;
    if (p->mini < 1 || S % p->mini) user_error("--mini-batch-size %d: must divide the batch's %d sequences", p->mini, S);
    if (!o->overwrite && !o->resume) trainer_check_new_out(o->out, o->tensorboard);
    if (o->resume) {
        ppo_state_load(o->resume, &o->state);
        char *ad = path_join(o->resume, "actor");
        if (!o->lora_r) trainer_check_same_model(R[R_ACTOR].dir, ad);   /* LoRA: an adapter, on --actor */
        free(ad);
    }
    if (o->tensorboard) tensorboard_check_dir(o->tensorboard);
    sampling_params_default(&p->x.sp);
    p->x.sp.temperature = o->temperature; p->x.sp.top_k = o->top_k; p->x.sp.top_p = o->top_p;
    const char *bad = sampling_params_check(&p->x.sp);
    if (bad) user_error("ppo: %s", bad);
    p->x.seed = (uint64_t)o->seed;
    p->kl_coef = o->kl_coef; p->kl_target = o->kl_target; p->kl_horizon = o->kl_horizon; p->x.reward_clip = o->reward_clip;
    p->x.eos_penalty = o->eos_penalty; p->x.gamma = o->gamma; p->x.lambda = o->lambda; p->x.std_norm = !o->no_std_norm;
    p->x.reward_timeout = o->timeout;
    if (!(o->entropy_coef >= 0)) user_error("--entropy-coef %g: must be >= 0", o->entropy_coef);
    p->entropy_coef = o->entropy_coef;
    p->actor_hook = (PpoHook){.clip_low = o->clip_eps, .clip_high = o->clip_high > 0 ? o->clip_high : o->clip_eps, .clip_c = o->dual_clip,
                             .kl_loss_coef = o->kl_loss_coef};
    p->critic_hook = (PpoHook){.value_clip = o->value_clip};
    o->threads = backend_set_threads(o->threads);

    return memcpy(xmalloc(sizeof opts), opts, sizeof opts);
}

/* Roles, placement, models, prompts, stops, the reward program, one Learner each for actor and
 * critic (resumed), the actor's engine; prints each role's memory plan. */
static void setup(Ppo *p, PpoOptions *o) {
    Roles *rs = &p->roles;
    Role *R = rs->role;
    ExperienceMaker *x = &p->x;
    int S = x->B * x->G;
    rs->device = o->device;
    /* LoRA without --ref: the reference is the actor's base with its adapters off (no second copy) */
    x->lora_ref = o->lora_r && !R[R_REF].dir && !o->adapter[R_ACTOR] && (o->kl_coef > 0 || o->kl_loss_coef > 0);
    if (!R[R_REF].dir && !o->adapter[R_REF]) o->adapter[R_REF] = o->adapter[R_ACTOR];   /* the starting policy */
    rs->score_head[R_REWARD] = o->adapter[R_REWARD] && adapter_has_score(o->adapter[R_REWARD]);
    roles_open(rs, (o->kl_coef > 0 || o->kl_loss_coef > 0) && !x->lora_ref, o->colocate);
    const char *resume_dir[N_ROLES] = {0};   /* the trained roles' checkpoint directories */
    for (int r = 0; r < N_ROLES; r++) {   /* the reference stays the starting weights on resume */
        p->load_dir[r] = R[r].dir;
        if (o->resume && (r == R_ACTOR || r == R_CRITIC) && R[r].active) resume_dir[r] = path_join(o->resume, ROLE_NAMES[r]);
        if (resume_dir[r] && !o->lora_r) p->load_dir[r] = resume_dir[r];   /* LoRA: the base, then the adapter */
    }
    roles_load(rs, p->load_dir, o->dtype);
    const char *merged[N_ROLES];   /* adapters merged: the frozen roles', and a trained role's unless LoRA trains it */
    for (int r = 0; r < N_ROLES; r++)
        merged[r] = (r == R_ACTOR || r == R_CRITIC) && (o->lora_r || resume_dir[r]) ? NULL : o->adapter[r];
    roles_merge_adapters(rs, merged);
    char err[1024];
    x->tok = tokenizer_open(R[R_ACTOR].dir, err, sizeof err);
    if (!x->tok) user_error("%s", err);
    ModelConfig acfg;
    config_load(&acfg, R[R_ACTOR].dir);
    experience_read_prompts(x, o->prompts_path, o->key, o->chat_template, o->truncate, acfg.vocab_size, acfg.max_pos);
    experience_stops(x, R[R_ACTOR].dir, &acfg, o->stop_json, o->stop_ids);
    x->max_len = 0;
    for (int i = 0; i < x->n_prompts; i++) if ((int)x->prompts[i].n + x->max_new > x->max_len) x->max_len = (int)x->prompts[i].n + x->max_new;
    if (x->reward_cmd && rs->world_rank == 0) {
        x->rcmd = reward_cmd_start(x->reward_cmd, err, sizeof err);
        if (!x->rcmd) rank_error("%s", err);
    }
    int maxN = S * x->max_len;
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

    /* per role: run state; actor and critic: a learner, resumed */
    OptimConfig oc = optim_config_default();
    oc.weight_decay = o->wd; oc.clip = o->clip; oc.warmup = 0; oc.total_steps = o->steps; oc.zero = o->zero;
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].member) continue;
        Model *m = &R[r].m;
        if (o->lora_r && (r == R_ACTOR || r == R_CRITIC)) {   /* adapters on the trained roles, seeded by --seed */
            int target[LORA_TARGETS];
            lora_targets_parse("--lora-target", o->lora_target, target);
            lora_new(m, o->lora_r, o->lora_alpha, o->lora_rslora, target, (uint64_t)o->seed + (uint64_t)r);
            if (resume_dir[r]) lora_load(m, resume_dir[r]);
            else if (o->adapter[r]) lora_load(m, o->adapter[r]);   /* the adapters to continue training */
        }
        if (r != R_ACTOR || x->lora_ref) model_alloc_state(m, x->fwd_tokens, x->max_len);
        if (r != R_ACTOR && r != R_CRITIC) continue;
        if (p->mini % R[r].mesh.dp) user_error("--mini-batch-size %d: must be a multiple of the %s's dp %d", p->mini, ROLE_NAMES[r], R[r].mesh.dp);
        oc.lr = r == R_ACTOR ? o->actor_lr : o->critic_lr;
        oc.schedule = r == R_ACTOR ? o->sched : o->critic_sched;
        int micro = micro_size(p, &R[r]), n_mb = (p->mini / R[r].mesh.dp + micro - 1) / micro;
        learner_init(&p->learner[r], m, oc, micro * x->max_len, x->max_len, n_mb, o->sp ? TRAIN_SEQ_PARALLEL : 0);
        p->learner[r].save_dtype = o->save_dtype;
    }
    if (o->resume) {
        p->kl_coef = o->state.kl_coef;
        int same = !strcmp(o->state.placement, rs->placement);
        for (int r = R_ACTOR; r <= R_CRITIC; r++)
            if (R[r].member) learner_resume(&p->learner[r], resume_dir[r], same);
        if (rs->world_rank == 0)
            fprintf(stderr, "resuming at step %d from %s%s\n", o->state.step, o->resume,
                    same ? "" : ": another placement, so the weights, the step and the optimizer states (resharded) continue");
    }
    if (R[R_ACTOR].member) {
        int share = (S + R[R_ACTOR].mesh.dp - 1) / R[R_ACTOR].mesh.dp;
        EngineConfig ec = {share, 4096, 0, 16, acfg.max_pos, R[R_ACTOR].pp, 1, x->n_stops ? experience_stop_on_token : NULL,
                           NULL, x, NULL, share * ((x->max_len + 15) / 16 + 1), o->temperature};
        x->engine = engine_new(&R[R_ACTOR].m, &ec, x->max_len);
    }
    for (int r = 0; r < N_ROLES; r++) {   /* memory plan per role */
        if (!R[r].member) continue;
        MemPlan plan = model_mem_plan(&R[r].m);
        if (r == R_ACTOR || r == R_CRITIC) learner_mem_plan(&p->learner[r], &plan);
        plan.acts += sizeof(float) * (double)R[r].m.s.n_floats;
        if (r == R_ACTOR) { EngineStats es = engine_stats(x->engine); plan.kv = es.kv_bytes; plan.acts += es.act_bytes; }
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

/* 1-4 of one step, every rank. */
static void ppo_step(Ppo *p, int step, int *pidx, Experience *b, StepOut *so) {
    Roles *rs = &p->roles;
    Role *R = rs->role;
    float *tm = so->tm;
    memset(so, 0, sizeof *so);
    double t0 = now_seconds(), t = t0;
#define LAP(k) do { double t_ = now_seconds(); tm[k] = (float)(t_ - t); t = t_; } while (0)
    experience_step_prompts(&p->x, step, pidx);
    roles_gather_weights(rs);   /* ZeRO-3: the trained roles whole for the experience phases */
    experience_rollout(&p->x, rs, step, pidx, b);
    LAP(T_GEN);
    experience_ref(&p->x, rs, b);
    LAP(T_REF);
    experience_reward(&p->x, rs, b, pidx);
    LAP(T_REWARD);
    experience_values(&p->x, rs, b);
    LAP(T_VALUES);
    so->score_raw = experience_advantages(&p->x, b, p->kl_coef, step, pidx);
    LAP(T_ADV);
    memset(&p->actor_hook.stats, 0, sizeof(PpoStats));
    p->entropy[0] = p->entropy[1] = 0;
    memset(&p->critic_hook.stats, 0, sizeof(PpoStats));
    if (R[R_ACTOR].member) so->gn[0] = update(p, R_ACTOR, step, pidx, b);
    LAP(T_ACTOR);
    if (R[R_CRITIC].member) so->gn[1] = update(p, R_CRITIC, step, pidx, b);
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
    comm_broadcast(&rs->world, &so->gn[0], sizeof(double), R[R_ACTOR].root);
    if (R[R_CRITIC].active) {
        roles_share_stats(rs, &R[R_CRITIC], &so->cs);
        comm_broadcast(&rs->world, &so->gn[1], sizeof(double), R[R_CRITIC].root);
    }
    tm[T_STEP] = (float)(now_seconds() - t0);
    comm_all_reduce_max(&rs->world, tm, N_T);   /* a role's phase as long as its slowest rank */
    if (so->as.logprob_diff_max != 0 || so->as.n_checked == 0)
        user_error("step %d: the actor's training logprobs differ from its rollout logprobs (max |diff| %.3g over %.0f "
                   "tokens): the one-engine guarantee is broken", step + 1, so->as.logprob_diff_max, so->as.n_checked);
}

/* The adaptive KL controller (Ziegler et al.): the batch's mean per-sequence KL against the
 * target. Returns that KL. */
static double kl_control(Ppo *p, const Experience *b) {
    double seq_kl = 0;
    for (int s = 0; s < b->S; s++) {
        double k = 0;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) if (b->mask[n] > 0) k += b->kl[n];
        seq_kl += b->resp_len[s] ? k / b->resp_len[s] : 0;
    }
    seq_kl /= b->S;
    if (p->kl_target > 0 && (p->roles.role[R_REF].active || p->x.lora_ref)) {
        double e = seq_kl / p->kl_target - 1;
        e = e < -0.2 ? -0.2 : e > 0.2 ? 0.2 : e;
        p->kl_coef *= 1 + e * b->S / p->kl_horizon;
    }
    return seq_kl;
}

/* ---- the command ------------------------------------------------------------------------------ */

int ppo_main(int argc, char **argv) {
    Ppo p;
    PpoOptions o;
    memset(&p, 0, sizeof p);
    memset(&o, 0, sizeof o);
    int n_opts;
    Option *opts = parse_options(&p, &o, &n_opts, argc, argv);
    setup(&p, &o);
    ExperienceMaker *x = &p.x;
    int S = x->B * x->G, world0 = p.roles.world_rank == 0;
    if (world0) {
        args_print(opts, n_opts);
        fprintf(stderr, "%d prompts; %d steps of %d prompts x %d samples, %d mini-batch(es) x %d epoch(s)\n", x->n_prompts,
                o.steps, x->B, x->G, S / p.mini, p.ppo_epochs);
    }
    Experience b;
    experience_alloc(&b, S, x->max_len, p.roles.role[R_REF].active || x->lora_ref);
    int *pidx = xmalloc(sizeof(int) * x->B);
    if (world0) {
        mkdir_p(o.out);
        trainer_remove_stale_tmp(o.out);
    }
    MetricsLog ml;
    metrics_open(&ml, o.out, o.tensorboard, o.resume ? o.state.step : -1, world0);
    int step0 = o.resume ? o.state.step : 0, last = o.stop_after > 0 && o.stop_after < o.steps ? o.stop_after : o.steps;
    double t_run = now_seconds();
    float *step_s = xcalloc(last + 1, sizeof(float));
    for (int step = step0; step < last; step++) {
        StepOut so;
        ppo_step(&p, step, pidx, &b, &so);
        step_s[step] = so.tm[T_STEP];
        double kl_used = p.kl_coef, seq_kl = kl_control(&p, &b);
        if (world0) ppo_log_step(&ml, &p.roles, &p.x, p.entropy, step, o.steps, (step + 1) % o.log_every == 0 || step + 1 == last, &b, &so, seq_kl, kl_used);
        if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 != last)
            ppo_checkpoint_save(&p.roles, p.learner, p.load_dir, o.out, step + 1, p.kl_coef, p.x.seed, p.save_limit);
    }
    if (o.bench_alone > 0 && last > step0) bench_phases_alone(&p, last - 1, pidx, &b, o.bench_alone, step_s + step0, last - step0);
    ppo_checkpoint_save(&p.roles, p.learner, p.load_dir, o.out, last, p.kl_coef, p.x.seed, p.save_limit);
    if (o.merge) ppo_checkpoint_merge(&p.roles, p.load_dir, o.out, last, o.save_dtype);
    comm_barrier(&p.roles.world);
    if (world0)
        fprintf(stderr, "ppo: %d steps in %.1f s; actor%s in %s/checkpoint-%d; peak RSS %.1f MiB\n", last - step0,
                now_seconds() - t_run, p.roles.role[R_CRITIC].active ? " and critic" : "", o.out, last, peak_rss_mib());
    metrics_close(&ml);
    free(step_s); free(pidx); free(opts);
    experience_free(&b);
    teardown(&p);
    comm_finalize();
    return 0;
}
