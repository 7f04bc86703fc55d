/* ppo_options.c — `tandem ppo`'s option table and checks (rlhf/ppo_options.h). The run and
 * optimizer settings it shares with the other trainers live in PpoOptions.t (a TrainOptions): their
 * rows are train/trainer.h's where the text is the same, and their checks are run_options_check and
 * optim_options_check; what is ppo's alone is checked here. */
#include "rlhf/ppo_options.h"
#include "rlhf/reward_http.h"
#include "runtime/adapter.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

/* ---- options -------------------------------------------------------------------------------- */

/* --teacher and --distill-coef (rlhf/distill.h). alone: no reward given, so the distillation term is
 * the whole advantage: no critic, no estimator, no reward shaping. */
static void distill_options_check(Ppo *p, const PpoOptions *o, int alone) {
    const Role *R = p->roles.role;
    if (!R[R_TEACHER].dir) {
        if (args_given(&o->distill_coef)) user_error("--distill-coef %g: without --teacher there is no distillation term", o->distill_coef);
        return;
    }
    if (!(o->distill_coef > 0 && o->distill_coef <= 1e6))   /* 1e6: the bound of a reward (reward_cmd.h) */
        user_error("--distill-coef %g: must be in (0, 1e6]: the weight of the teacher's per-token term", o->distill_coef);
    p->x.distill_coef = o->distill_coef;
    if (!alone) return;
    const char *why = "with --teacher and no reward the advantage is the distillation term alone (give --reward, "
                      "--reward-cmd or --reward-url to add one)";
    if (R[R_CRITIC].dir) user_error("--critic %s: no reward for it to learn values of: %s", R[R_CRITIC].dir, why);
    if (args_given(&o->adv_name)) user_error("--advantage %s: no reward to estimate an advantage of: %s", o->adv_name, why);
    if (o->normalize_reward || o->reward_clip != 0 || o->eos_penalty != 0 || p->x.overlong_buffer != 0)
        user_error("ppo: --normalize-reward, --reward-clip, --missing-eos-penalty and --overlong-buffer shape a reward: %s", why);
}

