/* moe.h — the Mixture-of-Experts MLP block (runtime/moe.c): what one block's forward computes and
 * keeps, for the backward (train/moe_grad.c), which reruns the forward from the block's input
 * (the same bits) instead of keeping it for every layer. Host buffers (the CPU backend).
 * Shapes: N tokens, D, E experts, k choices per token, Fe / Fs the local widths of an expert and
 * of the shared expert; NK = N k rows grouped by expert; El = E / ep this rank's experts, P = ep and
 * R the rows they compute, every source rank's (expert parallelism: runtime/moe_ep.c; at ep 1 R = NK,
 * the same rows). */
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
    int R;           /* rows this rank's experts compute */
    int *cnt;        /* (P, El) rows source rank s sends for local expert j */
    int *loff;       /* (El P + 1) local expert j's rows from source s: [loff[j P + s], loff[j P + s + 1]) */
    float *xg;       /* (R, D) the local experts' input rows: expert-major, then source, tokens in order */
    float *gate, *up;/* (R, Fe) the experts' gate and up pre-activations */
    float *act;      /* (R, Fe) silu(gate) * up, rounded to the weights' dtype: down's input */
    float *yl;       /* (R, D) the local experts' outputs, summed over tp */
    float *y;        /* (NK, D) this rank's choices' outputs, grouped (back from the experts) */
    float *s_gate, *s_up, *s_act; /* (N, Fs) the shared expert's (qwen2_moe), else empty */
    float *s_y;      /* (N, D) its output, summed over tp */
    float *s_logit;  /* (N) its sigmoid gate's logit */
} MoeRun;

/* Layer l's block on xb (N, D): out (N, D) as moe_forward (model.h), r filled (moe_run_free frees it). */
void moe_run(const Model *m, int l, const float *xb, int N, MoeRun *r, float *out);
void moe_run_free(MoeRun *r);
/* moe_run with the lockstep's flag (runtime/moe_ep.c): idle 1 says this rank has no work left (N 0,
 * xb and out NULL); returns 1 when every rank of the ep group said idle in this call. */
int moe_run_ep(const Model *m, int l, const float *xb, int N, MoeRun *r, float *out, int idle);

/* ---- expert parallelism (runtime/moe_ep.c) ---- */
/* r's cnt, loff and R from r->start over the ep group (collective: an all-to-all of counts), each
 * rank saying idle or not; returns 1 when every rank said idle */
int moe_ep_plan(const Model *m, MoeRun *r, int idle);
/* home (NK, w), grouped, to the experts' ranks: local (R, w) expert-major (collective over ep) */
void moe_ep_dispatch(const Model *m, const MoeRun *r, float *home, float *local, int w);
/* the reverse: local (R, w) back to each row's home, home (NK, w) grouped */
void moe_ep_return(const Model *m, const MoeRun *r, float *local, float *home, int w);
/* training at ep > 1: source s's gradient of tensor t (0 gate, 1 up, 2 down) of local layer l's
 * local experts, (El, Fe D) floats, accumulated over the step's micro-batches; never with LoRA (frozen
 * experts: the buffer is not made) */
float *moe_ep_src_grads(const Model *m, int l, int t, int s);
#endif
