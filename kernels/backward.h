/* backward.h — backward kernels for training, one per forward kernel in kernels/kernels.h.
 * Pure math on pointers (STYLE.md 7): no communication, no allocation (the caller passes scratch),
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

/* Forward: out (N, n_out) = x (N, n_in) @ w (n_out, n_in)^T + b (n_out).
 * dx (N, n_in)  = dout (N, n_out) @ w            written; NULL skips it (first layer's input)
 * dw (n_out, n_in) += dout^T @ x                  accumulated
 * db (n_out)    += column sums of dout            accumulated; NULL for a layer without bias */
void cpu_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int N,
                         int n_in, int n_out);

/* Forward: out (N, D) = w (D) * (x * r), r = 1 / sqrt(mean(x^2) + eps) per row (HF order).
 * With xh = x * r and g = dout * w:  dx = r * (g - xh * mean(g * xh))   written (N, D)
 *                                   dw += sum over rows of dout * xh     accumulated (D) */
void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int D,
                          float eps);

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

/* ---- vocab-parallel cross-entropy --------------------------------------------------------------
 * Each TP rank holds logits (N, V_local) for its vocab shard [v0, v0 + V_local). Per row n with
 * target t_n (-1 = ignored position) and loss weight w_n (e.g. 1 / number of target tokens):
 *     loss = sum_n w_n * (lse_n - logit[n, t_n]),   lse_n = log sum over the FULL vocab of exp(logit)
 * Protocol (the caller owns the collectives; runtime/model.c model_logsumexp does steps 1-2):
 *   1. m_n   = max over the local shard;            tp all-reduce MAX -> global row max
 *   2. s_n   = sum_local exp(logit - m_n);           tp all-reduce SUM;  lse_n = m_n + log(s_n)
 *   3. cpu_xent_target_logit -> z_n (0 where the shard does not own t_n); tp all-reduce SUM -> the
 *      target's logit; loss and logprob (z_n - lse_n) follow on every rank
 *   4. cpu_xent_backward with the global lse: each rank gets its own shard of dlogits, no
 *      communication (the one-hot term lands only on the owner).
 * The gradient into the (vocab-parallel, column-split) lm_head then needs the usual tp all-reduce of
 * dx, as for any column-parallel matmul. */

/* z (N) = logits[n, t_n - v0] where v0 <= t_n < v0 + V_local, else 0 (also for t_n == -1).
 * logits (N, V_local), targets (N). */
void cpu_xent_target_logit(float *z, const float *logits, const int *targets, int N, int V_local, int v0);

/* dlogits (N, V_local) = w_n * (exp(logits - lse_n) - [v0 + c == t_n]), written (dlogits may be
 * logits itself: computed in place); rows with
 * t_n == -1 get 0. logits (N, V_local), lse (N) global (after step 2), targets (N), weight (N). */
void cpu_xent_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                       const float *weight, int N, int V_local, int v0);
#endif