/* ppo's option table (its order is --help's and the echo's), pointing into p and o. */
static Option *option_table(Ppo *p, PpoOptions *o, int *n_opts) {
    Role *R = p->roles.role;
    TrainOptions *t = &o->t;
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
        {"--reward-fn", OPT_STR, &o->reward_fn, NULL, "instead: a built-in verifier, math | code | format (rlhf/verify.h; the prompt line's \"answer\" / \"tests\")"},
        {"--reward-workers", OPT_INT, &p->x.reward_workers, "4", "--reward-fn: samples verified at once"},
        {"--reward-fn-timeout", OPT_FLOAT, &o->fn_timeout, "10", "--reward-fn: seconds per sample (over it: reward 0, counted in reward/timeouts)"},
        {"--reward-timeout", OPT_FLOAT, &o->timeout, "600", "--reward-cmd / --reward-url: seconds to wait for a batch's replies (0 = no limit)"},
        {"--reward-retries", OPT_INT, &p->x.reward_retries, "3", "--reward-url: retries (with backoff) on connection errors, 429, 5xx"},
        {"--env-cmd", OPT_STR, &p->x.env_cmd, NULL, "multi-turn episodes: an environment program speaking jsonl (rlhf/env.h); its rewards are the reward"},
        {"--env-url", OPT_STR, &p->x.env_url, NULL, "instead: an environment server (POST URL/reset, URL/step)"},
        {"--env-timeout", OPT_FLOAT, &o->env_timeout, "60", "--env-*: seconds to wait for one call's replies (over it: the episodes end, reward 0, env/timeouts)"},
        {"--max-turns", OPT_INT, &p->x.max_turns, "3", "--env-*: the model's turns per episode at most"},
        {"--max-episode-tokens", OPT_INT, &p->x.max_ep_tokens, "0", "--env-*: tokens after the prompt (model's and environment's) at most (0 = 2 x --max-turns x --max-new-tokens)"},
        {"--env-chat-template", OPT_FLAG, &o->env_chat, NULL, "--env-*: feedback as a user message of the chat template (else its text tokenised alone)"},
        {"--ref", OPT_MODEL, &R[R_REF].dir, NULL, "reference for the KL (default: the actor's starting weights, frozen)"},
        {"--teacher", OPT_MODEL, &R[R_TEACHER].dir, NULL, "on-policy distillation: a frozen causal LM of the actor's tokenizer; its reverse KL per token in the advantage (alone without a reward)"},
        {"--distill-coef", OPT_FLOAT, &o->distill_coef, "1.0", "--teacher: advantage += coef (teacher_lp - old_lp) per token"},
        {"--prompts", OPT_STR, &o->prompts_path, NULL, "jsonl: \"prompt\" | \"messages\" | \"input_ids\", optional \"label\""},
        {"--input-key", OPT_STR, &o->key, "prompt", "the text prompt's field"},
        {"--eval-prompts", OPT_STR, &t->eval_path, NULL, "held-out prompts (the --prompts format): greedy, one sample each, scored by the run's reward (eval/reward_mean)"},
        {"--eval-every", OPT_INT, &t->eval_every, "0", "--eval-prompts: steps between evals (0 = only before the first step and after the last)"},
        TRAIN_CHAT_OPTION(t),
        {"--truncate", OPT_FLAG, &o->truncate, NULL, "keep the last tokens of prompts too long for the positions"},
        {"--out", OPT_STR, &t->out, NULL, "output directory: actor/ and critic/ at the end, metrics.jsonl"},
        TRAIN_OVERWRITE_OPTION(t),
        {"--resume", OPT_STR, &t->resume, NULL, "continue from out/checkpoint-STEP (at any placement; bit for bit at the same)"},
        TENSORBOARD_OPTION(&t->tensorboard),
        {"--steps", OPT_INT, &o->steps, "10", "PPO steps (each: rollout, experience, update)"},
        {"--stop-after", OPT_INT, &t->stop_after, "0", "stop after this step (0 = off)"},
        {"--save-every", OPT_INT, &t->save_every, "0", "steps between saved models (0 = only at the end)"},
        TRAIN_SAVE_LIMIT_OPTION(t),
        TRAIN_LOG_EVERY_OPTION(t),
        {"--rollout-batch-size", OPT_INT, &p->x.B, "8", "prompts per step"},
        {"--n-samples-per-prompt", OPT_INT, &p->x.G, "1", "responses per prompt (the group of grpo / rloo)"},
        {"--max-new-tokens", OPT_INT, &p->x.max_new, "32", "response length at most"},
        {"--stop", OPT_STR, &o->stop_json, NULL, "stop string, or a JSON list of them: the response ends with the token completing one"},
        {"--stop-token-ids", OPT_STR, &o->stop_ids, NULL, "comma-separated ids that also end a response (besides EOS)"},
        {"--bench-alone", OPT_INT, &o->bench_alone, "0", "after the run: each phase alone this many times on the last step's shapes (a JSON line)"},
        {"--temperature", OPT_FLOAT, &o->temperature, "1.0", "sampling temperature (> 0); the policy is softmax(logits / T)"},
        {"--top-k", OPT_INT, &o->top_k, "0", "sampling top-k (0 = off)"},
        {"--top-p", OPT_FLOAT, &o->top_p, "1.0", "sampling top-p"},
        {"--min-p", OPT_FLOAT, &o->min_p, "0", "sampling min-p (0 = off); with top-k / top-p / min-p the policy is the truncated one"},
        {"--seed", OPT_INT, &t->seed, "1234", "prompt order, sampling and mini-batch shuffles"},
        {"--advantage", OPT_STR, &o->adv_name, "gae", "gae | grpo | rloo | reinforce++ | reinforce++-baseline"},
        {"--policy-loss", OPT_STR, &o->policy_name, "ppo", "ppo | gspo (sequence ratio; --clip-eps 3e-4, --clip-eps-high 4e-4 unless given) | cispo"},
        {"--loss-agg", OPT_STR, &o->loss_agg_name, "token-mean", "the actor's: token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                                                                 "seq-mean-token-sum-norm (/ --max-new-tokens; gspo: seq-mean-token-mean)"},
        {"--no-std-norm", OPT_FLAG, &o->no_std_norm, NULL, "grpo: do not divide by the group's std (Dr. GRPO)"},
        {"--no-whiten", OPT_FLAG, &o->no_whiten, NULL, "gae: do not whiten the advantages over the batch"},
        {"--kl-coef", OPT_FLOAT, &o->kl_coef, "0.001", "KL penalty in the reward of gae and reinforce++ (0 = off)"},
        {"--kl-estimator", OPT_STR, &o->kl_est, "k1", "k1 | k2 | k3"},
        {"--kl-target", OPT_FLOAT, &o->kl_target, "0", "adaptive KL controller's target (0 = fixed --kl-coef)"},
        {"--kl-horizon", OPT_FLOAT, &o->kl_horizon, "10000", "adaptive KL controller's horizon"},
        {"--kl-loss-coef", OPT_FLOAT, &o->kl_loss_coef, "0", "KL (k3) to the reference in the actor's loss (GRPO)"},
        {"--reward-clip", OPT_FLOAT, &o->reward_clip, "0", "clip scores to [-x, x] (0 = off)"},
        {"--missing-eos-penalty", OPT_FLOAT, &o->eos_penalty, "0", "subtracted from the score of a response cut off without EOS"},
        {"--normalize-reward", OPT_FLAG, &o->normalize_reward, NULL, "(score - mean) / std by the reward model's saved stats"},
        {"--overlong-buffer", OPT_INT, &p->x.overlong_buffer, "0", "DAPO's overlong shaping: the last L of --max-new-tokens tokens cost up to --overlong-penalty (0 = off)"},
        {"--overlong-penalty", OPT_FLOAT, &o->overlong_penalty, "1.0", "--overlong-buffer: the penalty F at --max-new-tokens (verl's penalty_factor)"},
        {"--mask-truncated", OPT_FLAG, &p->x.mask_truncated, NULL, "responses cut at --max-new-tokens (no stop) weigh 0 in the loss (still in their group's statistics)"},
        {"--dynamic-sampling", OPT_FLAG, &p->x.dynamic_sampling, NULL, "DAPO: drop groups of equal rewards and draw more prompts until the batch is full (grpo / rloo / reinforce++-baseline)"},
        {"--max-sample-draws", OPT_INT, &p->x.max_draws, "10", "--dynamic-sampling: rollouts per step at most (then the batch is filled with dropped groups)"},
        {"--dump-rollouts", OPT_STR, &o->dump_path, NULL, "FILE: a jsonl line per sample and step: tokens, logprobs, loss mask, reward parts, advantages"},
        {"--gamma", OPT_FLOAT, &o->gamma, "1.0", "GAE and reinforce++ discount"},
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
        {"--lr-schedule", OPT_STR, &t->schedule_name, "constant", "the actor's: cosine | linear | constant"},
        {"--critic-lr-schedule", OPT_STR, &o->critic_sched_name, NULL, "the critic's (default: --lr-schedule)"},
        {"--weight-decay", OPT_FLOAT, &t->wd, "0.0", "AdamW weight decay"},
        {"--clip", OPT_FLOAT, &t->clip, "1.0", "gradient-norm clipping (0 = off)"},
        {"--colocate", OPT_STR, &o->colocate, NULL, "roles sharing ranks: all, or sets like actor,ref:critic,reward"},
        {"--actor-ranks", OPT_INT, &R[R_ACTOR].count, "0", "ranks of the actor's group"},
        {"--critic-ranks", OPT_INT, &R[R_CRITIC].count, "0", "ranks of the critic's group"},
        {"--ref-ranks", OPT_INT, &R[R_REF].count, "0", "ranks of the reference's group"},
        {"--reward-ranks", OPT_INT, &R[R_REWARD].count, "0", "ranks of the reward model's group"},
        {"--teacher-ranks", OPT_INT, &R[R_TEACHER].count, "0", "ranks of the teacher's group"},
        {"--rollout-ranks", OPT_INT, &R[R_ROLLOUT].count, "0", "ranks of their own that generate the rollouts on exact copies of the actor's weights (its tp and pp; 0 = the actor generates)"},
        {"--async-lag", OPT_INT, &p->lag, "0", "--rollout-ranks: batch k + L is generated from weights version k while step k trains (0 = synchronous)"},
        {"--behav-imp-weight-cap", OPT_FLOAT, &o->behav_cap, "0", "--async-lag: tokens whose behaviour weight pi_prox / pi_behav exceeds it count 0 (AReaL's; 0 = no cap)"},
        {"--actor-tp", OPT_INT, &R[R_ACTOR].tp, "1", ""}, {"--actor-pp", OPT_INT, &R[R_ACTOR].pp, "1", ""},
        {"--actor-ep", OPT_INT, &R[R_ACTOR].ep, "1", "a Mixture-of-Experts actor: its experts split over this many of its dp ranks"},
        SEQ_PARALLEL_OPTION(&t->sp), ZERO_OPTION(&t->zero), TRAIN_LORA_OPTIONS(t),
        {"--moe-z-loss-coef", OPT_FLOAT, &t->moe_z_coef, "0", "a MoE actor: + coef x mean_t logsumexp(router logits)^2 per MoE layer (ST-MoE's router z-loss; 0 = off)"},
        {"--critic-tp", OPT_INT, &R[R_CRITIC].tp, "1", ""}, {"--critic-pp", OPT_INT, &R[R_CRITIC].pp, "1", ""},
        {"--critic-ep", OPT_INT, &R[R_CRITIC].ep, "1", ""},
        {"--ref-tp", OPT_INT, &R[R_REF].tp, "1", ""}, {"--ref-pp", OPT_INT, &R[R_REF].pp, "1", ""},
        {"--ref-ep", OPT_INT, &R[R_REF].ep, "1", "a Mixture-of-Experts reference: its experts over this many of its dp ranks (so --critic-ep, --reward-ep, --teacher-ep)"},
        {"--reward-tp", OPT_INT, &R[R_REWARD].tp, "1", ""}, {"--reward-pp", OPT_INT, &R[R_REWARD].pp, "1", ""},
        {"--reward-ep", OPT_INT, &R[R_REWARD].ep, "1", ""},
        {"--teacher-tp", OPT_INT, &R[R_TEACHER].tp, "1", ""}, {"--teacher-pp", OPT_INT, &R[R_TEACHER].pp, "1", ""},
        {"--teacher-ep", OPT_INT, &R[R_TEACHER].ep, "1", ""},
        THREADS_OPTION(&t->threads), DTYPE_OPTION(&t->dtype_name), SAVE_DTYPE_OPTION(&t->save_dtype_name),
        KERNEL_OPTIONS(&t->kv_dtype_name, &t->bf16_dot_name),
        DEVICE_OPTION(&t->device), COMM_TIMEOUT_OPTION(&t->comm_timeout),
    };
    *n_opts = sizeof(opts) / sizeof(opts[0]);
    return memcpy(xmalloc(sizeof opts), opts, sizeof opts);
}

