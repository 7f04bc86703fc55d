/* ppo_log.h — one ppo step's report (StepOut: the same on every rank) and its metrics line (verl's
 * names) and progress line (rlhf/ppo_log.c). */
#ifndef TANDEM_PPO_LOG_H
#define TANDEM_PPO_LOG_H
#include "rlhf/async.h"
#include "rlhf/dynamic_sampling.h"
#include "rlhf/experience.h"
#include "rlhf/roles.h"
#include "train/metrics.h"

/* the step's phases, timed (timing_s/NAME) */
enum { T_GEN, T_REF, T_REWARD, T_VALUES, T_ADV, T_ACTOR, T_CRITIC, T_STEP, N_T };
extern const char *const PPO_TIMING_NAMES[N_T];   /* "gen", "ref", ... "step" */

/* What a step reports, the same on every rank. */
typedef struct {
    double score_raw;          /* sum of the raw scores */
    PpoStats as, cs;           /* the actor's and the critic's hook sums */
    double gn[2];              /* their mean gradient norms */
    float tm[N_T];             /* seconds per phase (the slowest rank's) */
    DrawStats ds;              /* --dynamic-sampling's draws */
    int async_on;              /* --rollout-ranks: the pipeline's report below (rlhf/async.h) */
    AsyncStats async;
} StepOut;

/* On world rank 0: the step's metrics line, and with print its progress line. entropy: the actor's
 * entropy sum and count over the step; seq_kl: the mean sequence KL to the reference; kl_used: the
 * KL coefficient the step used. */
void ppo_log_step(MetricsLog *ml, const Roles *rs, const ExperienceMaker *x, const double entropy[2], int step, int steps,
                  int print, const Experience *b, const StepOut *so, double seq_kl, double kl_used);
#endif
