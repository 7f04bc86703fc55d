/* dynamic_sampling.c — see dynamic_sampling.h. */
#include "rlhf/dynamic_sampling.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

void dynamic_sampler_alloc(DynamicSampler *d, const ExperienceMaker *x) {
    experience_alloc(&d->draw, x->B * x->G, x->max_len, 0);
    experience_alloc(&d->spare, x->B * x->G, x->max_len, 0);
    d->draw_pidx = xmalloc(sizeof(int) * x->B);
    d->spare_pidx = xmalloc(sizeof(int) * x->B);
    d->used = xmalloc((size_t)x->n_prompts);
}

void dynamic_sampler_free(DynamicSampler *d) {
    experience_free(&d->draw);
    experience_free(&d->spare);
    free(d->draw_pidx); free(d->spare_pidx); free(d->used);
}

/* Draw d >= 1's B prompts: a shuffle of the file seeded by (seed, step, d), the prompts not drawn
 * yet in the step first (a file of fewer than (d + 1) B prompts repeats some). */
static void draw_prompts(const ExperienceMaker *x, int step, int d, const char *used, int *out) {
    int *perm = xmalloc(sizeof(int) * x->n_prompts), k = 0;
    for (int i = 0; i < x->n_prompts; i++) perm[i] = i;
    uint64_t st = splitmix64_mix(x->seed ^ 0x64796e616d6963ull) + 0x9E3779B97F4A7C15ull * (uint64_t)step + (uint64_t)d;
    shuffle_ints(perm, x->n_prompts, &st);
    for (int pass = 0; pass < 2 && k < x->B; pass++)
        for (int i = 0; i < x->n_prompts && k < x->B; i++)
            if (!used[perm[i]] == !pass) out[k++] = perm[i];
    free(perm);
}

/* Group g of b: are its shaped scores all equal? */
static int group_equal(const ExperienceMaker *x, const Experience *b, int g) {
    double first = experience_shape_score(x, b, g * x->G, b->score[g * x->G], NULL, NULL);
    for (int i = 1; i < x->G; i++)
        if (experience_shape_score(x, b, g * x->G + i, b->score[g * x->G + i], NULL, NULL) != first) return 0;
    return 1;
}

static void append_group(Experience *dst, int *dst_pidx, const Experience *src, int g, int p, int G) {
    dst_pidx[dst->S / G] = p;
    for (int i = 0; i < G; i++) experience_append(dst, src, g * G + i);
}

void dynamic_sample(DynamicSampler *d, ExperienceMaker *x, Roles *rs, int step, int *pidx, Experience *b, DrawStats *ds,
                    float *t_gen, float *t_reward) {
    int B = x->B, G = x->G;
    memset(ds, 0, sizeof *ds);
    memset(d->used, 0, (size_t)x->n_prompts);
    b->S = b->N = 0;
    b->n_timed_out = 0;   /* --reward-fn's timeouts of every draw */
    d->spare.S = d->spare.N = 0;
    for (int k = 0; k < x->max_draws && b->S < B * G; k++) {
        double t0 = now_seconds();
        if (k == 0) experience_step_prompts(x, step, d->draw_pidx);
        else draw_prompts(x, step, k, d->used, d->draw_pidx);
        for (int i = 0; i < B; i++) d->used[d->draw_pidx[i]] = 1;
        x->draw = k;
        experience_rollout(x, rs, step, d->draw_pidx, &d->draw);
        x->draw = 0;
        double t1 = now_seconds();
        experience_reward(x, rs, &d->draw, d->draw_pidx);
        b->n_timed_out += d->draw.n_timed_out;
        *t_gen += (float)(t1 - t0);
        *t_reward += (float)(now_seconds() - t1);
        ds->draws++;
        for (int g = 0; g < B; g++) {   /* every rank has the same scores: the same choices */
            ds->drawn++;
            if (group_equal(x, &d->draw, g)) {
                ds->dropped++;
                if (d->spare.S < B * G) append_group(&d->spare, d->spare_pidx, &d->draw, g, d->draw_pidx[g], G);
            } else if (b->S < B * G) {
                append_group(b, pidx, &d->draw, g, d->draw_pidx[g], G);
            }
        }
    }
    for (int g = 0; b->S < B * G; g++, ds->filled++)   /* the cap: the first dropped groups fill the batch */
        append_group(b, pidx, &d->spare, g, d->spare_pidx[g], G);
}