/* --policy-loss, --loss-agg and what they do not go with; GSPO's own clip range (the paper's 3e-4 /
 * 4e-4) unless --clip-eps / --clip-eps-high are given. */
static void policy_options_check(Ppo *p, PpoOptions *o) {
    AdvantageKind a = p->x.adv_kind;
    train_moe_z_check(o->t.moe_z_coef, NULL);
    PolicyLoss pl = policy_loss_parse("--policy-loss", o->policy_name);
    p->loss_agg = loss_agg_parse("--loss-agg", o->loss_agg_name);
    if (a == ADV_RPP_BASELINE && p->x.G < 2)
        user_error("--advantage reinforce++-baseline needs --n-samples-per-prompt >= 2 (the baseline is the group's mean)");
    if (pl == PL_PPO) return;
    if (o->dual_clip != 0) user_error("--dual-clip: --policy-loss %s has no dual clip (only ppo)", o->policy_name);
    if (pl != PL_GSPO) return;
    if (a == ADV_GAE || a == ADV_RPP)
        user_error("--policy-loss gspo: --advantage %s gives token-level advantages; GSPO's ratio is a sequence's (use grpo, "
                   "rloo or reinforce++-baseline)", o->adv_name);
    if (p->roles.role[R_TEACHER].dir)
        user_error("--policy-loss gspo: --teacher adds a per-token advantage (the distillation term); GSPO's ratio is a "
                   "sequence's");
    if (args_given(&o->loss_agg_name) && p->loss_agg != AGG_SEQ_MEAN_TOKEN_MEAN)
        user_error("--loss-agg %s: --policy-loss gspo aggregates as seq-mean-token-mean (GSPO's objective, verl's "
                   "compute_policy_loss_gspo)", o->loss_agg_name);
    p->loss_agg = AGG_SEQ_MEAN_TOKEN_MEAN;
    if (!args_given(&o->clip_eps)) {
        o->clip_eps = 3e-4f;
        if (!args_given(&o->clip_high)) o->clip_high = 4e-4f;
    }
}

