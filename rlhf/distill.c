/* distill.c — see distill.h. */
#include "rlhf/distill.h"

double distill_advantages(const float *mask, const float *old_lp, const float *teacher_lp, int N, double coef,
                          double *adv) {
    double kl = 0, n_act = 0;
    for (int n = 0; n < N; n++) {
        if (!(mask[n] > 0)) continue;
        double d = (double)old_lp[n] - (double)teacher_lp[n];   /* k1: log pi_student - log pi_teacher */
        adv[n] += coef * -d;
        kl += d;
        n_act += 1;
    }
    return n_act > 0 ? kl / n_act : 0.0;
}
