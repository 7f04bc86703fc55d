/* cuda_vs_cpu.h — what the oracle harness's files share (tests/cuda/): cuda_vs_cpu.c (main, the
 * report, memory and the link), and the cases by entry family: matmul.c, matmul_tc.c (the tensor-core
 * kernel), attention.c, pointwise.c, logits.c, backward.c. Here: the tolerances' derivation, the two
 * tables, the random inputs, the comparisons, one call's backend memory, and each file's functions
 * the others call. A new entry's cases go in its family's file and its *_cases driver; main runs
 * the drivers in a fixed order (the random inputs are one seeded stream). */
#ifndef TANDEM_CUDA_VS_CPU_H
#define TANDEM_CUDA_VS_CPU_H
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "runtime/util.h"
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tolerances ---------------------------------------------------------------------------------
 * Both tables compute in fp32 (u = 2^-24, the unit roundoff). Where the contract fixes every
 * operation and each is one IEEE-rounded step (copies, selections, one add or subtract, a division
 * x / T, round-to-nearest-even to bf16), a conforming backend gives the same bits: those entries
 * must be bit-exact (any NaN matches any NaN; --self and the invariance checks want the same bits):
 *   copy, add_to, gather_rows, mask_cols, round_to, pack, unpack, embedding, kv_store, sub_at,
 *   pick_logits, row_max (max is order-free, then one division), argmax_rows (ids and values),
 *   embedding_backward with distinct ids (one add per element).
 * Everything else differs in summation order and in exp / log / cos ulps, and is compared relative
 * to a magnitude computed in double from the inputs ("mag"), with a bound written from the
 * arithmetic, not fitted to a run. gamma(n) = n u / (1 - n u) bounds the error of ANY order of
 * summing n terms (FMA or not) relative to the sum of their magnitudes (Higham, Accuracy and
 * Stability, 3.1), so two backends differ by at most 2 gamma(n) of it. Library ulps: glibc's
 * expf / logf / cosf / sinf within 1 ulp, CUDA's expf / cosf / sinf within 2 ulp and logf 1 ulp,
 * the CPU's exp16 (vec.h) within 2 ulp; 1 ulp <= 2u relative.
 *   matmul, matmuls      2 gamma(n_in + 1)  x sum_k |x w| + |bias|     (n_in products and the bias)
 *     bf16, tensor cores gamma(n_in + 1) + (1 + 2^-7) gamma(s(n_in))  x the same (kernels/cuda/matmul_tc.cu;
 *                        the CPU side as above). s(n_in) = max over the leaves l of 4 L + 3 + log2(l R),
 *                        L = 16 ceil(C / R) the longest run (C = ceil(KL / 16) chunks, KL = n_in / l,
 *                        R = mma_runs(KL)). The device splits x exactly into three bf16 pieces, |mid| +
 *                        |lo| < 2^-7 |x| (cuda.h), so their products' magnitudes sum to at most
 *                        (1 + 2^-7) sum |x w|; a product of bf16 values is exact; an mma step adds j <=
 *                        16 of them (in groups the hardware picks) to the accumulator c by aligning
 *                        every term to the largest, keeping at least 24 bits and truncating (Fasi et al.
 *                        2021, "Numerical behavior of NVIDIA tensor cores"; the PTX ISA: at least single
 *                        precision, order and rounding unspecified): each of the j smaller terms and
 *                        the final normalisation lose less than one ulp of the largest, so a step errs
 *                        by <= 2u (j + 1) (|c| + sum |p|). A run keeps each piece in its own
 *                        accumulator: one accumulator has at most L nonzero products in at most L steps
 *                        that hold one (a step of zeros is exact), the steps' 2 (j + 1) sum to <= 4 L,
 *                        and it is within gamma(4 L) of its magnitude (the product of the (1 + delta_i),
 *                        Higham 3.1); lo + mid and + hi are 2 fp32 roundings, the tree of the leaves x
 *                        R runs log2(l R) and the bias 1 more: gamma(4 L + 3 + log2(l R)). The runs
 *                        shrink it: the one accumulator per leaf before them was gamma(12 n_in + 1);
 *                        now L <= 512 unless R = 16 caps it (KL > 8192), so the CPU side's gamma(n_in
 *                        + 1) dominates. (A subnormal piece or product, handling unspecified, could lose
 *                        2^-126 each: no case's inputs have one.) The integer cases below stay exact:
 *                        every term and partial sum is an integer below 2^24, which 24 aligned bits hold.
 *     bf16, SIMT kernel  (TANDEM_CUDA_MATMUL=simt, the default; cuda_vs_cpu runs the bf16 matmul cases on
 *                        both) the fp32 kernel on the upcast weights: its bound, and its bits.
 *   matmul_backward      dx: 2 gamma(n_out) x sum |dout w|;  dw: 2 gamma(N + 1) x |dw0| + sum |dout x|;
 *                        db: 2 gamma(N + 1) x |db0| + sum |dout|       (the old value is one more term)
 *   rmsnorm              gamma(D) + 14u  x |w x| r, r = 1 / sqrt(mean x^2 + eps): per side the sum of
 *                        squares gamma(D), / D and + eps 2u, sqrt halves that, 1/sqrt or rsqrtf
 *                        (2 ulp) 4u more, then two products: gamma(D)/2 + 7u
 *   rmsnorm_backward     dx: 5 gamma(D) + 46u  x r (|g w| + |xh| sum_k |g w xh| / D): per side r as
 *                        above (gamma(D)/2 + 5u = e_r), xh = x r, the dot of D triple products
 *                        (e_r + 3u + gamma(D)), / D, xh c, g w, the subtraction, r: r's error enters
 *                        three times, 3 e_r + gamma(D) + 8u = 2.5 gamma(D) + 23u, doubled;
 *                        dw: gamma(D) + 14u + 2 gamma(N + 1)  x |dw0| + sum_n |g xh|
 *   rope, rope_backward  2 gamma(2)  x |a c| + |b s|    (a 2-term dot per element, FMA or not)
 *   rope_table           6u  x |cos| or |sin| of the fp32 angle: 1 + 2 ulp (the angle is one fp32
 *                        product, the same bits on both)
 *   swiglu               16u  x |silu(g) up| + FLT_MIN: per side exp 2 ulp (4u), then at most four
 *                        roundings (1 + e, the division or reciprocal and product, * up) = 8u; below
 *                        FLT_MIN a result may flush or come from exp's overflow (-0 for exact -1e-42)
 *   swiglu_backward      dup as swiglu; dgate: 20u  x |dout up sig| (1 + |g| + |F|) + FLT_MIN,
 *                        F = 1 + g (1 - sig): sig 6u, then at most six roundings, the cancellation in
 *                        1 - sig bounded by |g| times sig's absolute error
 *   row_sumexp           gamma(V) + 8u  x sum exp(x / T - mx): the argument is two IEEE operations
 *                        (same bits), exp 1 + 2 ulp (6u), a fp32 sum on the device gamma(V) (the
 *                        CPU sums in double), a final rounding each side (2u)
 *   row_entropy_part     gamma(V) + 9u  x sum exp(z - lse) |z|: as row_sumexp, plus the product by z
 *   log_add              6u  x |lse| + |log sum|: per side logf 1 ulp (2u), then the add (u)
 *   logprob_backward     14u  x |gn| (p + [target]) + |ge| p (|z - l| + |h| + |z - l + h|),
 *                        gn = dlogprob / T, ge = dH / T: exp 1 + 2 ulp (6u), per side at most four
 *                        roundings (4u each)
 *   embedding_backward   repeated ids: 2 gamma(c + 1)  x |t0| + sum |dout|, c the most repeats (the
 *                        device may add them in another order)
 *   attention            2 (e_p + gamma(n))  x sum_j p_j |v_j|, n the most visible keys, where e_p,
 *                        a probability's relative error on one side, is
 *                        E + gamma(n) + (5n + 5)u:  E = 2 gamma(Dh + 1) S + 8u S is the absolute
 *                        error of an exponent s_j - max s (two scores, each a Dh-term dot scaled,
 *                        S = max_j scale sum_d |q k_j|; the scale, the subtraction and a log2(e)
 *                        prescale round at most 8u S in all), exp 4u, the sum of the n numerators
 *                        gamma(n), the division u, and for an online softmax at most n rescales of
 *                        5u each; then o = sum_j p_j v_j adds gamma(n)
 *   attention_backward   with A_j = sum_d |dout v_j|, B = sum_j p_j A_j (dp_j = dout . v_j and
 *                        pdp = sum_j p_j dp_j or dout . o both within (e_p + gamma(n) + gamma(Dh) + u) B)
 *                        the error of ds_j is at most c p_j scale (A_j + B), c = 2 e_p + gamma(n) +
 *                        gamma(Dh) + 4u, so dq: 2 (c + gamma(n) + u)  x scale sum_j p_j (A_j + B) |k_j|;
 *                        dk: 2 (c + gamma(m) + u)  x scale sum_(i,h) p (A + B) |q_i|;
 *                        dv: 2 (e_p + gamma(m) + u)  x sum_(i,h) p |dout_i|, m = group x n
 * Wrong indexing, a lost bias, a missed key or head miss these by orders of magnitude. At n_in = 4096
 * the bound (5e-4) no longer separates a reduced-precision product (TF32: 2^-11 per product), so
 * matmul and matmul_backward also run on integers: one operand odd 12-bit integers (|v| in [2049,
 * 4095], exact in fp32, rounded by TF32 or bf16), the other +-1, with at most 4096 terms: every
 * partial sum in any order is an integer below 2^24, so any fp32 order is exact: bit-exact. matmul
 * also with x odd 20-bit integers and n_in <= 15 (15 (2^20 - 1) + 999 < 2^24): x needs all three of
 * the tensor-core kernel's bf16 pieces (8 + 8 + 4 bits), so a lost piece shows. */
static const double U = 0x1p-24;
static inline double gam(double n) { return n * U / (1.0 - n * U); }

extern const Backend *ref, *dut;   /* the oracle and the table under test (cuda_vs_cpu.c) */
extern int self_mode;              /* --self: dut is the CPU kernels too, every difference must be 0 */
extern const char *cur_entry;      /* the entry the running case compares (--corrupt's hook) */
extern int tc_mode;                /* the dut's bf16 matmul is the tensor-core kernel (matmul.c) */

/* ---- one call's backend memory (dput, dget, dfree) ---- */
typedef struct {
    const Backend *be;
    void *p[40];   /* what this call allocated, freed together */
    int n;
} Dev;
static inline size_t fb(size_t n) { return n * sizeof(float); }
static inline int threads(void) { return omp_get_max_threads(); }
static inline size_t nf(int a, int b) { return fb((size_t)a * b); }   /* bytes of an (a, b) fp32 array */
static inline size_t ni(int n) { return (size_t)n * sizeof(int); }
static inline size_t nw(DType wt, int a, int b) { return dtype_size(wt) * a * b; }

/* the tables, random inputs, the report, one call's memory (cuda_vs_cpu.c) */
uint64_t rand_u64(void);
float rand_uniform(void);
int rand_int(int n);
float *rand_f32(size_t n, float amp);
void *store_weight(float *f, DType dt, size_t n);
float *rand_weight(void **w, DType dt, size_t n, float amp);
float *rand_ints(size_t n, int bits);
void plant_specials(float *x, size_t n);
double *dzeros(size_t n);
void report(const char *entry, DType dt, const char *shape, double max_abs, double max_rel, double tol, int ok);
void cmp_exact(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n);
void cmp_tol(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n,
             const double *mag, double tol, double floor);
void cmp_bits(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n);
void cmp_ints(const char *entry, const char *shape, const int *got, const int *want, size_t n);
void cmp_bf16(const char *entry, const char *shape, const uint16_t *got, const uint16_t *want, size_t n);
void *dput(Dev *d, const void *host, size_t bytes);
void dget(Dev *d, void *host, const void *src, size_t bytes);
void dfree(Dev *d);
/* matmul.c */
double dot_mag(const float *a, const float *b, int n);
void run_matmul(const Backend *be, float *out, const float *x, const void *w, const void *bias, DType wt, int N,
                int n_in, int n_out, int leaves);
void inv_matmul_batch_x(int n_in, int n_out, int with_bias, DType wt, int leaves, int bf16x);
void inv_matmul_batch(int n_in, int n_out, int with_bias, DType wt, int leaves);
void inv_matmul_tp(int N, int n_in, int n_out, DType wt);
void inv_matmuls(int N, int n_in, DType wt);
void matmul_cases(int d0);
void inv_bf16_matmuls(void);
void simt_bf16_checks(void);
/* matmul_tc.c */
int hi_expected(int N, int n_in, int n_out, int leaves);
void inv_tc_fast(int N, int n_in, int n_out, int leaves, int kind);
void inv_tc_skip(int N, int n_in, int n_out, int leaves, int kind);
int geometry_checks(void);
/* attention.c */
int first_key(int i, int window);
int most_keys(int n_keys, int window);
double ref_probs(double *p, const float *qh, const float *kr, size_t kvd, int hk, int Dh, int j0, int i, double scale);
double softmax_eps(double S, int Dh, int n);
void inv_attention(int T, int H, int Hkv, int Dh, int window);
void attention_cases(void);
/* pointwise.c */
double rms_r(const float *x, int D, float eps);
double sigmoid(double g);
float *swiglu_gates(size_t n, int edges);
void inv_bf16_norm_embed(int N, int D);
void norm_rope_cases(void);
void elementwise_cases(void);
/* logits.c */
float *logits(int N, int V, float amp, int masked);
void true_lse(float *lse, const float *x, int N, int V, float T);
void logit_cases(void);
/* backward.c */
void run_rmsnorm_backward(const Backend *be, float *dx, float *dw, const float *dout, const float *x, const float *dw0,
                          const void *w, DType wt, int N, int D, float eps, int alias);
void inv_bf16_matmul_backward(int N, int n_in, int n_out);
void backward_cases(void);
#endif