/* DAPO's sampling and shaping (rlhf/dynamic_sampling.h, experience_shape_score) and --dump-rollouts */
static void dapo_options_check(Ppo *p, PpoOptions *o) {
    ExperienceMaker *x = &p->x;
    if (x->dynamic_sampling && x->G < 2)
        user_error("--dynamic-sampling needs --n-samples-per-prompt >= 2 (a group of one sample always has equal rewards)");
    if (x->dynamic_sampling && (x->adv_kind == ADV_GAE || x->adv_kind == ADV_RPP))
        user_error("--dynamic-sampling needs --advantage grpo, rloo or reinforce++-baseline (it drops groups whose equal "
                   "rewards give them no group advantage; gae's come from a critic, reinforce++'s from returns)");
    if (args_given(&x->max_draws) && !x->dynamic_sampling) user_error("--max-sample-draws: only with --dynamic-sampling");
    if (x->max_draws < 1) user_error("--max-sample-draws %d: must be >= 1", x->max_draws);
    if (args_given(&x->overlong_buffer) && (x->overlong_buffer <= 0 || x->overlong_buffer >= x->max_new))
        user_error("--overlong-buffer %d: must be in [1, --max-new-tokens %d) (the penalty grows over the last L tokens)",
                   x->overlong_buffer, x->max_new);
    if (!(o->overlong_penalty >= 0)) user_error("--overlong-penalty %g: must be >= 0", o->overlong_penalty);
    if (args_given(&o->overlong_penalty) && !x->overlong_buffer) user_error("--overlong-penalty: only with --overlong-buffer");
    if (o->dump_path && (!o->dump_path[0] || dir_exists(o->dump_path)))
        user_error("--dump-rollouts %s: not a file name", o->dump_path);
    if (o->dump_path) {   /* before any work: a dump that cannot be written is known now */
        char *dir = xstrdup(o->dump_path), *slash = strrchr(dir, '/');
        if (!slash) strcpy(dir, ".");
        else slash[slash == dir] = 0;   /* "/f": "/" */
        if (!dir_exists(dir)) user_error("--dump-rollouts %s: its directory %s does not exist", o->dump_path, dir);
        free(dir);
    }
    x->overlong_factor = o->overlong_penalty;
}

