/* backward.h — CPU backward kernels for training, one per forward kernel in kernels/cpu/cpu.h.
 * Pure math on pointers (STYLE.md 7): no communication, no allocation (the caller passes scratch;
 * one exception: cpu_matmul_backward's bf16 row-block buffer),
 * no model knowledge. Row-major everywhere, the shape vocabulary of kernels.h (N tokens, T tokens
 * of one sequence, D model dim, H / Hkv heads, Dh head dim, V vocab, `_local` = this TP rank's share).
 *
 * Conventions:
 *   - d<name> is the gradient of the scalar loss with respect to <name>; dout is the gradient
 *     arriving at the forward kernel's output.
 *   - Parameter gradients (dw, db, dtable) ACCUMULATE (+=): micro-batches add into one gradient
 *     arena that the optimizer zeroes. Activation gradients (dx, dq, dk, dv, dgate, dup, dlogits)
 *     are WRITTEN (=), every element, so their buffers need no zeroing.
 *   - fp32 throughout, like the forward. Unlike the forward, nothing here is batch-invariant:
 *     training's gradients are summed and all-reduced anyway (matmuls go to OpenBLAS).
 * Oracle: PyTorch autograd (tests/fixtures/backward/make_backward_fixtures.py) and central finite
 * differences of the forward kernels themselves (tests/test_backward.c). */
#ifndef TANDEM_BACKWARD_H
#define TANDEM_BACKWARD_H
#include <stddef.h>
#include "kernels/kernels.h"   /* DType */

/* Forward: out (N, n_out) = x (N, n_in) @ w (n_out, n_in)^T + b (n_out); w of dtype wt (BF16: its
 * exact upcast, converted a block of rows at a time into a buffer this call allocates).
 * dx (N, n_in)  = dout (N, n_out) @ w            written; NULL skips it (first layer's input)
 * dw (n_out, n_in) += dout^T @ x                  accumulated
 * db (n_out)    += column sums of dout            accumulated; NULL for a layer without bias */
void cpu_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w, DType wt,
                         int N, int n_in, int n_out);

/* Forward: out (N, D) = w (D) * (x * r), r = 1 / sqrt(mean(x^2) + eps) per row (HF order).
 * With xh = x * r and g = dout * w:  dx = r * (g - xh * mean(g * xh))   written (N, D)
 *                                   dw += sum over rows of dout * xh     accumulated (D) */
void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt, int N,
                          int D, float eps);

/* In place on dx (N, n_heads * Dh): the gradient at cpu_rope's output becomes the gradient at its
 * input. RoPE is a rotation of each pair (i, i + Dh/2) by angle pos[n] * inv_freq[i], so its
 * backward is the inverse rotation (by minus the angle). cs (N, Dh): the forward's cpu_rope_table. */
void cpu_rope_backward(float *dx, const float *cs, int N, int n_heads, int Dh);

/* Backward of cpu_attention for ONE contiguous sequence of T tokens at positions 0 .. T-1 (block
 * table {0}, block >= T: the training case). Same masking: key j visible to query i iff
 * 0 <= i - j < window; window == 0 is full causal. Query head h uses kv head h / (H / Hkv).
 * q (T, H*Dh), k (T, Hkv*Dh), v (T, Hkv*Dh), dout (T, H*Dh).
 * dq (T, H*Dh) written; dk, dv (T, Hkv*Dh) written (for GQA, the sum over the H/Hkv query heads
 * that share each kv head).
 * The softmax probabilities are recomputed from q, k exactly as the forward computes them (nothing
 * from the forward is stored). With p the probabilities of query i, s its scores (scaled by
 * 1/sqrt(Dh)) and o its output:  dv_j += p_j dout_i;  dp_j = dout_i . v_j;
 * ds_j = p_j (dp_j - dout_i . o_i);  dq_i = sum_j ds_j k_j / sqrt(Dh);  dk_j += ds_j q_i / sqrt(Dh).
 * kv heads run in parallel (each owns its dk, dv columns), so
 * scratch: at least omp_get_max_threads() * 2 * T floats (the same per-thread rule as the forward). */
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch);

/* Forward: out (n) = silu(gate) * up, silu(g) = g * sigmoid(g).
 * dgate (n) = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g)))   written
 * dup (n)   = dout * silu(g)                                         written */
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* Vocab-parallel embedding: dtable (V_local, D) row (ids[n] - v0) += dout (N, D) row n for every
 * id in this shard [v0, v0 + V_local); ids (N) outside it are ignored (another rank owns them).
 * Accumulated; repeated ids add up (in increasing n). */
void cpu_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local);

/* ---- vocab-parallel logprobs and cross-entropy -------------------------------------------------
 * Each TP rank holds logits (N, V_local) for its vocab shard [v0, v0 + V_local). Per row n with
 * target t_n (-1 = no logprob wanted) the protocol (runtime/forward.c owns the collectives) is
 *   1. cpu_row_max over the shard;             tp all-reduce MAX -> global row max m_n (of x / T)
 *   2. cpu_row_sumexp of exp(x / T - m_n);      tp fixed-order SUM; lse_n = m_n + log(sum)
 *   3. cpu_pick_logits -> x[n, t_n] / T on the owner, 0 elsewhere; tp fixed-order SUM;
 *      lp_n = that - lse_n (the same float subtraction in generation and in training)
 *   4. the loss hook turns lp (N) into the loss and dlogprob (N); cpu_logprob_backward gives each
 *      rank its own shard of dlogits, no communication (the one-hot term lands only on the owner).
 * Cross-entropy is the hook loss = -sum_n w_n lp_n, dlogprob_n = -w_n (loss_xent, train/grad.c).
 * The gradient into the (vocab-parallel, column-split) lm_head then needs the usual tp all-reduce of
 * dx, as for any column-parallel matmul. */

/* ---- per-token logprobs (the loss hook's LM side) -----------------------------------------------
 * lp_n = x[n, t_n] / T - lse_n with lse_n the log-sum-exp of x[n, :] / T over the full vocab
 * (cpu_row_max / cpu_row_sumexp / cpu_pick_logits in cpu.h, all-reduced by the caller).
 * Given dlogprob_n = d loss / d lp_n (from the loss hook):
 *     dlogits[n, c] = -dlogprob_n / T * (exp(x[n, c] / T - lse_n) - [v0 + c == t_n])
 * written, in place allowed (dlogits == logits); rows with t_n == -1 get 0. For cross-entropy
 * (dlogprob = -w, T = 1) every element has cpu_xent_backward's bits: -(-w) / 1 == w exactly.
 * With dH (N) = d loss / d H_n, H_n the entropy of softmax(x[n, :] / T) (H (N) given; both NULL =
 * none), each element also gets the entropy's term
 *     dH_n * dH_n/dx[n, c] = dH_n * -(1 / T) p_c (x[n, c] / T - lse_n + H_n). */
void cpu_logprob_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                          const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0, float T);
#endif
