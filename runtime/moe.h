/* moe.h — the Mixture-of-Experts MLP block (runtime/moe.c): what one block's forward computes and
 * keeps, for the backward (train/moe_grad.c), which reruns the forward from the block's input
 * (the same bits) instead of keeping it for every layer. Host buffers (the CPU backend).
 * Shapes: N tokens, D, E experts, k choices per token, Fe / Fs the local widths of an expert and
 * of the shared expert; NK = N k rows grouped by expert. */
#ifndef TANDEM_MOE_H
#define TANDEM_MOE_H
#include "runtime/model.h"

typedef struct {
    int N;
    float *p;        /* (N, E) each token's routing probabilities softmax(router logits), fp32 */
    float *lse;      /* (N) each token's logsumexp of its router logits, fp32 (the router z-loss) */
    int *sel;        /* (N, k) its experts in rank order (descending p, ties to the lower id) */
    float *w;        /* (N, k) their weights (p, renormalised over the k when norm_topk) */
    int *slot;       /* (N, k) the grouped row of each choice */
    int *rows;       /* (NK) the token of each grouped row */
    int *start;      /* (E + 1) expert e's grouped rows: [start[e], start[e + 1]) */
    float *xg;       /* (NK, D) the tokens' xb rows, grouped */
    float *gate, *up;/* (NK, Fe) the experts' gate and up pre-activations */
    float *act;      /* (NK, Fe) silu(gate) * up, rounded to the weights' dtype: down's input */
    float *y;        /* (NK, D) the experts' outputs, summed over tp */
    float *s_gate, *s_up, *s_act; /* (N, Fs) the shared expert's (qwen2_moe), else empty */
    float *s_y;      /* (N, D) its output, summed over tp */
    float *s_logit;  /* (N) its sigmoid gate's logit */
} MoeRun;

/* Layer l's block on xb (N, D): out (N, D) as moe_forward (model.h), r filled (moe_run_free frees it). */
void moe_run(const Model *m, int l, const float *xb, int N, MoeRun *r, float *out);
void moe_run_free(MoeRun *r);
#endif