/* --env-cmd / --env-url (rlhf/episode.h): the environment's rewards are the run's reward, so the
 * other rewards are refused; so is what measures a response by --max-new-tokens. */
static void env_options_check(Ppo *p, const PpoOptions *o, int n_rewards) {
    ExperienceMaker *x = &p->x;
    int env = x->env_cmd || x->env_url;
    x->env_chat = -1;
    if (!env) {
        if (args_given(&o->env_timeout) || args_given(&x->max_turns) || args_given(&x->max_ep_tokens) || o->env_chat)
            user_error("ppo: --env-timeout, --max-turns, --max-episode-tokens and --env-chat-template: only with --env-cmd or --env-url");
        return;
    }
    if (x->env_cmd && x->env_url) user_error("ppo: give one of --env-cmd and --env-url, not both");
    if ((x->env_cmd && !x->env_cmd[0]) || (x->env_url && !x->env_url[0])) user_error("ppo: --env-cmd / --env-url: empty");
    if (n_rewards)
        user_error("ppo: --env-cmd / --env-url: the environment's rewards are the reward; --reward, --reward-cmd, "
                   "--reward-url and --reward-fn are refused with it");
    if (!(o->env_timeout > 0 && o->env_timeout <= 86400))
        user_error("--env-timeout %g: must be in (0, 86400] seconds (a call that never answers must end)", o->env_timeout);
    if (x->max_turns < 1 || x->max_turns > 1000) user_error("--max-turns %d: must be in [1, 1000]", x->max_turns);
    if (x->max_new < 1) return;   /* refused below */
    long dflt = 2L * x->max_turns * x->max_new;   /* room for feedback as long as the model's turns */
    if (!args_given(&x->max_ep_tokens)) x->max_ep_tokens = (int)(dflt < 1 << 20 ? dflt : 1 << 20);
    if (x->max_ep_tokens < 1 || x->max_ep_tokens > 1 << 20)
        user_error("--max-episode-tokens %d: must be in [1, %d] (and leave each prompt room: it counts in the model's positions)",
                   x->max_ep_tokens, 1 << 20);
    if (x->overlong_buffer || x->mask_truncated || o->eos_penalty != 0)
        user_error("%s: measures one response's end against --max-new-tokens; an episode is several turns and the "
                   "environment's tokens, ended by done, --max-turns or --max-episode-tokens",
                   x->overlong_buffer ? "--overlong-buffer (DAPO's overlong shaping)" : x->mask_truncated ? "--mask-truncated" : "--missing-eos-penalty");
    long draws = x->dynamic_sampling ? x->max_draws : 1, ids = (long)o->steps * draws * x->B * x->G;
    if (ids > 2147483647L)   /* an episode's id is (step x draws + draw) x S + sample (rlhf/episode.h) */
        user_error("ppo: --steps %d x --rollout-batch-size %d x --n-samples-per-prompt %d (x --max-sample-draws %ld) "
                   "episodes: more than 2^31 - 1 ids", o->steps, x->B, x->G, draws);
    x->env_timeout = o->env_timeout;
}

