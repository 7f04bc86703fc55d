/* distill.h — on-policy distillation's advantage (Thinking Machines, "On-Policy Distillation",
 * 2025-10; slime's apply_opd_kl_to_advantages): per action, the negative per-token reverse KL
 * estimate (k1) of the student against the teacher on the student's own sample,
 *     A_t += coef (teacher_lp_t - old_lp_t) = -coef (log pi_student(x_t) - log pi_teacher(x_t)),
 * both logprobs at the sampling temperature, undiscounted, added to the advantage the estimator
 * gave as Tandem trains it (after GRPO's std normalisation, after GAE's whitening), 0 with no
 * reward: the distillation term alone. Not centred by the batch mean (tinker-cookbook's
 * incorporate_kl_penalty centres it; slime's and the blog's formula do not). Pure host code, no model, no communication.
 * Owns: that term and its metric. Does not own: the teacher's logprobs (rlhf/experience.c
 * experience_teacher), the estimators (rlhf/ppo_loss.h), the loss (the PPO hook's). */
#ifndef TANDEM_DISTILL_H
#define TANDEM_DISTILL_H

/* adv (N) += coef (teacher_lp - old_lp) at actions (mask (N) > 0; old_lp, teacher_lp (N)), the
 * difference taken in double (exact for two floats of logprob range); non-actions are left as they
 * are. Returns the mean reverse KL estimate over the actions, mean(old_lp - teacher_lp) (0 with
 * none): the metric actor/teacher_kl. */
double distill_advantages(const float *mask, const float *old_lp, const float *teacher_lp, int N, double coef,
                          double *adv);
#endif
