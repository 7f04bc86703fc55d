/* ppo_options.h — `tandem ppo`'s options: the table (its --help and echo), their checks, and the
 * two structs they fill: PpoOptions (what setup reads) and Ppo (the run, rlhf/ppo.c).
 * Owns: the table and the checks ppo adds to train/trainer.h's run_options_check and
 * optim_options_check. Does not own: setup, the step loop (rlhf/ppo.c). */
#ifndef TANDEM_PPO_OPTIONS_H
#define TANDEM_PPO_OPTIONS_H
#include "rlhf/experience.h"
#include "rlhf/ppo_checkpoint.h"
#include "rlhf/ppo_loss.h"
#include "rlhf/roles.h"
#include "runtime/args.h"
#include "train/learner.h"
#include "train/schedule.h"
#include "train/trainer.h"

/* The options that only setup reads (the rest go straight into Ppo); t: the run and optimizer
 * settings ppo shares with the other trainers (train/trainer.h: their rows, checks and fields). */
typedef struct {
    TrainOptions t;
    const char *stop_ids, *critic_sched_name, *stop_json, *reward_urls, *prompts_path, *key;
    const char *colocate, *kl_est, *adv_name, *reward_fn;
    const char *loss_agg_name, *policy_name;   /* --loss-agg, --policy-loss */
    const char *dump_path;               /* --dump-rollouts (rlhf/ppo_dump.h) */
    float overlong_penalty;              /* --overlong-penalty: DAPO's factor F */
    int bench_alone, steps, truncate, no_std_norm, top_k, no_whiten, normalize_reward;
    const char *adapter[N_ROLES];        /* --ROLE-adapter: a PEFT adapter on that role's model */
    float temperature, top_p, min_p, kl_coef, kl_target, kl_horizon, reward_clip, eos_penalty, gamma, lambda, clip_eps,
        clip_high, dual_clip, entropy_coef, kl_loss_coef, value_clip, actor_lr, critic_lr, timeout, fn_timeout;
    float distill_coef;                  /* --distill-coef (--teacher) */
    float env_timeout;                   /* --env-timeout */
    int env_chat;                        /* --env-chat-template */
    LrSchedule sched, critic_sched;
    PpoState state;        /* --resume's ppo_state.json */
} PpoOptions;

/* One run (rlhf/ppo.c): the roles, the experience maker, the trained roles' learners. */
typedef struct {
    Roles roles;
    ExperienceMaker x;
    Learner learner[2];                  /* [R_ACTOR], [R_CRITIC] on their members */
    int ppo_epochs, mini, micro;         /* update: passes, sequences per optimizer step, per micro-batch */
    PpoHook actor_hook, critic_hook;
    LossAgg loss_agg;                    /* the actor's --loss-agg (the critic's is token-mean) */
    double entropy_coef, entropy[2];     /* the actor's entropy bonus; the step's entropy sum and count */
    double kl_coef, kl_target, kl_horizon;   /* the KL penalty and its adaptive controller */
    const char *load_dir[N_ROLES];       /* where each role's weights were read (--resume: the checkpoint's) */
} Ppo;

/* comm_init, then parses argv into o and p and checks it (one user_error line each; the thread count
 * set); returns the table (for the echo; free it) and its length in n_opts. */
Option *ppo_parse_options(Ppo *p, PpoOptions *o, int *n_opts, int argc, char **argv);
#endif