/* --rollout-ranks, --async-lag, --behav-imp-weight-cap (rlhf/async.h) and what they do not go with */
static void async_options_check(Ppo *p, PpoOptions *o) {
    const Role *R = p->roles.role;
    int n = R[R_ROLLOUT].count, lag = p->lag;
    if (n < 0) user_error("--rollout-ranks %d: must be >= 0", n);
    if (lag < 0) user_error("--async-lag %d: must be >= 0 (0 = synchronous)", lag);
    if (lag > 0 && n == 0) user_error("--async-lag %d: needs --rollout-ranks (the rollouts run ahead on ranks of their own)", lag);
    if (args_given(&o->behav_cap) && lag == 0) user_error("--behav-imp-weight-cap: only with --async-lag >= 1 (decoupled PPO)");
    if (!(o->behav_cap == 0 || o->behav_cap >= 1)) user_error("--behav-imp-weight-cap %g: must be >= 1 (or 0 = no cap)", o->behav_cap);
    p->actor_hook.behav_cap = o->behav_cap;
    int ep = R[R_ACTOR].ep;
    if (ep > 1 && n) user_error("--actor-ep %d: not with --rollout-ranks (the rollout ranks hold the actor's tp x pp shards, not its ep blocks)", ep);
    if (ep > 1 && (p->x.env_cmd || p->x.env_url))
        user_error("--actor-ep %d: not with --env-cmd / --env-url yet (the episodes' turns would need the ep ranks in step)", ep);
    if (n == 0) return;
    if (n % (R[R_ACTOR].tp * R[R_ACTOR].pp))
        user_error("--rollout-ranks %d: must be a multiple of the actor's tp x pp = %d (the rollout ranks hold its shards one "
                   "to one)", n, R[R_ACTOR].tp * R[R_ACTOR].pp);
    if (o->t.lora_r) user_error("--rollout-ranks: not with --lora-r (the rollout ranks get the actor's weights, not its adapters)");
    if (o->t.zero == 3) user_error("--rollout-ranks: not with --zero 3 (the actor's weights are sliced over dp; use --zero 2)");
    if (p->x.dynamic_sampling) user_error("--rollout-ranks: not with --dynamic-sampling (its redraws need the trainer's rewards)");
    if (o->bench_alone) user_error("--rollout-ranks: not with --bench-alone (it times the colocated step's phases)");
    if (o->t.eval_path) user_error("--rollout-ranks: not with --eval-prompts (the eval runs on the actor's ranks, the episodes' environment on the rollout ranks)");
    if (lag == 0) return;
    if (p->actor_hook.policy != PL_PPO)
        user_error("--async-lag %d: --policy-loss %s: decoupled PPO's correction is ppo's (use --policy-loss ppo)", lag, o->policy_name);
    if (sampler_truncates(&p->x.sp))
        user_error("--async-lag %d: not with --top-k / --top-p / --min-p (the proximal policy's logprobs are the full softmax's)", lag);
}

