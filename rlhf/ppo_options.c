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
        {"--reward-timeout", OPT_FLOAT, &o->timeout, "600", "--reward-cmd / --reward-url: seconds to wait for a batch's replies (0 = no limit)"},
        {"--reward-retries", OPT_INT, &p->x.reward_retries, "3", "--reward-url: retries (with backoff) on connection errors, 429, 5xx"},
        {"--ref", OPT_MODEL, &R[R_REF].dir, NULL, "reference for the KL (default: the actor's starting weights, frozen)"},
        {"--prompts", OPT_STR, &o->prompts_path, NULL, "jsonl: \"prompt\" | \"messages\" | \"input_ids\", optional \"label\""},
        {"--input-key", OPT_STR, &o->key, "prompt", "the text prompt's field"},
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
        {"--lr-schedule", OPT_STR, &t->schedule_name, "constant", "the actor's: cosine | linear | constant"},
        {"--critic-lr-schedule", OPT_STR, &o->critic_sched_name, NULL, "the critic's (default: --lr-schedule)"},
        {"--weight-decay", OPT_FLOAT, &t->wd, "0.0", "AdamW weight decay"},
        {"--clip", OPT_FLOAT, &t->clip, "1.0", "gradient-norm clipping (0 = off)"},
        {"--colocate", OPT_STR, &o->colocate, NULL, "roles sharing ranks: all, or sets like actor,ref:critic,reward"},
        {"--actor-ranks", OPT_INT, &R[R_ACTOR].count, "0", "ranks of the actor's group"},
        {"--critic-ranks", OPT_INT, &R[R_CRITIC].count, "0", "ranks of the critic's group"},
        {"--ref-ranks", OPT_INT, &R[R_REF].count, "0", "ranks of the reference's group"},
        {"--reward-ranks", OPT_INT, &R[R_REWARD].count, "0", "ranks of the reward model's group"},
        {"--actor-tp", OPT_INT, &R[R_ACTOR].tp, "1", ""}, {"--actor-pp", OPT_INT, &R[R_ACTOR].pp, "1", ""},
        SEQ_PARALLEL_OPTION(&t->sp), ZERO_OPTION(&t->zero), TRAIN_LORA_OPTIONS(t),
        {"--critic-tp", OPT_INT, &R[R_CRITIC].tp, "1", ""}, {"--critic-pp", OPT_INT, &R[R_CRITIC].pp, "1", ""},
        {"--ref-tp", OPT_INT, &R[R_REF].tp, "1", ""}, {"--ref-pp", OPT_INT, &R[R_REF].pp, "1", ""},
        {"--reward-tp", OPT_INT, &R[R_REWARD].tp, "1", ""}, {"--reward-pp", OPT_INT, &R[R_REWARD].pp, "1", ""},
        THREADS_OPTION(&t->threads), DTYPE_OPTION(&t->dtype_name), SAVE_DTYPE_OPTION(&t->save_dtype_name),
        DEVICE_OPTION(&t->device), COMM_TIMEOUT_OPTION(&t->comm_timeout),
    };
    *n_opts = sizeof(opts) / sizeof(opts[0]);
    return memcpy(xmalloc(sizeof opts), opts, sizeof opts);
}

/* See ppo_options.h. */
Option *ppo_parse_options(Ppo *p, PpoOptions *o, int *n_opts, int argc, char **argv) {
    Role *R = p->roles.role;
    TrainOptions *t = &o->t;
    Option *opts = option_table(p, o, n_opts);
    comm_init(&argc, &argv);
    args_parse("usage: tandem ppo --actor DIR [--critic DIR] (--reward DIR | --reward-cmd CMD) [--ref DIR] --prompts FILE --out DIR [options]",
               opts, *n_opts, argc, argv);
    comm_set_timeout(t->comm_timeout);
    if (!R[R_ACTOR].dir || !o->prompts_path || !t->out) user_error("ppo: --actor, --prompts and --out are required");
    if ((R[R_REWARD].dir != NULL) + (p->x.reward_cmd != NULL) + (o->reward_urls != NULL) != 1)
        user_error("ppo: give exactly one of --reward DIR, --reward-cmd CMD and --reward-url URL[,URL...]");
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
                             .kl_loss_coef = o->kl_loss_coef};
    p->critic_hook = (PpoHook){.value_clip = o->value_clip};
    return opts;
}