/* See ppo_options.h. */
Option *ppo_parse_options(Ppo *p, PpoOptions *o, int *n_opts, int argc, char **argv) {
    Role *R = p->roles.role;
    TrainOptions *t = &o->t;
    Option *opts = option_table(p, o, n_opts);
    comm_init(&argc, &argv);
    args_parse("usage: tandem ppo --actor DIR [--critic DIR] (--reward DIR | --reward-cmd CMD) [--ref DIR] [--teacher DIR] --prompts FILE --out DIR [options]",
               opts, *n_opts, argc, argv);
    comm_set_timeout(t->comm_timeout);
    if (!R[R_ACTOR].dir || !o->prompts_path || !t->out) user_error("ppo: --actor, --prompts and --out are required");
    int n_rewards = (R[R_REWARD].dir != NULL) + (p->x.reward_cmd != NULL) + (o->reward_urls != NULL) + (o->reward_fn != NULL);
    env_options_check(p, o, n_rewards);
    if (p->x.env_cmd || p->x.env_url) n_rewards = 1;   /* the environment's */
    if (n_rewards > 1 || (n_rewards == 0 && !R[R_TEACHER].dir))
        user_error("ppo: give exactly one of --reward DIR, --reward-cmd CMD, --reward-url URL[,URL...] and --reward-fn NAME "
                   "(or none with --teacher)");
    p->x.reward_fn = o->reward_fn != NULL;
    if (o->reward_fn) p->x.verify_kind = verify_kind_parse("--reward-fn", o->reward_fn);
    if (!o->reward_fn && (args_given(&p->x.reward_workers) || args_given(&o->fn_timeout)))
        user_error("ppo: --reward-workers and --reward-fn-timeout: only with --reward-fn");
    if (p->x.reward_workers < 1 || p->x.reward_workers > VERIFY_MAX_WORKERS)
        user_error("--reward-workers %d: must be in [1, %d]", p->x.reward_workers, VERIFY_MAX_WORKERS);
    if (!(o->fn_timeout > 0)) user_error("--reward-fn-timeout %g: must be > 0", o->fn_timeout);
    p->x.fn_timeout = o->fn_timeout;
    if (p->x.reward_retries < 0) user_error("--reward-retries %d: must be >= 0", p->x.reward_retries);
    if (o->reward_urls) p->x.n_urls = reward_http_parse_urls(o->reward_urls, &p->x.urls);
    distill_options_check(p, o, n_rewards == 0);
    if (o->t.eval_path && n_rewards == 0)
        user_error("--eval-prompts %s: with --teacher alone there is no reward to score the eval by", o->t.eval_path);
    if (args_given(&o->t.eval_every) && !o->t.eval_path) user_error("--eval-every: only with --eval-prompts");
    if (o->t.eval_every < 0) user_error("--eval-every %d: must be >= 0 (0 = only before the first step and after the last)", o->t.eval_every);
    p->x.adv_kind = advantage_kind_parse("--advantage", o->adv_name);
    if (p->x.dynamic_sampling && n_rewards == 0)
        user_error("--dynamic-sampling: --teacher alone scores every sample 0, so every group would be dropped (give a reward)");
    dapo_options_check(p, o);
    if (p->x.adv_kind == ADV_GAE && !R[R_CRITIC].dir && n_rewards) user_error("--advantage gae needs --critic (or use grpo / rloo)");
    if (p->x.adv_kind != ADV_GAE && R[R_CRITIC].dir) user_error("--critic: --advantage %s uses no critic", o->adv_name);
    if (p->x.adv_kind == ADV_RLOO && p->x.G < 2) user_error("--advantage rloo needs --n-samples-per-prompt >= 2");
    /* a group of one sample is its own mean: advantage 0 for every token, so nothing would be trained */
    if (p->x.adv_kind == ADV_GRPO && p->x.G < 2)
        user_error("--advantage grpo needs --n-samples-per-prompt >= 2 (a group of 1 has advantage 0: nothing would be trained)");
    /* --teacher alone: every score is 0 and grpo's group advantage of zeros is exactly 0, so the
     * advantage is the distillation term alone (the checks above refused any other estimator) */
    if (n_rewards == 0) p->x.adv_kind = ADV_GRPO;
    policy_options_check(p, o);
    p->x.kl_est = kl_estimator_parse("--kl-estimator", o->kl_est);
    if (!(o->temperature > 0)) user_error("--temperature %g: must be > 0 (the policy is softmax(logits / T))", o->temperature);
    if (p->x.B < 1 || p->x.G < 1 || p->x.max_new < 1 || o->steps < 1 || p->ppo_epochs < 1 || t->threads < 0)
        user_error("ppo: --rollout-batch-size, --n-samples-per-prompt, --max-new-tokens, --steps, --ppo-epochs, --threads must be >= 1");
    if (!(o->kl_coef >= 0) || !(o->kl_loss_coef >= 0) || !(o->reward_clip >= 0) || !(o->kl_target >= 0) || !(o->kl_horizon > 0))
        user_error("ppo: --kl-coef, --kl-loss-coef, --reward-clip, --kl-target must be >= 0, --kl-horizon > 0");
    if (!(o->gamma >= 0 && o->gamma <= 1) || !(o->lambda >= 0 && o->lambda <= 1)) user_error("ppo: --gamma and --lambda must be in [0, 1]");
    if (!(o->clip_eps > 0 && o->clip_eps < 1) || o->clip_high < 0 || !(o->value_clip > 0)) user_error("ppo: --clip-eps in (0, 1), --clip-eps-high >= 0, --value-clip > 0");
    if (o->dual_clip != 0 && !(o->dual_clip > 1)) user_error("--dual-clip %g: must be > 1 (or 0 = off)", o->dual_clip);
    /* --actor-lr 0: the actor's weights stay (a check that the ratio is 1 on every mini-batch) */
    if (!(o->actor_lr >= 0) || !(o->critic_lr > 0)) user_error("ppo: --actor-lr must be >= 0 and --critic-lr > 0");
    if (!(o->entropy_coef >= 0)) user_error("--entropy-coef %g: must be >= 0", o->entropy_coef);
    int tp = R[R_ACTOR].tp > R[R_CRITIC].tp ? R[R_ACTOR].tp : R[R_CRITIC].tp;
    lora_options_check(&t->lora_r, &t->lora_alpha, &t->lora_target, &t->lora_rslora, &t->lora_dropout, t->resume, "actor");
    optim_options_check(t, tp, "needs --actor-tp or --critic-tp > 1 (it shares a trained role's tp ranks' rows)");
    for (int r = 0; r < N_ROLES; r++)
        if (o->adapter[r] && !dir_exists(o->adapter[r]))
            user_error("--%s-adapter %s: not a directory (a PEFT adapter directory: adapter_config.json and "
                       "adapter_model.safetensors)", ROLE_NAMES[r], o->adapter[r]);
    if (t->lora_dropout != 0)
        user_error("--lora-dropout %g: ppo runs its adapters without dropout (the rollout's logprobs must be the training "
                   "forward's)", t->lora_dropout);
    o->sched = lr_schedule_parse("--lr-schedule", t->schedule_name);
    o->critic_sched = o->critic_sched_name ? lr_schedule_parse("--critic-lr-schedule", o->critic_sched_name) : o->sched;
    int S = p->x.B * p->x.G;
    if (p->mini == 0) p->mini = S;
    if (p->mini < 1 || S % p->mini) user_error("--mini-batch-size %d: must divide the batch's %d sequences", p->mini, S);
    if (t->resume) {
        ppo_state_load(t->resume, &o->state);
        char *ad = path_join(t->resume, "actor");
        if (!t->lora_r) trainer_check_same_model(R[R_ACTOR].dir, ad);   /* LoRA: an adapter, on --actor */
        free(ad);
    }
    run_options_check(t);
    sampling_params_default(&p->x.sp);
    p->x.sp.temperature = o->temperature; p->x.sp.top_k = o->top_k; p->x.sp.top_p = o->top_p; p->x.sp.min_p = o->min_p;
    if (!(o->min_p >= 0 && o->min_p <= 1)) user_error("--min-p %g: must be in [0, 1] (0 = off)", o->min_p);
    const char *bad = sampling_params_check(&p->x.sp);
    if (bad) user_error("ppo: %s", bad);
    /* below 1e-5 the sampler is an argmax and truncates nothing: no truncated policy to train */
    if ((o->top_k > 0 || o->top_p < 1 || o->min_p > 0) && sampler_is_greedy(&p->x.sp))
        user_error("--temperature %g: below 1e-5 sampling is greedy (argmax), so --top-k / --top-p / --min-p define no "
                   "truncated policy; raise it", o->temperature);
    p->x.seed = (uint64_t)t->seed;
    p->kl_coef = o->kl_coef; p->kl_target = o->kl_target; p->kl_horizon = o->kl_horizon; p->x.reward_clip = o->reward_clip;
    p->x.eos_penalty = o->eos_penalty; p->x.gamma = o->gamma; p->x.lambda = o->lambda; p->x.std_norm = !o->no_std_norm;
    p->x.reward_timeout = o->timeout;
    p->entropy_coef = o->entropy_coef;
    p->actor_hook = (PpoHook){.clip_low = o->clip_eps, .clip_high = o->clip_high > 0 ? o->clip_high : o->clip_eps, .clip_c = o->dual_clip,
                             .kl_loss_coef = o->kl_loss_coef, .policy = policy_loss_parse("--policy-loss", o->policy_name)};
    p->critic_hook = (PpoHook){.value_clip = o->value_clip};
    async_options_check(p, o);
    return opts;
}
