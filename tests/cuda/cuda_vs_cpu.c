/* cuda_vs_cpu.c — the oracle harness over two Backend tables (kernels/kernels.h): every compute entry
 * of a device-under-test table (dut) against the CPU table (ref = cpu_backend, whose contracts are
 * kernels/cpu/cpu.h and kernels/cpu/backward.h), on seeded random inputs of several shapes, fp32 and
 * bf16 weights; then the dut's own invariances, bit for bit: batch-invariant matmul (N = 1, 7, 8, 20, 37,
 * 64 vs 512, leaves, runs, unaligned operands), matmuls == matmul, attention independent of the cache
 * layout and of the prefill / decode / chunk split, bf16 entries == fp32 entries on the upcast weights
 * (CUDA's bf16 matmul on the tensor cores is another function: within its bound of its fp32 twin; the
 * CPU keeps the bits), the tensor cores' skip of zero mma's changing no bit. CUDA's bf16 matmul runs
 * both ways: the tensor cores (TANDEM_CUDA_MATMUL=tc) for everything, then the SIMT kernel (the
 * default) for the bf16 matmul cases and invariances. Host-side, in every run, GPU or not: both CUDA
 * matmuls' launch geometry, the tensor-core kernel's runs, fragment map against the PTX ISA's, exact
 * split of x and an emulation of its index arithmetic.
 * Every input reaches a table through its alloc + to_device and every result comes back through
 * its to_host; scratch arguments get a host-sized buffer (the CPU contract) from the table's alloc.
 * Owns: the cases, the per-entry tolerances (derived below) and the report. --self runs on
 * cpu_guarded_backend (kernels/cpu/guarded.c): every pointer an entry gets must lie in memory its
 * alloc returned, with the bytes the entry's contract reads or writes; the host never touches it.
 * Usage:  cuda_vs_cpu                     dut = backend_named("cuda")
 *         cuda_vs_cpu --self              dut = the CPU kernels behind cpu-guarded's memory: every case
 *                                         must differ by 0
 *         ... --corrupt[=ENTRY]           flips the lowest bit of one element of ENTRY's (default
 *                                         attention) first dut result: with --self the run must fail
 * Prints one line per case: "ok|FAIL entry dtype shape max_abs max_rel tol", then a summary.
 * Exit: 0 all pass, 1 any case fails, 77 "SKIP: <reason>" when the dut is not linked or its open()
 * says why it cannot run (bats reads 77 as skip), 2 bad usage. Does not test speed.
 * Run by tests/cuda.bats. */
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
static double gam(double n) { return n * U / (1.0 - n * U); }

static const Backend *ref, *dut;    /* the oracle and the table under test */
static int self_mode;               /* --self: dut is the CPU table too, every difference must be 0 */
static const char *cur_entry;       /* the entry the running case compares (--corrupt's hook) */
static const char *corrupt_entry;   /* --corrupt: the entry whose first dut result loses a bit */
static int corrupted;

/* The compute entries, each compared by at least one case (checked at the end), then memory. */
static const char *const ENTRIES[] = {
    "matmul", "matmuls", "rmsnorm", "round_to", "pack", "unpack", "rope_table", "rope", "kv_store",
    "attention", "swiglu", "add_to", "copy", "gather_rows", "embedding", "mask_cols", "argmax_rows",
    "row_max", "row_sumexp", "pick_logits", "log_add", "row_entropy_part", "sub_at", "matmul_backward",
    "rmsnorm_backward", "rope_backward", "attention_backward", "swiglu_backward", "embedding_backward",
    "logprob_backward", "kv_store_batch", "attention_batch", "scale", "dropout", "tree_sum", "memory"};
enum { N_ENTRIES = sizeof ENTRIES / sizeof ENTRIES[0] };
static int hits[N_ENTRIES];
static int n_cases, n_failed;

/* ---- random inputs ------------------------------------------------------------------------------ */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rand_u64(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static float rand_uniform(void) { return (float)(rand_u64() >> 40) / (float)(1 << 24) * 2.0f - 1.0f; } /* [-1, 1) */
static int rand_int(int n) { return (int)(rand_u64() % (uint64_t)n); }                              /* [0, n) */
static size_t fb(size_t n) { return n * sizeof(float); }
static int threads(void) { return omp_get_max_threads(); }

static float *rand_f32(size_t n, float amp) { /* (n) uniform in [-amp, amp) */
    float *a = xmalloc(fb(n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = amp * rand_uniform();
    return a;
}
/* f (n) stored as a weight of dtype dt (returned, host); bf16: f becomes the upcast of the rounded
 * values, the exact fp32 values the mags and the fp32 twin of a bf16 call read */
static void *store_weight(float *f, DType dt, size_t n) {
    if (dt == DTYPE_F32) {
        void *w = xmalloc(fb(n ? n : 1));
        memcpy(w, f, fb(n));
        return w;
    }
    uint16_t *h = xmalloc(2 * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        h[i] = f32_to_bf16(f[i]);
        f[i] = bf16_to_f32(h[i]);
    }
    return h;
}
/* A random weight of n elements stored in dtype dt (*w, host); returns its exact fp32 values. */
static float *rand_weight(void **w, DType dt, size_t n, float amp) {
    float *f = rand_f32(n, amp);
    *w = store_weight(f, dt, n);
    return f;
}
/* (n) integers exact in fp32: bits 0: +-1; else odd, |v| in [2^(bits-1) + 1, 2^bits - 1] (bits significant
 * bits; 12: [2049, 4095]) */
static float *rand_ints(size_t n, int bits) {
    float *a = xmalloc(fb(n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float m = bits ? (float)((1 << (bits - 1)) + 1 + 2 * rand_int(1 << (bits - 2))) : 1.0f;
        a[i] = rand_u64() >> 63 ? -m : m;
    }
    return a;
}
/* x[0..) gets the values at the edges of rounding first: ties to even down and up, a tie up to inf,
 * NaNs (quiet, signalling, negative), infinities, the largest float, a subnormal, -0 */
static void plant_specials(float *x, size_t n) {
    static const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7f8000u, 0x7fc00000u,
                                    0x7fa00001u, 0xffc12345u, 0xff800000u, 0x7f800000u, 0x7f7fffffu,
                                    0x00012345u, 0x80000000u, 0xbf7f8000u, 0x00000001u};
    for (size_t i = 0; i < n && i < sizeof bits / sizeof bits[0]; i++) memcpy(x + i, bits + i, 4);
}
static double *dzeros(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }

/* ---- the report ---------------------------------------------------------------------------------- */
static void mark(const char *entry) {
    size_t len = strcspn(entry, ".");
    for (int i = 0; i < N_ENTRIES; i++)
        if (strlen(ENTRIES[i]) == len && !strncmp(ENTRIES[i], entry, len)) hits[i]++;
}
static void report(const char *entry, DType dt, const char *shape, double max_abs, double max_rel, double tol, int ok) {
    if (self_mode && max_abs != 0.0) ok = 0;   /* --self: the harness must see no difference at all */
    n_cases++;
    n_failed += !ok;
    mark(entry);
    printf("%-4s %-27s %-4s %-46s %.3e %.3e %.3e\n", ok ? "ok" : "FAIL", entry, dtype_name(dt), shape, max_abs, max_rel,
           tol);
}

/* got vs want, n floats. mag NULL: exact (the same bits, or both NaN). Else |got - want| <= tol *
 * mag[i] + floor. strict or --self: the same bits, always. max_rel is relative to mag (else |want|). */
static void cmp_floats(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n,
                       const double *mag, double tol, double floor, int strict) {
    double max_abs = 0.0, max_rel = 0.0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        int same = !memcmp(got + i, want + i, sizeof(float)), nans = isnan(got[i]) && isnan(want[i]);
        double d = same ? 0.0 : fabs((double)got[i] - (double)want[i]);
        if (nans && !strict && !self_mode) d = 0.0;
        if (isnan(d)) d = INFINITY;   /* one side NaN: as far apart as can be */
        double m = mag ? mag[i] : fabs((double)want[i]);
        double rel = d == 0.0 ? 0.0 : m > 0.0 ? d / m : INFINITY;
        int good = same || (!strict && !self_mode && (nans || (mag && d <= tol * m + floor)));
        ok &= good;
        if (!(d <= max_abs)) max_abs = d;
        if (!(rel <= max_rel)) max_rel = rel;
    }
    report(entry, dt, shape, max_abs, max_rel, mag ? tol : 0.0, ok);
}
static void cmp_exact(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n) {
    cmp_floats(entry, dt, shape, got, want, n, NULL, 0.0, 0.0, 0);
}
static void cmp_tol(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n,
                    const double *mag, double tol, double floor) {
    cmp_floats(entry, dt, shape, got, want, n, mag, tol, floor, 0);
}
/* the dut against itself: the same bits */
static void cmp_bits(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n) {
    cmp_floats(entry, dt, shape, got, want, n, NULL, 0.0, 0.0, 1);
}
static void cmp_ints(const char *entry, const char *shape, const int *got, const int *want, size_t n) {
    double max_abs = 0.0;
    for (size_t i = 0; i < n; i++) max_abs = fmax(max_abs, fabs((double)got[i] - want[i]));
    report(entry, DTYPE_F32, shape, max_abs, 0.0, 0.0, max_abs == 0.0);
}
static int bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
static void cmp_bf16(const char *entry, const char *shape, const uint16_t *got, const uint16_t *want, size_t n) {
    double max_abs = 0.0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (got[i] == want[i] || (!self_mode && bf16_nan(got[i]) && bf16_nan(want[i]))) continue;
        ok = 0;
        double d = fabs((double)bf16_to_f32(got[i]) - bf16_to_f32(want[i]));
        max_abs = isnan(d) || isinf(d) ? INFINITY : fmax(max_abs, d);
        if (max_abs == 0.0) max_abs = INFINITY;   /* -0 vs 0 */
    }
    report(entry, DTYPE_BF16, shape, max_abs, 0.0, 0.0, ok);
}

/* ---- one call's backend memory ----------------------------------------------------------------- */
typedef struct {
    const Backend *be;
    void *p[40];   /* what this call allocated, freed together */
    int n;
} Dev;
/* bytes of be's memory holding host (NULL: zeroed, alloc's contract) */
static void *dput(Dev *d, const void *host, size_t bytes) {
    if (d->n == (int)(sizeof d->p / sizeof d->p[0])) {
        fprintf(stderr, "cuda_vs_cpu: too many buffers in one call\n");
        exit(2);
    }
    void *p = d->be->alloc(bytes);
    if (host) d->be->to_device(p, host, bytes);
    d->p[d->n++] = p;
    return p;
}
/* a result back to the host; --corrupt flips the lowest bit of element n/2 of one dut result */
static void dget(Dev *d, void *host, const void *src, size_t bytes) {
    d->be->to_host(host, src, bytes);
    if (d->be == dut && corrupt_entry && !corrupted && cur_entry && !strcmp(cur_entry, corrupt_entry) && bytes >= 4) {
        ((unsigned char *)host)[bytes / 8 * 4] ^= 1;   /* little-endian: the low byte of element n/2 */
        corrupted = 1;
    }
}
static void dfree(Dev *d) {
    while (d->n > 0) d->be->free(d->p[--d->n]);
}

static size_t nf(int a, int b) { return fb((size_t)a * b); }   /* bytes of an (a, b) fp32 array */
static size_t ni(int n) { return (size_t)n * sizeof(int); }
static size_t nw(DType wt, int a, int b) { return dtype_size(wt) * a * b; }

/* ---- memory: alloc zeroes, to_device / to_host round-trip, zero clears a range ------------------ */
static void case_memory(void) {
    cur_entry = "memory";
    enum { BYTES = 4099 };
    unsigned char host[BYTES], back[BYTES];
    for (int i = 0; i < BYTES; i++) host[i] = (unsigned char)rand_u64();
    float want[BYTES / 4 + 1], got[BYTES / 4 + 1];
    Dev d = {dut, {0}, 0};
    unsigned char *p = dput(&d, NULL, BYTES);
    dget(&d, back, p, BYTES);
    int fresh_zero = 1;
    for (int i = 0; i < BYTES; i++) fresh_zero &= back[i] == 0;
    dut->to_device(p, host, BYTES);
    dut->zero(p + 100, 1000);
    unsigned char *q = dput(&d, NULL, BYTES);   /* bytes [7, 3007) of p to q + 1: odd offsets and length */
    dut->copy_bytes(q + 1, p + 7, 3000);
    dut->copy_bytes(p + 3500, q + 1 + 93, 501);
    dget(&d, back, p, BYTES);
    memset(host + 100, 0, 1000);
    memmove(host + 3500, host + 7 + 93, 501);
    dut->free(NULL);          /* a no-op */
    dut->free(dut->alloc(0)); /* a zero-byte buffer is a buffer */
    dfree(&d);
    memcpy(want, host, BYTES / 4 * 4), memcpy(got, back, BYTES / 4 * 4);
    cmp_bits("memory.round_trip_zero", DTYPE_F32, "bytes=4099,zero=[100,1100),copy_bytes", got, want, BYTES / 4);
    int tail_ok = !memcmp(host + BYTES / 4 * 4, back + BYTES / 4 * 4, BYTES % 4);
    report("memory.alloc_zeroed_tail", DTYPE_F32, "bytes=4099", fresh_zero && tail_ok ? 0.0 : INFINITY, 0.0, 0.0,
           fresh_zero && tail_ok);
}

/* ---- matmul, matmuls ---------------------------------------------------------------------------- */
static double dot_mag(const float *a, const float *b, int n) { /* sum |a b| in double */
    double s = 0.0;
    for (int k = 0; k < n; k++) s += fabs((double)a[k] * b[k]);
    return s;
}
/* off 1: x and w one element past an aligned start (4 and 2 bytes for bf16: no 16- or 8-byte loads) */
static void run_matmul_at(const Backend *be, float *out, const float *x, const void *w, const void *bias, DType wt,
                          int N, int n_in, int n_out, int leaves, int off) {
    Dev d = {be, {0}, 0};
    size_t es = dtype_size(wt);
    float *o = dput(&d, NULL, nf(N, n_out));
    float *dx = (float *)dput(&d, NULL, nf(N, n_in) + fb(off)) + off;
    char *dw = (char *)dput(&d, NULL, nw(wt, n_out, n_in) + es * off) + es * off;
    be->to_device(dx, x, nf(N, n_in));
    be->to_device(dw, w, nw(wt, n_out, n_in));
    const void *db = bias ? dput(&d, bias, nw(wt, n_out, 1)) : NULL;
    be->matmul(o, dx, dw, db, wt, N, n_in, n_out, leaves);
    dget(&d, out, o, nf(N, n_out));
    dfree(&d);
}
static void run_matmul(const Backend *be, float *out, const float *x, const void *w, const void *bias, DType wt, int N,
                       int n_in, int n_out, int leaves) {
    run_matmul_at(be, out, x, w, bias, wt, N, n_in, n_out, leaves, 0);
}
/* The matmul's bound relative to matmul_mag (the tolerance comment): on a GPU a bf16 weight takes the
 * tensor-core kernel; --self compares the CPU with itself (any bound: it must be 0) */
static int tc_mode;   /* the dut's bf16 matmul is the tensor-core kernel (cuda_matmul_set_simt_bf16(0)) */
/* s(n_in) of the tolerance comment: the steps of the longest accumulator chain and the roundings after */
static double tc_steps(int n_in) {
    double s = 0.0;
    for (int l = 1; l <= MMA_MAX_LEAVES; l *= 2) {
        if (n_in % l) break;
        int KL = n_in / l, C = (KL + MMA_K - 1) / MMA_K, R = mma_runs(KL), lg = 0;
        for (int v = l * R; v > 1; v /= 2) lg++;
        s = fmax(s, 4.0 * MMA_K * ((C + R - 1) / R) + 3 + lg);
    }
    return s;
}
static double matmul_tol(DType wt, int n_in) {
    if (wt == DTYPE_BF16 && tc_mode) return gam(n_in + 1) + (1 + 0x1p-7) * gam(tc_steps(n_in));
    return 2 * gam(n_in + 1);
}
/* mag (N, n_out) = sum_k |x w| + |bias| */
static double *matmul_mag(const float *x, const float *wf, const float *bf, int N, int n_in, int n_out) {
    double *mag = dzeros((size_t)N * n_out);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < n_out; j++)
            mag[(size_t)n * n_out + j] =
                dot_mag(x + (size_t)n * n_in, wf + (size_t)j * n_in, n_in) + (bf ? fabs(bf[j]) : 0.0);
    return mag;
}
/* leaves: the tree of leaf sums (kernels.h) adds log2(leaves) roundings to a leaf's n_in / leaves:
 * within the bound of n_in + 1 */
static void case_matmul(int N, int n_in, int n_out, int with_bias, DType wt, int leaves) {
    cur_entry = "matmul";
    void *w, *b = NULL;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *bf = with_bias ? rand_weight(&b, wt, n_out, 1.0f) : NULL;
    size_t no = (size_t)N * n_out;
    float *want = xmalloc(fb(no)), *got = xmalloc(fb(no));
    run_matmul(ref, want, x, w, b, wt, N, n_in, n_out, leaves);
    run_matmul(dut, got, x, w, b, wt, N, n_in, n_out, leaves);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d%s,leaves=%d", N, n_in, n_out, with_bias ? ",bias" : "", leaves);
    cmp_tol("matmul", wt, sh, got, want, no, mag, matmul_tol(wt, n_in), 0.0);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got), free(mag);
}
/* x and w one element past an aligned start (no vector loads): within the bound of the ref, and the
 * dut's bits of the aligned call (the same values in the same order, element by element) */
static void case_matmul_unaligned(int N, int n_in, int n_out, DType wt, int leaves) {
    cur_entry = "matmul";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *bf = rand_weight(&b, wt, n_out, 1.0f);
    size_t no = (size_t)N * n_out;
    float *want = xmalloc(fb(no)), *got = xmalloc(fb(no)), *aligned = xmalloc(fb(no));
    run_matmul_at(ref, want, x, w, b, wt, N, n_in, n_out, leaves, 1);
    run_matmul_at(dut, got, x, w, b, wt, N, n_in, n_out, leaves, 1);
    run_matmul_at(dut, aligned, x, w, b, wt, N, n_in, n_out, leaves, 0);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,bias,leaves=%d,unaligned", N, n_in, n_out, leaves);
    cmp_tol("matmul", wt, sh, got, want, no, mag, matmul_tol(wt, n_in), 0.0);
    cmp_bits("inv.matmul_unaligned", wt, sh, got, aligned, no);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got), free(aligned), free(mag);
}

/* x: odd integers of `bits` bits (12: n_in <= 4096; 20: n_in <= 15), w: +-1, bias: integers below 1000:
 * exact in any order */
static void case_matmul_ints(int N, int n_in, int n_out, DType wt, int bits) {
    cur_entry = "matmul";
    float *x = rand_ints((size_t)N * n_in, bits), *wf = rand_ints((size_t)n_out * n_in, 0), *bf = xmalloc(fb(n_out));
    for (int j = 0; j < n_out; j++) bf[j] = (float)(rand_int(1999) - 999);
    void *w = store_weight(wf, wt, (size_t)n_out * n_in), *b = store_weight(bf, wt, n_out);
    float *want = xmalloc(nf(N, n_out)), *got = xmalloc(nf(N, n_out));
    run_matmul(ref, want, x, w, b, wt, N, n_in, n_out, 1);
    run_matmul(dut, got, x, w, b, wt, N, n_in, n_out, 1);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,bias,ints%d_exact", N, n_in, n_out, bits);
    cmp_exact("matmul", wt, sh, got, want, (size_t)N * n_out);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got);
}

/* Up to 4 weights read the same x. */
typedef struct {
    int n;
    int n_out[4];
    void *w[4], *b[4];    /* host, in the call's dtype; b[j] NULL: no bias */
    float *wf[4], *bf[4]; /* their fp32 values */
} MatmulSet;
static MatmulSet matmul_set(int n, const int *n_out, const int *bias, int n_in, DType wt) {
    MatmulSet s = {.n = n};
    for (int j = 0; j < n; j++) {
        s.n_out[j] = n_out[j];
        s.wf[j] = rand_weight(&s.w[j], wt, (size_t)n_out[j] * n_in, 1.0f);
        s.bf[j] = bias[j] ? rand_weight(&s.b[j], wt, n_out[j], 1.0f) : NULL;
    }
    return s;
}
static void free_set(MatmulSet *s) {
    for (int j = 0; j < s->n; j++) free(s->w[j]), free(s->b[j]), free(s->wf[j]), free(s->bf[j]);
}
static void run_matmuls(const Backend *be, float **outs, const float *x, int N, int n_in, const MatmulSet *s, DType wt) {
    Dev d = {be, {0}, 0};
    MatmulOut mo[4];
    const float *dx = dput(&d, x, nf(N, n_in));
    for (int j = 0; j < s->n; j++) {
        mo[j].out = dput(&d, NULL, nf(N, s->n_out[j]));
        mo[j].w = dput(&d, s->w[j], nw(wt, s->n_out[j], n_in));
        mo[j].bias = s->b[j] ? dput(&d, s->b[j], nw(wt, s->n_out[j], 1)) : NULL;
        mo[j].n_out = s->n_out[j];
    }
    be->matmuls(dx, N, n_in, mo, s->n, wt);
    for (int j = 0; j < s->n; j++) dget(&d, outs[j], mo[j].out, nf(N, s->n_out[j]));
    dfree(&d);
}
static void case_matmuls(int N, int n_in, int n, const int *n_out, const int *bias, DType wt) {
    cur_entry = "matmuls";
    MatmulSet s = matmul_set(n, n_out, bias, n_in, wt);
    float *x = rand_f32((size_t)N * n_in, 1.0f), *want[4], *got[4];
    for (int j = 0; j < n; j++) want[j] = xmalloc(nf(N, n_out[j])), got[j] = xmalloc(nf(N, n_out[j]));
    run_matmuls(ref, want, x, N, n_in, &s, wt);
    run_matmuls(dut, got, x, N, n_in, &s, wt);
    for (int j = 0; j < n; j++) {
        double *mag = matmul_mag(x, s.wf[j], s.bf[j], N, n_in, n_out[j]);
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,out=%d/%d,n_out=%d%s", N, n_in, j + 1, n, n_out[j], bias[j] ? ",bias" : "");
        cmp_tol("matmuls", wt, sh, got[j], want[j], (size_t)N * n_out[j], mag, matmul_tol(wt, n_in), 0.0);
        free(mag), free(want[j]), free(got[j]);
    }
    free(x);
    free_set(&s);
}

/* ---- rmsnorm ------------------------------------------------------------------------------------ */
static void run_rmsnorm(const Backend *be, float *out, const float *x, const void *w, DType wt, int N, int D, float eps) {
    Dev d = {be, {0}, 0};
    float *o = dput(&d, NULL, nf(N, D));
    be->rmsnorm(o, dput(&d, x, nf(N, D)), dput(&d, w, nw(wt, D, 1)), wt, N, D, eps);
    dget(&d, out, o, nf(N, D));
    dfree(&d);
}
static double rms_r(const float *x, int D, float eps) { /* 1 / sqrt(mean x^2 + eps), in double */
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / D + eps);
}
static void case_rmsnorm(int N, int D, float eps, float amp, int zero_row, DType wt) {
    cur_entry = "rmsnorm";
    void *w;
    float *x = rand_f32((size_t)N * D, amp), *wf = rand_weight(&w, wt, D, 1.0f);
    if (zero_row) memset(x, 0, fb(D));   /* eps alone: the output must be exactly 0 */
    float *want = xmalloc(nf(N, D)), *got = xmalloc(nf(N, D));
    run_rmsnorm(ref, want, x, w, wt, N, D, eps);
    run_rmsnorm(dut, got, x, w, wt, N, D, eps);
    double *mag = dzeros((size_t)N * D);
    for (int n = 0; n < N; n++) {
        double r = rms_r(x + (size_t)n * D, D, eps);
        for (int i = 0; i < D; i++) mag[(size_t)n * D + i] = fabs((double)wf[i] * x[(size_t)n * D + i]) * r;
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,eps=%.0e,amp=%g%s", N, D, (double)eps, (double)amp, zero_row ? ",zero_row" : "");
    cmp_tol("rmsnorm", wt, sh, got, want, (size_t)N * D, mag, gam(D) + 14 * U, 0.0);
    free(x), free(w), free(wf), free(want), free(got), free(mag);
}

/* ---- round_to, pack, unpack ------------------------------------------------------------------------ */
static void case_round_to(size_t n, DType t) {
    cur_entry = "round_to";
    float *x = rand_f32(n, 3.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    float *res[2] = {want, got};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dx = dput(&d, x, fb(n));
        be[s]->round_to(dx, n, t);
        dget(&d, res[s], dx, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,specials", n);
    cmp_exact("round_to", t, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_pack(size_t n, DType t) {
    cur_entry = "pack";
    size_t bytes = dtype_size(t) * n;
    float *x = rand_f32(n, 3.0f);
    unsigned char *res[2] = {xmalloc(bytes), xmalloc(bytes)};
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        void *dst = dput(&d, NULL, bytes);
        be[s]->pack(dst, t, dput(&d, x, fb(n)), n);
        dget(&d, res[s], dst, bytes);
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,specials", n);
    if (t == DTYPE_BF16) cmp_bf16("pack", sh, (uint16_t *)res[1], (uint16_t *)res[0], n);
    else cmp_exact("pack", t, sh, (float *)res[1], (float *)res[0], n);
    free(x), free(res[0]), free(res[1]);
}
static void case_unpack(size_t n, DType t) {
    cur_entry = "unpack";
    size_t bytes = dtype_size(t) * n;
    unsigned char *src = xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)rand_u64();   /* every bit pattern, NaNs too */
    float *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dst = dput(&d, NULL, fb(n));
        be[s]->unpack(dst, dput(&d, src, bytes), t, n);
        dget(&d, res[s], dst, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,random_bits", n);
    cmp_exact("unpack", t, sh, got, want, n);
    free(src), free(want), free(got);
}

/* ---- rope_table, rope, rope_backward ----------------------------------------------------------------- */
static void case_rope_table(int N, const int *pos, int Dh, double theta) {
    cur_entry = "rope_table";
    int half = Dh / 2;
    float *inv = xmalloc(fb(half)), *want = xmalloc(nf(N, Dh)), *got = xmalloc(nf(N, Dh)), *res[2] = {want, got};
    for (int i = 0; i < half; i++) inv[i] = (float)pow(theta, -2.0 * i / Dh);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *cs = dput(&d, NULL, nf(N, Dh));
        be[s]->rope_table(cs, dput(&d, pos, ni(N)), dput(&d, inv, fb(half)), N, Dh);
        dget(&d, res[s], cs, nf(N, Dh));
        dfree(&d);
    }
    double *mag = dzeros((size_t)N * Dh);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[n] * inv[i];   /* the contract's fp32 angle */
            mag[(size_t)n * Dh + i] = fabs(cos((double)angle));
            mag[(size_t)n * Dh + half + i] = fabs(sin((double)angle));
        }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,Dh=%d,theta=%g,max_pos=%d", N, Dh, theta, pos[N - 1]);
    cmp_tol("rope_table", DTYPE_F32, sh, got, want, (size_t)N * Dh, mag, 6 * U, 0.0);
    free(inv), free(want), free(got), free(mag);
}
/* rope (backward 0) or rope_backward (1) in place on x (N, n_heads * Dh) */
static void run_rope(const Backend *be, int backward, float *out, const float *x, const float *cs, int N, int n_heads,
                     int Dh) {
    Dev d = {be, {0}, 0};
    size_t n = (size_t)N * n_heads * Dh;
    float *dx = dput(&d, x, fb(n)), *dcs = dput(&d, cs, nf(N, Dh));
    if (backward) be->rope_backward(dx, dcs, N, n_heads, Dh);
    else be->rope(dx, dcs, N, n_heads, Dh);
    dget(&d, out, dx, fb(n));
    dfree(&d);
}
static void case_rope(int backward, int N, int n_heads, int Dh) {
    const char *entry = backward ? "rope_backward" : "rope";
    cur_entry = entry;
    int half = Dh / 2;
    size_t n = (size_t)N * n_heads * Dh;
    float *x = rand_f32(n, 2.0f), *cs = xmalloc(nf(N, Dh)), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    for (int r = 0; r < N; r++)
        for (int i = 0; i < half; i++) {
            double a = 100.0 * rand_uniform();
            cs[(size_t)r * Dh + i] = (float)cos(a), cs[(size_t)r * Dh + half + i] = (float)sin(a);
        }
    run_rope(ref, backward, want, x, cs, N, n_heads, Dh);
    run_rope(dut, backward, got, x, cs, N, n_heads, Dh);
    double *mag = dzeros(n);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                const float *xh = x + ((size_t)r * n_heads + h) * Dh;
                double c = fabs(cs[(size_t)r * Dh + i]), s = fabs(cs[(size_t)r * Dh + half + i]);
                double m = fabs((double)xh[i]) * c + fabs((double)xh[i + half]) * s;   /* |a c| + |b s| */
                double m2 = fabs((double)xh[i + half]) * c + fabs((double)xh[i]) * s;
                mag[((size_t)r * n_heads + h) * Dh + i] = m, mag[((size_t)r * n_heads + h) * Dh + half + i] = m2;
            }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,heads=%d,Dh=%d", N, n_heads, Dh);
    cmp_tol(entry, DTYPE_F32, sh, got, want, n, mag, 2 * gam(2), 0.0);
    free(x), free(cs), free(want), free(got), free(mag);
}

/* ---- the KV cache: pools, tables, kv_store -------------------------------------------------------- */
/* [0, n_pool) shuffled: its first entries, as many as a sequence needs, are its block table */
static int *shuffled_table(int n_pool) {
    int *ids = xmalloc(ni(n_pool));
    for (int i = 0; i < n_pool; i++) ids[i] = i;
    for (int i = n_pool - 1; i > 0; i--) {
        int j = rand_int(i + 1), t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    return ids;
}
/* The paged pool (n_pool, Hkv, block, Dh) holding rows kr (n_keys, Hkv * Dh) through table (host);
 * the slots no key fills hold NaN: a recycled block may hold anything, so a key past the query or
 * an unused slot must never reach an output (0 * NaN is NaN) */
static float *to_pool(const float *kr, int n_keys, int Hkv, int Dh, int block, const int *table, int n_pool) {
    size_t kvd = (size_t)Hkv * Dh, n = (size_t)n_pool * block * kvd;
    float *pool = xmalloc(fb(n));
    for (size_t i = 0; i < n; i++) pool[i] = NAN;
    KVLayout kv = kv_paged(table, block, Dh);   /* a host table: host-side offsets only */
    for (int j = 0; j < n_keys; j++)
        for (int hk = 0; hk < Hkv; hk++)
            memcpy(pool + kv_offset(&kv, kvd, j) + hk * kv.head, kr + j * kvd + (size_t)hk * Dh, fb(Dh));
    return pool;
}
/* T rows k, v stored at positions pos into pools (n_pool blocks) through table (NULL: kv_rows of n_pool * block
 * positions); the pools start as kc0, vc0 */
static void case_kv_store(int T, const int *pos, int Hkv, int Dh, int block, int n_table, int n_pool) {
    cur_entry = "kv_store";
    size_t kvd = (size_t)Hkv * Dh, pn = (size_t)n_pool * block * kvd;
    float *k = rand_f32(T * kvd, 1.0f), *v = rand_f32(T * kvd, 1.0f);   /* (T, Hkv*Dh) */
    float *kc0 = rand_f32(pn, 1.0f), *vc0 = rand_f32(pn, 1.0f);          /* the pools before: (pn) */
    int *table = n_table ? shuffled_table(n_pool) : NULL;
    float *kw = xmalloc(fb(pn)), *vw = xmalloc(fb(pn)), *kg = xmalloc(fb(pn)), *vg = xmalloc(fb(pn));
    float *kres[2] = {kw, kg}, *vres[2] = {vw, vg};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *kc = dput(&d, kc0, fb(pn)), *vc = dput(&d, vc0, fb(pn));
        KVLayout kv = table ? kv_paged(dput(&d, table, ni(n_table)), block, Dh) : kv_rows(n_pool * block, Hkv, Dh);
        const float *dk = dput(&d, k, fb(T * kvd)), *dv = dput(&d, v, fb(T * kvd));
        be[s]->kv_store(kc, vc, dk, dv, &kv, dput(&d, pos, ni(T)), T, Hkv, Dh);
        dget(&d, kres[s], kc, fb(pn)), dget(&d, vres[s], vc, fb(pn));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,Hkv=%d,Dh=%d,%s,block=%d", T, Hkv, Dh, table ? "paged" : "rows", block);
    cmp_exact("kv_store.k", DTYPE_F32, sh, kg, kw, pn);
    cmp_exact("kv_store.v", DTYPE_F32, sh, vg, vw, pn);
    free(k), free(v), free(kc0), free(vc0), free(table), free(kw), free(vw), free(kg), free(vg);
}

/* ---- attention -------------------------------------------------------------------------------------- */
typedef struct {
    int Tq, q_pos0, H, Hkv, Dh, window, block; /* block 0: kv_rows */
    float *q;                                  /* (Tq, H * Dh) */
    float *kr, *vr;                            /* the keys and values as rows (n_keys, Hkv * Dh) */
    float *k, *v;                              /* what the entry reads: kr, vr, or pools (n_pool, Hkv, block, Dh) */
    size_t kv_floats;                          /* floats in k (and in v) */
    int *table, n_table;                       /* paged: the block table (n_table), host */
} AttnIn;

static int first_key(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }
static int most_keys(int n_keys, int window) { return window > 0 && window < n_keys ? window : n_keys; }

static AttnIn attn_in(int Tq, int q_pos0, int H, int Hkv, int Dh, int window, int block, float amp) {
    int n_keys = q_pos0 + Tq;
    size_t kvd = (size_t)Hkv * Dh;
    AttnIn a = {Tq, q_pos0, H, Hkv, Dh, window, block, NULL, NULL, NULL, NULL, NULL, 0, NULL, 0};
    a.q = rand_f32((size_t)Tq * H * Dh, amp);
    a.kr = rand_f32(n_keys * kvd, amp), a.vr = rand_f32(n_keys * kvd, 1.0f);
    a.k = a.kr, a.v = a.vr, a.kv_floats = n_keys * kvd;
    if (block) {
        a.n_table = (n_keys + block - 1) / block;
        int n_pool = a.n_table + 2;
        a.table = shuffled_table(n_pool);
        a.k = to_pool(a.kr, n_keys, Hkv, Dh, block, a.table, n_pool);
        a.v = to_pool(a.vr, n_keys, Hkv, Dh, block, a.table, n_pool);
        a.kv_floats = (size_t)n_pool * block * kvd;
    }
    return a;
}
static void free_attn(AttnIn *a) {
    if (a->block) free(a->k), free(a->v);
    free(a->q), free(a->kr), free(a->vr), free(a->table);
}
static void run_attention(const Backend *be, float *out, const AttnIn *a) {
    Dev d = {be, {0}, 0};
    int n_keys = a->q_pos0 + a->Tq;
    size_t qn = (size_t)a->Tq * a->H * a->Dh;
    float *o = dput(&d, NULL, fb(qn)), *sc = dput(&d, NULL, nf(threads() * a->H, n_keys));
    KVLayout kv = kv_rows(n_keys, a->Hkv, a->Dh);
    if (a->block) kv = kv_paged(dput(&d, a->table, ni(a->n_table)), a->block, a->Dh);
    const float *q = dput(&d, a->q, fb(qn)), *k = dput(&d, a->k, fb(a->kv_floats)), *v = dput(&d, a->v, fb(a->kv_floats));
    be->attention(o, q, k, v, &kv, a->Tq, a->q_pos0, a->H, a->Hkv, a->Dh, a->window, sc);
    dget(&d, out, o, fb(qn));
    dfree(&d);
}
/* p[j0..i] = the softmax of query qh (Dh) over keys j0..i of kv head hk in rows kr (., kvd), in
 * double; returns max_j scale sum_d |q_d k_jd| (the S of the tolerance) */
static double ref_probs(double *p, const float *qh, const float *kr, size_t kvd, int hk, int Dh, int j0, int i,
                        double scale) {
    double mx = -INFINITY, S = 0.0, sum = 0.0;
    for (int j = j0; j <= i; j++) {
        const float *kj = kr + j * kvd + (size_t)hk * Dh;
        double s = 0.0;
        for (int d = 0; d < Dh; d++) s += (double)qh[d] * kj[d];
        p[j] = scale * s, mx = fmax(mx, p[j]), S = fmax(S, scale * dot_mag(qh, kj, Dh));
    }
    for (int j = j0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
    for (int j = j0; j <= i; j++) p[j] /= sum;
    return S;
}
/* e_p of the tolerance comment: one side's relative error of a probability */
static double softmax_eps(double S, int Dh, int n) {
    double E = 2 * gam(Dh + 1) * S + 8 * U * S;
    return E + gam(n) + (5.0 * n + 5) * U;
}
/* mag (Tq, H * Dh) = sum_j p_j |v_j|; returns the relative tolerance */
static double attention_mag(double *mag, const AttnIn *a) {
    int group = a->H / a->Hkv, Dh = a->Dh, n_keys = a->q_pos0 + a->Tq;
    size_t kvd = (size_t)a->Hkv * Dh;
    double scale = 1.0f / sqrtf((float)Dh), S = 0.0, *p = dzeros(n_keys);
    for (int t = 0; t < a->Tq; t++)
        for (int h = 0; h < a->H; h++) {
            int i = a->q_pos0 + t, j0 = first_key(i, a->window), hk = h / group;
            S = fmax(S, ref_probs(p, a->q + ((size_t)t * a->H + h) * Dh, a->kr, kvd, hk, Dh, j0, i, scale));
            for (int d = 0; d < Dh; d++) {
                double m = 0.0;
                for (int j = j0; j <= i; j++) m += p[j] * fabs(a->vr[j * kvd + (size_t)hk * Dh + d]);
                mag[((size_t)t * a->H + h) * Dh + d] = m;
            }
        }
    free(p);
    int n = most_keys(n_keys, a->window);
    return 2 * (softmax_eps(S, Dh, n) + gam(n));
}
static void case_attention(int Tq, int q_pos0, int H, int Hkv, int Dh, int window, int block) {
    cur_entry = "attention";
    AttnIn a = attn_in(Tq, q_pos0, H, Hkv, Dh, window, block, 1.0f);
    size_t qn = (size_t)Tq * H * Dh;
    float *want = xmalloc(fb(qn)), *got = xmalloc(fb(qn));
    run_attention(ref, want, &a);
    run_attention(dut, got, &a);
    double *mag = dzeros(qn), tol = attention_mag(mag, &a);
    char sh[96];
    snprintf(sh, sizeof sh, "Tq=%d,pos0=%d,H=%d,Hkv=%d,Dh=%d,win=%d,%s=%d", Tq, q_pos0, H, Hkv, Dh, window,
             block ? "paged" : "rows", block ? block : q_pos0 + Tq);
    cmp_tol("attention", DTYPE_F32, sh, got, want, qn, mag, tol, 0.0);
    free(want), free(got), free(mag);
    free_attn(&a);
}

/* ---- swiglu, add_to, copy, gather_rows, embedding, mask_cols ------------------------------------------ */
static double sigmoid(double g) { return 1.0 / (1.0 + exp(-g)); }
static float *swiglu_gates(size_t n, int edges) { /* (n) in [-12, 12), or exp's range edges first */
    static const float e[] = {0.0f, -0.0f, 87.3f, 87.4f, -87.3f, -87.4f, 88.7f, 88.8f, -88.7f, -88.8f,
                              -100.0f, 100.0f, -1e30f, 1e30f, 1e-30f, -20.0f, 20.0f};
    float *g = rand_f32(n, 12.0f);
    for (size_t i = 0; edges && i < n && i < sizeof e / sizeof e[0]; i++) g[i] = e[i];
    return g;
}
static void case_swiglu(size_t n, int edges) {
    cur_entry = "swiglu";
    float *g = swiglu_gates(n, edges), *u = rand_f32(n, 2.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, fb(n));
        be[s]->swiglu(o, dput(&d, g, fb(n)), dput(&d, u, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    double *mag = dzeros(n);
    for (size_t i = 0; i < n; i++) mag[i] = fabs((double)g[i] * sigmoid(g[i]) * u[i]);
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, edges ? ",exp_edges" : "");
    cmp_tol("swiglu", DTYPE_F32, sh, got, want, n, mag, 16 * U, FLT_MIN);
    free(g), free(u), free(want), free(got), free(mag);
}
/* in_place: out is a (cpu_add's case) */
static void case_add_to(size_t n, int in_place) {
    cur_entry = "add_to";
    float *a = rand_f32(n, 1.0f), *b = rand_f32(n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    float *res[2] = {want, got};
    plant_specials(a, n), plant_specials(b + n / 2, n - n / 2);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *da = dput(&d, a, fb(n)), *o = in_place ? da : dput(&d, NULL, fb(n));
        be[s]->add_to(o, da, dput(&d, b, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, in_place ? ",in_place" : "");
    cmp_exact("add_to", DTYPE_F32, sh, got, want, n);
    free(a), free(b), free(want), free(got);
}
/* x *= s and LoRA's dropout: one fp32 product per element (the same mask from dropout_keep): exact */
static void case_scale_dropout(int N, int cols, int col0, int cols_global, float p) {
    size_t n = (size_t)N * cols;
    float *x = rand_f32(n, 3.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    char sh[96];
    for (int op = 0; op < 2; op++) {
        cur_entry = op ? "dropout" : "scale";
        for (int s = 0; s < 2; s++) {
            Dev d = {be[s], {0}, 0};
            float *o = dput(&d, x, fb(n));
            if (op) be[s]->dropout(o, o, N, cols, col0, cols_global, p, 0x1234567ull);
            else be[s]->scale(o, 2.5f, n);
            dget(&d, res[s], o, fb(n));
            dfree(&d);
        }
        snprintf(sh, sizeof sh, "N=%d,cols=%d/%d@%d,p=%g", N, cols, cols_global, col0, p);
        cmp_exact(cur_entry, DTYPE_F32, sh, got, want, n);
    }
    free(x), free(want), free(got);
}
/* the ranks' partials added by kernels.h's pairwise tree (runtime/comm.c's fixed sums on device
 * memory): the same additions in the same order, exact */
static void case_tree_sum(int P, size_t n) {
    cur_entry = "tree_sum";
    float *x = rand_f32((size_t)P * n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *v = dput(&d, x, fb((size_t)P * n));
        be[s]->tree_sum(v, P, n);
        dget(&d, res[s], v, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "P=%d,n=%zu", P, n);
    cmp_exact("tree_sum", DTYPE_F32, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_copy(size_t n) {
    cur_entry = "copy";
    float *x = rand_f32(n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, fb(n));
        be[s]->copy(o, dput(&d, x, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu", n);
    cmp_exact("copy", DTYPE_F32, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_gather_rows(int rows_in_x, int R, const int *rows, int D) {
    cur_entry = "gather_rows";
    float *x = rand_f32((size_t)rows_in_x * D, 1.0f), *want = xmalloc(nf(R, D)), *got = xmalloc(nf(R, D));
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, nf(R, D));
        be[s]->gather_rows(o, dput(&d, x, nf(rows_in_x, D)), dput(&d, rows, ni(R)), R, D);
        dget(&d, res[s], o, nf(R, D));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "R=%d,x_rows=%d,D=%d,repeats", R, rows_in_x, D);
    cmp_exact("gather_rows", DTYPE_F32, sh, got, want, (size_t)R * D);
    free(x), free(want), free(got);
}
static void run_embedding(const Backend *be, float *out, const void *table, DType wt, const int *ids, int N, int D,
                          int v0, int V_local) {
    Dev d = {be, {0}, 0};
    float *o = dput(&d, NULL, nf(N, D));
    be->embedding(o, dput(&d, table, nw(wt, V_local, D)), wt, dput(&d, ids, ni(N)), N, D, v0, V_local);
    dget(&d, out, o, nf(N, D));
    dfree(&d);
}
static void case_embedding(int N, const int *ids, int D, int v0, int V_local, DType wt) {
    cur_entry = "embedding";
    void *t;
    float *tf = rand_weight(&t, wt, (size_t)V_local * D, 1.0f), *want = xmalloc(nf(N, D)), *got = xmalloc(nf(N, D));
    run_embedding(ref, want, t, wt, ids, N, D, v0, V_local);
    run_embedding(dut, got, t, wt, ids, N, D, v0, V_local);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,v0=%d,V_local=%d", N, D, v0, V_local);
    cmp_exact("embedding", wt, sh, got, want, (size_t)N * D);
    free(t), free(tf), free(want), free(got);
}
static void case_mask_cols(int N, int V, int from) {
    cur_entry = "mask_cols";
    float *x = rand_f32((size_t)N * V, 1.0f), *want = xmalloc(nf(N, V)), *got = xmalloc(nf(N, V)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dx = dput(&d, x, nf(N, V));
        be[s]->mask_cols(dx, N, V, from);
        dget(&d, res[s], dx, nf(N, V));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,from=%d", N, V, from);
    cmp_exact("mask_cols", DTYPE_F32, sh, got, want, (size_t)N * V);
    free(x), free(want), free(got);
}

/* ---- logits: argmax_rows, row_max, row_sumexp, pick_logits, log_add, row_entropy_part, sub_at ------- */
/* (N, V) logits in [-amp, amp): distinct values (no near-ties: argmax is exact either way); masked:
 * the last 3 columns of odd rows are -inf (vocab padding) */
static float *logits(int N, int V, float amp, int masked) {
    float *x = rand_f32((size_t)N * V, amp);
    for (int n = 1; masked && n < N; n += 2)
        for (int v = V - 3; v < V; v++)
            if (v >= 0) x[(size_t)n * V + v] = -INFINITY;
    return x;
}
static void case_argmax_rows(int V, int v0) {
    cur_entry = "argmax_rows";
    enum { N = 7 };
    float *x = logits(N, V, 8.0f, 0);
    x[1 * V + 3] = x[1 * V + V - 2] = 9.0f;                 /* row 1: an exact tie, the first wins */
    x[2 * V + 0] = NAN, x[2 * V + V / 2] = 9.5f;            /* row 2: NaN never wins */
    for (int v = 0; v < V; v++) x[3 * V + v] = v % 2 ? -INFINITY : NAN;   /* row 3: the first -inf */
    for (int v = 0; v < V; v++) x[4 * V + v] = -INFINITY;   /* row 4: all -inf */
    x[5 * V + V - 1] = 8.5f;                                /* row 5: the last column */
    x[6 * V + 0] = 8.5f;                                    /* row 6: the first column */
    int wid[N], gid[N], *ids[2] = {wid, gid};
    float wval[N], gval[N], *vals[2] = {wval, gval};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        int *di = dput(&d, NULL, ni(N));
        float *dv = dput(&d, NULL, nf(N, 1));
        be[s]->argmax_rows(di, dv, dput(&d, x, nf(N, V)), N, V, v0);
        dget(&d, ids[s], di, ni(N)), dget(&d, vals[s], dv, nf(N, 1));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,tie/NaN/-inf_rows", N, V, v0);
    cmp_ints("argmax_rows.ids", sh, gid, wid, N);
    cmp_exact("argmax_rows.vals", DTYPE_F32, sh, gval, wval, N);
    free(x);
}
/* row_max, then row_sumexp, pick_logits and row_entropy_part on the same logits */
static void case_row_max(const float *x, int N, int V, float T, const char *sh) {
    cur_entry = "row_max";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *mx = dput(&d, NULL, nf(N, 1));
        be[s]->row_max(mx, dput(&d, x, nf(N, V)), N, V, T);
        dget(&d, res[s], mx, nf(N, 1));
        dfree(&d);
    }
    cmp_exact("row_max", DTYPE_F32, sh, got, want, N);
}
static void case_row_sumexp(const float *x, const float *mx, int N, int V, float T, int leaves, const char *sh) {
    cur_entry = "row_sumexp";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *sum = dput(&d, NULL, nf(N, 1));
        be[s]->row_sumexp(sum, dput(&d, x, nf(N, V)), dput(&d, mx, nf(N, 1)), N, V, T, leaves);
        dget(&d, res[s], sum, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) {
        mag[n] = 0.0;
        for (int v = 0; v < V; v++) mag[n] += exp((double)(x[(size_t)n * V + v] / T - mx[n]));
    }
    cmp_tol("row_sumexp", DTYPE_F32, sh, got, want, N, mag, gam(V) + 8 * U, 0.0);
}
static void case_pick_logits(const float *x, int N, int V, int v0, float T, const char *sh) {
    cur_entry = "pick_logits";
    int targets[N];
    for (int n = 0; n < N; n++) {   /* none, the shard's first and last, outside it either side, inside */
        const int pick[] = {-1, v0, v0 + V - 1, v0 > 0 ? v0 - 1 : v0 + V + 1, v0 + V, v0 + V / 2};
        targets[n] = pick[n % 6];
    }
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *z = dput(&d, NULL, nf(N, 1));
        be[s]->pick_logits(z, dput(&d, x, nf(N, V)), dput(&d, targets, ni(N)), N, V, v0, T);
        dget(&d, res[s], z, nf(N, 1));
        dfree(&d);
    }
    cmp_exact("pick_logits", DTYPE_F32, sh, got, want, N);
}
static void case_row_entropy_part(const float *x, const float *lse, int N, int V, float T, int leaves, const char *sh) {
    cur_entry = "row_entropy_part";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *part = dput(&d, NULL, nf(N, 1));
        be[s]->row_entropy_part(part, dput(&d, x, nf(N, V)), dput(&d, lse, nf(N, 1)), N, V, T, leaves);
        dget(&d, res[s], part, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) {
        mag[n] = 0.0;
        for (int v = 0; v < V; v++) {
            float z = x[(size_t)n * V + v] / T;
            if (z > -INFINITY) mag[n] += exp((double)(z - lse[n])) * fabs(z);   /* -inf padding: 0 */
        }
    }
    cmp_tol("row_entropy_part", DTYPE_F32, sh, got, want, N, mag, gam(V) + 9 * U, 0.0);
}
/* lse (N) of x / T in double, rounded: the row_entropy_part input (and logprob_backward's) */
static void true_lse(float *lse, const float *x, int N, int V, float T) {
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, (double)(x[(size_t)n * V + v] / T));
        for (int v = 0; v < V; v++) s += exp((double)(x[(size_t)n * V + v] / T) - mx);
        lse[n] = (float)(mx + log(s));
    }
}
/* the vocab-parallel logprob pieces on (N, V) logits of shard v0; masked: -inf padding (whose
 * entropy terms are 0, not 0 * -inf); the sums in `leaves` leaves */
static void cases_logits(int N, int V, int v0, float T, int masked, int leaves) {
    float *x = logits(N, V, 8.0f, masked), mx[N], lse[N];
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,T=%g%s,leaves=%d", N, V, v0, (double)T, masked ? ",-inf_pad" : "", leaves);
    for (int n = 0; n < N; n++) {   /* the contract's max of x, then / T: what both sides get as mx */
        float m = -INFINITY;
        for (int v = 0; v < V; v++) m = x[(size_t)n * V + v] > m ? x[(size_t)n * V + v] : m;
        mx[n] = m / T;
    }
    case_row_max(x, N, V, T, sh);
    case_row_sumexp(x, mx, N, V, T, leaves, sh);
    case_pick_logits(x, N, V, v0, T, sh);
    true_lse(lse, x, N, V, T);
    case_row_entropy_part(x, lse, N, V, T, leaves, sh);
    free(x);
}
static void case_log_add(int N) {
    cur_entry = "log_add";
    float lse[N], sum[N], want[N], got[N], *res[2] = {want, got};
    for (int n = 0; n < N; n++) {
        lse[n] = 5.0f * rand_uniform();
        sum[n] = n == 0 ? 1.0f : expf(6.0f * (rand_uniform() + 0.6f));
    }
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dl = dput(&d, lse, nf(N, 1));
        be[s]->log_add(dl, dput(&d, sum, nf(N, 1)), N);
        dget(&d, res[s], dl, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) mag[n] = fabs((double)lse[n]) + fabs(log((double)sum[n]));
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,sum=[e^-2.4,e^9.6]", N);
    cmp_tol("log_add", DTYPE_F32, sh, got, want, N, mag, 6 * U, 0.0);
}
/* idx: b (n_b) indexed by idx, else b (n) elementwise */
static void case_sub_at(int n, int n_b, int with_idx) {
    cur_entry = "sub_at";
    int nb = with_idx ? n_b : n;
    float *a = rand_f32(n, 10.0f), *b = rand_f32(nb, 10.0f), *want = xmalloc(nf(n, 1)), *got = xmalloc(nf(n, 1));
    float *res[2] = {want, got};
    int *idx = xmalloc(ni(n));
    for (int i = 0; i < n; i++) idx[i] = rand_int(n_b);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, nf(n, 1));
        const int *di = with_idx ? dput(&d, idx, ni(n)) : NULL;
        be[s]->sub_at(o, dput(&d, a, nf(n, 1)), dput(&d, b, nf(nb, 1)), di, n);
        dget(&d, res[s], o, nf(n, 1));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%d,%s", n, with_idx ? "idx->b(n_b)" : "idx=NULL");
    cmp_exact("sub_at", DTYPE_F32, sh, got, want, n);
    free(a), free(b), free(idx), free(want), free(got);
}

/* ---- matmul_backward -------------------------------------------------------------------------------- */
typedef struct {
    int N, n_in, n_out, has_dx, has_db;
    float *dout, *x, *wf, *dw0, *db0; /* (N, n_out), (N, n_in), (n_out, n_in) fp32 values, the accumulators' start */
    void *w;                          /* (n_out, n_in) in the call's dtype */
} MmBack;
/* ints: dout 12-bit odd integers, x and w +-1, dw0 and db0 +-1 (n_out, N < 4096: exact in any order) */
static MmBack mm_back(int N, int n_in, int n_out, int has_dx, int has_db, DType wt, int ints) {
    MmBack m = {N, n_in, n_out, has_dx, has_db, NULL, NULL, NULL, NULL, NULL, NULL};
    if (ints) {
        m.dout = rand_ints((size_t)N * n_out, 12), m.x = rand_ints((size_t)N * n_in, 0);
        m.wf = rand_ints((size_t)n_out * n_in, 0), m.w = store_weight(m.wf, wt, (size_t)n_out * n_in);
        m.dw0 = rand_ints((size_t)n_out * n_in, 0), m.db0 = rand_ints(n_out, 0);
        return m;
    }
    m.dout = rand_f32((size_t)N * n_out, 1.0f), m.x = rand_f32((size_t)N * n_in, 1.0f);
    m.wf = rand_weight(&m.w, wt, (size_t)n_out * n_in, 1.0f);
    m.dw0 = rand_f32((size_t)n_out * n_in, 1.0f), m.db0 = rand_f32(n_out, 1.0f);
    return m;
}
static void free_mm_back(MmBack *m) { free(m->dout), free(m->x), free(m->wf), free(m->w), free(m->dw0), free(m->db0); }
static void run_matmul_backward(const Backend *be, float *dx, float *dw, float *db, const MmBack *m, DType wt) {
    Dev d = {be, {0}, 0};
    float *ddx = m->has_dx ? dput(&d, NULL, nf(m->N, m->n_in)) : NULL, *ddw = dput(&d, m->dw0, nf(m->n_out, m->n_in));
    float *ddb = m->has_db ? dput(&d, m->db0, nf(m->n_out, 1)) : NULL;
    be->matmul_backward(ddx, ddw, ddb, dput(&d, m->dout, nf(m->N, m->n_out)), dput(&d, m->x, nf(m->N, m->n_in)),
                        dput(&d, m->w, nw(wt, m->n_out, m->n_in)), wt, m->N, m->n_in, m->n_out);
    if (ddx) dget(&d, dx, ddx, nf(m->N, m->n_in));
    dget(&d, dw, ddw, nf(m->n_out, m->n_in));
    if (ddb) dget(&d, db, ddb, nf(m->n_out, 1));
    dfree(&d);
}
static void cmp_matmul_backward(const MmBack *m, DType wt, const char *sh, float *const *got, float *const *want,
                                int ints) {
    int N = m->N, n_in = m->n_in, n_out = m->n_out;
    if (ints) {   /* exact: see the tolerance comment */
        if (m->has_dx) cmp_exact("matmul_backward.dx", wt, sh, got[0], want[0], (size_t)N * n_in);
        cmp_exact("matmul_backward.dw", wt, sh, got[1], want[1], (size_t)n_out * n_in);
        if (m->has_db) cmp_exact("matmul_backward.db", wt, sh, got[2], want[2], n_out);
        return;
    }
    double *mdx = dzeros((size_t)N * n_in), *mdw = dzeros((size_t)n_out * n_in), *mdb = dzeros(n_out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < n_out; o++) {
            double g = fabs(m->dout[(size_t)n * n_out + o]);
            mdb[o] += g;
            for (int i = 0; i < n_in; i++) {
                mdx[(size_t)n * n_in + i] += g * fabs(m->wf[(size_t)o * n_in + i]);
                mdw[(size_t)o * n_in + i] += g * fabs(m->x[(size_t)n * n_in + i]);
            }
        }
    for (size_t i = 0; i < (size_t)n_out * n_in; i++) mdw[i] += fabs(m->dw0[i]);
    for (int o = 0; o < n_out; o++) mdb[o] += fabs(m->db0[o]);
    if (m->has_dx) cmp_tol("matmul_backward.dx", wt, sh, got[0], want[0], (size_t)N * n_in, mdx, 2 * gam(n_out), 0.0);
    cmp_tol("matmul_backward.dw", wt, sh, got[1], want[1], (size_t)n_out * n_in, mdw, 2 * gam(N + 1), 0.0);
    if (m->has_db) cmp_tol("matmul_backward.db", wt, sh, got[2], want[2], n_out, mdb, 2 * gam(N + 1), 0.0);
    free(mdx), free(mdw), free(mdb);
}
static void case_matmul_backward(int N, int n_in, int n_out, int has_dx, int has_db, DType wt, int ints) {
    cur_entry = "matmul_backward";
    MmBack m = mm_back(N, n_in, n_out, has_dx, has_db, wt, ints);
    float *want[3], *got[3];
    size_t sizes[3] = {(size_t)N * n_in, (size_t)n_out * n_in, (size_t)n_out};
    for (int i = 0; i < 3; i++) want[i] = xmalloc(fb(sizes[i])), got[i] = xmalloc(fb(sizes[i]));
    run_matmul_backward(ref, want[0], want[1], want[2], &m, wt);
    run_matmul_backward(dut, got[0], got[1], got[2], &m, wt);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d%s%s%s", N, n_in, n_out, has_dx ? "" : ",dx=NULL", has_db ? ",db" : "",
             ints ? ",ints_exact" : "");
    cmp_matmul_backward(&m, wt, sh, got, want, ints);
    for (int i = 0; i < 3; i++) free(want[i]), free(got[i]);
    free_mm_back(&m);
}

/* ---- rmsnorm_backward ---------------------------------------------------------------------------------- */
/* alias: dx is dout's buffer (the contract allows it) */
static void run_rmsnorm_backward(const Backend *be, float *dx, float *dw, const float *dout, const float *x,
                                 const float *dw0, const void *w, DType wt, int N, int D, float eps, int alias) {
    Dev d = {be, {0}, 0};
    float *dg = dput(&d, dout, nf(N, D)), *ddx = alias ? dg : dput(&d, NULL, nf(N, D)), *ddw = dput(&d, dw0, nf(D, 1));
    be->rmsnorm_backward(ddx, ddw, dg, dput(&d, x, nf(N, D)), dput(&d, w, nw(wt, D, 1)), wt, N, D, eps);
    dget(&d, dx, ddx, nf(N, D)), dget(&d, dw, ddw, nf(D, 1));
    dfree(&d);
}
static void rmsnorm_backward_mags(double *mdx, double *mdw, const float *g, const float *x, const float *wf,
                                  const float *dw0, int N, int D, float eps) {
    for (int i = 0; i < D; i++) mdw[i] = fabs(dw0[i]);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * D, *gr = g + (size_t)n * D;
        double r = rms_r(xr, D, eps), C = 0.0;
        for (int i = 0; i < D; i++) C += fabs((double)gr[i] * wf[i] * xr[i] * r) / D;
        for (int i = 0; i < D; i++) {
            double xh = fabs(xr[i] * r);
            mdx[(size_t)n * D + i] = r * (fabs((double)gr[i] * wf[i]) + xh * C);
            mdw[i] += fabs(gr[i]) * xh;
        }
    }
}
static void case_rmsnorm_backward(int N, int D, float eps, int alias, DType wt) {
    cur_entry = "rmsnorm_backward";
    void *w;
    float *g = rand_f32((size_t)N * D, 1.0f), *x = rand_f32((size_t)N * D, 2.0f), *wf = rand_weight(&w, wt, D, 1.0f);
    float *dw0 = rand_f32(D, 1.0f), *wdw = xmalloc(fb(D)), *gdw = xmalloc(fb(D));   /* (D) */
    float *wdx = xmalloc(nf(N, D)), *gdx = xmalloc(nf(N, D));                       /* (N, D) */
    run_rmsnorm_backward(ref, wdx, wdw, g, x, dw0, w, wt, N, D, eps, alias);
    run_rmsnorm_backward(dut, gdx, gdw, g, x, dw0, w, wt, N, D, eps, alias);
    double *mdx = dzeros((size_t)N * D), *mdw = dzeros(D);
    rmsnorm_backward_mags(mdx, mdw, g, x, wf, dw0, N, D, eps);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,eps=%.0e%s", N, D, (double)eps, alias ? ",dx=dout" : "");
    cmp_tol("rmsnorm_backward.dx", wt, sh, gdx, wdx, (size_t)N * D, mdx, 5 * gam(D) + 46 * U, 0.0);
    cmp_tol("rmsnorm_backward.dw", wt, sh, gdw, wdw, D, mdw, gam(D) + 14 * U + 2 * gam(N + 1), 0.0);
    free(g), free(x), free(w), free(wf), free(dw0), free(wdx), free(gdx), free(wdw), free(gdw), free(mdx), free(mdw);
}

/* ---- attention_backward --------------------------------------------------------------------------------- */
typedef struct {
    int T, H, Hkv, Dh, window;
    float *q, *k, *v, *dout; /* (T, H*Dh), (T, Hkv*Dh) x 2, (T, H*Dh) */
} AttnBack;
static void run_attention_backward(const Backend *be, float *const *res, const AttnBack *a) {
    Dev d = {be, {0}, 0};
    size_t qn = (size_t)a->T * a->H * a->Dh, kn = (size_t)a->T * a->Hkv * a->Dh;
    float *dq = dput(&d, NULL, fb(qn)), *dk = dput(&d, NULL, fb(kn)), *dv = dput(&d, NULL, fb(kn));
    float *sc = dput(&d, NULL, nf(threads() * 2, a->T));
    be->attention_backward(dq, dk, dv, dput(&d, a->dout, fb(qn)), dput(&d, a->q, fb(qn)), dput(&d, a->k, fb(kn)),
                           dput(&d, a->v, fb(kn)), a->T, a->H, a->Hkv, a->Dh, a->window, sc);
    dget(&d, res[0], dq, fb(qn)), dget(&d, res[1], dk, fb(kn)), dget(&d, res[2], dv, fb(kn));
    dfree(&d);
}
/* adds query (i, h)'s share to the mags (see the tolerance comment); p: its probabilities, A (T) scratch */
static void attention_backward_row(double *const *mag, const AttnBack *a, const double *p, double *A, int i, int h) {
    int Dh = a->Dh, hk = h / (a->H / a->Hkv), j0 = first_key(i, a->window);
    size_t qs = (size_t)a->H * Dh, ks = (size_t)a->Hkv * Dh;
    const float *qi = a->q + i * qs + (size_t)h * Dh, *gi = a->dout + i * qs + (size_t)h * Dh;
    double scale = 1.0f / sqrtf((float)Dh), B = 0.0;
    for (int j = j0; j <= i; j++) B += p[j] * (A[j] = dot_mag(gi, a->v + j * ks + (size_t)hk * Dh, Dh));
    for (int j = j0; j <= i; j++) {
        const float *kj = a->k + j * ks + (size_t)hk * Dh;
        double w = scale * p[j] * (A[j] + B);
        for (int d = 0; d < Dh; d++) {
            mag[0][i * qs + (size_t)h * Dh + d] += w * fabs(kj[d]);
            mag[1][j * ks + (size_t)hk * Dh + d] += w * fabs(qi[d]);
            mag[2][j * ks + (size_t)hk * Dh + d] += p[j] * fabs(gi[d]);
        }
    }
}
/* mag[0..2]: dq, dk, dv's magnitudes; tol[0..2] their relative tolerances */
static void attention_backward_mags(double *const *mag, double *tol, const AttnBack *a) {
    int T = a->T, Dh = a->Dh, group = a->H / a->Hkv;
    double scale = 1.0f / sqrtf((float)Dh), S = 0.0, *p = dzeros(T), *A = dzeros(T);
    for (int h = 0; h < a->H; h++)
        for (int i = 0; i < T; i++) {
            const float *qi = a->q + ((size_t)i * a->H + h) * Dh;
            S = fmax(S, ref_probs(p, qi, a->k, (size_t)a->Hkv * Dh, h / group, Dh, first_key(i, a->window), i, scale));
            attention_backward_row(mag, a, p, A, i, h);
        }
    int n = most_keys(T, a->window), m = group * n;
    double ep = softmax_eps(S, Dh, n), c = 2 * ep + gam(n) + gam(Dh) + 4 * U;
    tol[0] = 2 * (c + gam(n) + U), tol[1] = 2 * (c + gam(m) + U), tol[2] = 2 * (ep + gam(m) + U);
    free(p), free(A);
}
static void case_attention_backward(int T, int H, int Hkv, int Dh, int window) {
    cur_entry = "attention_backward";
    size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh, sizes[3] = {qn, kn, kn};
    AttnBack a = {T, H, Hkv, Dh, window, rand_f32(qn, 1.0f), rand_f32(kn, 1.0f), rand_f32(kn, 1.0f), rand_f32(qn, 1.0f)};
    float *want[3], *got[3];
    double *mag[3], tol[3];
    for (int i = 0; i < 3; i++) {
        want[i] = xmalloc(fb(sizes[i])), got[i] = xmalloc(fb(sizes[i]));
        mag[i] = dzeros(sizes[i]);
    }
    run_attention_backward(ref, want, &a);
    run_attention_backward(dut, got, &a);
    attention_backward_mags(mag, tol, &a);
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,H=%d,Hkv=%d,Dh=%d,win=%d", T, H, Hkv, Dh, window);
    const char *names[3] = {"attention_backward.dq", "attention_backward.dk", "attention_backward.dv"};
    for (int i = 0; i < 3; i++) cmp_tol(names[i], DTYPE_F32, sh, got[i], want[i], sizes[i], mag[i], tol[i], 0.0);
    for (int i = 0; i < 3; i++) free(want[i]), free(got[i]), free(mag[i]);
    free(a.q), free(a.k), free(a.v), free(a.dout);
}

/* ---- swiglu_backward, embedding_backward, logprob_backward --------------------------------------------- */
static void case_swiglu_backward(size_t n, int edges) {
    cur_entry = "swiglu_backward";
    float *g = swiglu_gates(n, edges), *u = rand_f32(n, 2.0f), *dout = rand_f32(n, 1.0f);
    float *wdg = xmalloc(fb(n)), *wdu = xmalloc(fb(n)), *gdg = xmalloc(fb(n)), *gdu = xmalloc(fb(n));
    float *dgs[2] = {wdg, gdg}, *dus[2] = {wdu, gdu};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dg = dput(&d, NULL, fb(n)), *du = dput(&d, NULL, fb(n));
        be[s]->swiglu_backward(dg, du, dput(&d, dout, fb(n)), dput(&d, g, fb(n)), dput(&d, u, fb(n)), n);
        dget(&d, dgs[s], dg, fb(n)), dget(&d, dus[s], du, fb(n));
        dfree(&d);
    }
    double *mg = dzeros(n), *mu = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        double sg = sigmoid(g[i]), F = 1.0 + g[i] * (1.0 - sg);
        mg[i] = fabs((double)dout[i] * u[i] * sg) * (1.0 + fabs(g[i]) + fabs(F));
        mu[i] = fabs((double)dout[i] * g[i] * sg);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, edges ? ",exp_edges" : "");
    cmp_tol("swiglu_backward.dgate", DTYPE_F32, sh, gdg, wdg, n, mg, 20 * U, FLT_MIN);
    cmp_tol("swiglu_backward.dup", DTYPE_F32, sh, gdu, wdu, n, mu, 16 * U, FLT_MIN);
    free(g), free(u), free(dout), free(wdg), free(wdu), free(gdg), free(gdu), free(mg), free(mu);
}
static void case_embedding_backward(int N, const int *ids, int D, int v0, int V_local) {
    cur_entry = "embedding_backward";
    size_t tn = (size_t)V_local * D;
    float *dout = rand_f32((size_t)N * D, 1.0f);                                        /* (N, D) */
    float *t0 = rand_f32(tn, 1.0f), *want = xmalloc(fb(tn)), *got = xmalloc(fb(tn));   /* (V_local, D) */
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dt = dput(&d, t0, fb(tn));
        be[s]->embedding_backward(dt, dput(&d, dout, nf(N, D)), dput(&d, ids, ni(N)), N, D, v0, V_local);
        dget(&d, res[s], dt, fb(tn));
        dfree(&d);
    }
    double *mag = dzeros(tn);
    int *count = xcalloc(V_local, sizeof(int)), most = 0;
    for (size_t i = 0; i < tn; i++) mag[i] = fabs(t0[i]);
    for (int n = 0; n < N; n++) {
        int r = ids[n] - v0;
        if (r < 0 || r >= V_local) continue;
        most = ++count[r] > most ? count[r] : most;
        for (int i = 0; i < D; i++) mag[(size_t)r * D + i] += fabs(dout[(size_t)n * D + i]);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,v0=%d,V_local=%d,%s", N, D, v0, V_local,
             most > 1 ? "repeated_ids" : "distinct_ids");
    if (most > 1) cmp_tol("embedding_backward", DTYPE_F32, sh, got, want, tn, mag, 2 * gam(most + 1), 0.0);
    else cmp_exact("embedding_backward", DTYPE_F32, sh, got, want, tn);
    free(dout), free(t0), free(want), free(got), free(mag), free(count);
}

typedef struct {
    int N, V, v0, with_entropy, in_place;
    float T;
    float *x, *lse, *dlp, *H, *dH; /* (N, V) logits; (N) each */
    int *targets;                  /* (N) */
} LpBack;
static void run_logprob_backward(const Backend *be, float *out, const LpBack *l) {
    Dev d = {be, {0}, 0};
    float *x = dput(&d, l->x, nf(l->N, l->V)), *g = l->in_place ? x : dput(&d, NULL, nf(l->N, l->V));
    const float *H = l->with_entropy ? dput(&d, l->H, nf(l->N, 1)) : NULL;
    const float *dH = l->with_entropy ? dput(&d, l->dH, nf(l->N, 1)) : NULL;
    be->logprob_backward(g, x, dput(&d, l->lse, nf(l->N, 1)), dput(&d, l->targets, ni(l->N)),
                         dput(&d, l->dlp, nf(l->N, 1)), H, dH, l->N, l->V, l->v0, l->T);
    dget(&d, out, g, nf(l->N, l->V));
    dfree(&d);
}
static double *logprob_backward_mag(const LpBack *l) {
    double *mag = dzeros((size_t)l->N * l->V);
    for (int n = 0; n < l->N; n++) {
        if (l->targets[n] < 0) continue;   /* written 0: exact */
        double gn = fabs(l->dlp[n] / l->T), ge = 0.0, h = 0.0;
        if (l->with_entropy) ge = fabs(l->dH[n] / l->T), h = l->H[n];
        for (int c = 0; c < l->V; c++) {
            float z = l->x[(size_t)n * l->V + c] / l->T, zl = z - l->lse[n];
            double p = exp((double)zl), one = l->v0 + c == l->targets[n] ? 1.0 : 0.0;
            mag[(size_t)n * l->V + c] = gn * (p + one) + ge * p * (fabs(zl) + fabs(h) + fabs(zl + h));
        }
    }
    return mag;
}
static void case_logprob_backward(int N, int V, int v0, float T, int with_entropy, int in_place) {
    cur_entry = "logprob_backward";
    LpBack l = {N, V, v0, with_entropy, in_place, T, logits(N, V, 8.0f, 0), xmalloc(fb(N)), rand_f32(N, 1.0f),
                rand_f32(N, 3.0f), rand_f32(N, 1.0f), xmalloc(ni(N))};
    true_lse(l.lse, l.x, N, V, T);
    for (int n = 0; n < N; n++) {   /* none, the shard's first and last column, outside it, inside */
        const int pick[] = {-1, v0, v0 + V - 1, v0 > 0 ? v0 - 1 : v0 + V, v0 + V, v0 + V / 3};
        l.targets[n] = pick[n % 6];
        if (n % 4 == 3) l.dH[n] = 0.0f;   /* the entropy's term off in this row */
    }
    float *want = xmalloc(nf(N, V)), *got = xmalloc(nf(N, V));
    run_logprob_backward(ref, want, &l);
    run_logprob_backward(dut, got, &l);
    double *mag = logprob_backward_mag(&l);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,T=%g%s%s", N, V, v0, (double)T, with_entropy ? ",entropy" : "",
             in_place ? ",in_place" : "");
    cmp_tol("logprob_backward", DTYPE_F32, sh, got, want, (size_t)N * V, mag, 14 * U, 0.0);
    free(l.x), free(l.lse), free(l.dlp), free(l.H), free(l.dH), free(l.targets), free(want), free(got), free(mag);
}

/* ---- the dut's own invariances, bit for bit ------------------------------------------------------------ */
/* rows of one N = 512 call == each row alone (N = 1) == the rows of calls of 7, 8, 20, 37 and 64 rows
 * at offsets 0, s, 2s, ... and 512 - s (x and the output offset in the dut's memory): every tile
 * variant of the CUDA kernels (decode, batched, prefill; a tile's runs over a block's warps or in
 * turn) and every position of a row in a tile */
static int hi_expected(int N, int n_in, int n_out, int leaves);
/* bf16x: x bf16-valued (the forward's matmul inputs in bf16 mode): N > 32 takes the tensor cores'
 * hi-only kernel where its shape allows (checked it did), N <= 32 the decode kernels */
static void inv_matmul_batch_x(int n_in, int n_out, int with_bias, DType wt, int leaves, int bf16x) {
    cur_entry = "inv";
    enum { N = 512 };
    void *w, *b = NULL;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    if (bf16x)
        for (size_t i = 0; i < (size_t)N * n_in; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    float *bf = with_bias ? rand_weight(&b, wt, n_out, 1.0f) : NULL;
    float *all = xmalloc(nf(N, n_out)), *part = xmalloc(nf(N, n_out));
    Dev d = {dut, {0}, 0};
    float *dx = dput(&d, x, nf(N, n_in)), *o = dput(&d, NULL, nf(N, n_out)), *o2 = dput(&d, NULL, nf(N, n_out));
    const void *dw = dput(&d, w, nw(wt, n_out, n_in)), *db = b ? dput(&d, b, nw(wt, n_out, 1)) : NULL;
    dut->matmul(o, dx, dw, db, wt, N, n_in, n_out, leaves);
    dget(&d, all, o, nf(N, n_out));
    if (bf16x && wt == DTYPE_BF16) {
        char shp[96];
        snprintf(shp, sizeof shp, "N=512,n_in=%d,n_out=%d,leaves=%d,bf16_x", n_in, n_out, leaves);
        int want = hi_expected(N, n_in, n_out, leaves);
        report("inv.tc_hi_taken", DTYPE_BF16, shp, 0.0, 0.0, 0.0, want < 0 || cuda_matmul_tc_hi_taken() == want);
    }
    const int sizes[] = {1, 7, 8, 20, 37, 64};
    for (int i = 0; i < 6; i++) {
        int s = sizes[i];
        dut->zero(o2, nf(N, n_out));
        for (int r0 = 0; r0 < N; r0 += s) {
            int at = r0 + s <= N ? r0 : N - s;   /* the last call ends at row 512 */
            dut->matmul(o2 + (size_t)at * n_out, dx + (size_t)at * n_in, dw, db, wt, s, n_in, n_out, leaves);
        }
        dget(&d, part, o2, nf(N, n_out));
        char sh[96];
        snprintf(sh, sizeof sh, "N=512_vs_%d,n_in=%d,n_out=%d%s,leaves=%d%s", s, n_in, n_out, with_bias ? ",bias" : "", leaves,
                 bf16x ? ",bf16_x" : "");
        cmp_bits("inv.matmul_rows", wt, sh, part, all, (size_t)N * n_out);
    }
    dfree(&d);
    free(x), free(w), free(wf), free(b), free(bf), free(all), free(part);
}
static void inv_matmul_batch(int n_in, int n_out, int with_bias, DType wt, int leaves) {
    inv_matmul_batch_x(n_in, n_out, with_bias, wt, leaves, 0);
}
/* Whether the dut's tensor-core matmul should take the hi-only kernel (bf16-valued x, no NaN): 1 / 0,
 * or -1 when the dut is not that kernel (--self, the SIMT kernel: nothing to check) */
static int hi_expected(int N, int n_in, int n_out, int leaves) {
    if (self_mode || !tc_mode || !cuda_matmul_tc_fast()) return -1;
    return cuda_mma_hi_geometry(N, n_in, n_out, leaves, 132).ok;   /* ok does not depend on sms */
}
/* The hi-only kernel (N > 32, x bf16-valued: matmul_tc.cu) == the general kernel forced on the same
 * x (cuda_matmul_set_tc_fast(0)) bit for bit, and it is taken exactly when it should be. kind 0 bf16
 * x; 1 bf16 x and an inf weight (that row NaN either way); 2 a NaN weight; 3 bf16 x with zeros, rows
 * of -0 (and the weights negative there), an inf in x; 4 bf16 x but one element not (the general
 * kernel: the pre-pass says so); 5 bf16 x and one NaN (the general kernel too). */
static void inv_tc_fast(int N, int n_in, int n_out, int leaves, int kind) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_f32((size_t)n_out * n_in, 1.0f);
    for (size_t i = 0; i < (size_t)N * n_in; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    if (kind == 1) wf[(size_t)3 * n_in + 5 % n_in] = INFINITY;
    if (kind == 2) wf[(size_t)(n_out - 1) * n_in + n_in / 2] = NAN;
    if (kind == 3) {
        for (int n = 0; n < N; n += 5)
            for (int k = 0; k < n_in; k++) x[(size_t)n * n_in + k] = n % 2 ? -0.0f : 0.0f;
        for (int k = 0; k < n_in; k++) wf[k] = -fabsf(wf[k]) - 1.0f;
        x[(size_t)1 * n_in + 7] = INFINITY, x[(size_t)2 * n_in + 3] = -INFINITY;
    }
    if (kind == 4) x[(size_t)(N - 1) * n_in + n_in - 1] += ldexpf(1.0f, -20);
    if (kind == 5) x[(size_t)(N / 2) * n_in] = NAN;
    w = store_weight(wf, DTYPE_BF16, (size_t)n_out * n_in);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f);
    float *fast = xmalloc(nf(N, n_out)), *gen = xmalloc(nf(N, n_out));
    run_matmul(dut, fast, x, w, kind == 2 ? NULL : b, DTYPE_BF16, N, n_in, n_out, leaves);
    int want = hi_expected(N, n_in, n_out, leaves), taken = want < 0 ? -1 : cuda_matmul_tc_hi_taken();
    if (want > 0 && kind >= 4) want = 0;
    int was = cuda_matmul_tc_fast();
    cuda_matmul_set_tc_fast(0);
    run_matmul(dut, gen, x, w, kind == 2 ? NULL : b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_fast(was);
    static const char *kinds[6] = {"bf16_x", "inf_weight", "nan_weight", "zeros,-0_rows,inf_x", "one_x_not_bf16", "nan_x"};
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,leaves=%d,%s", N, n_in, n_out, leaves, kinds[kind]);
    cmp_bits("inv.tc_hi_vs_general", DTYPE_BF16, sh, fast, gen, (size_t)N * n_out);
    report("inv.tc_hi_taken", DTYPE_BF16, sh, 0.0, 0.0, 0.0, want < 0 || taken == want);
    free(x), free(w), free(wf), free(b), free(bf), free(fast), free(gen);
}
/* The tensor-core kernel's skip of the mid and lo mma's (matmul_tc.cu's header) changes no bit: the
 * dut with the skip (cuda_matmul_set_tc_skip(1), the default) == without it, on x of bf16 values (the
 * mid and lo mma's always skipped), fp32 x (never), x whose rows or columns alternate between the two
 * (tiles and runs that switch: an accumulator skipped, then used, then skipped), zeros and -0 in x,
 * and one weight inf (its fragments never skipped: inf x 0 is a NaN). kind 0 bf16 x, 1 fp32, 2 rows
 * alternate, 3 the first half of every row bf16 and zeros, 4 bf16 x with an inf weight. Elsewhere
 * (the CPU, the SIMT kernel) the switch does nothing and the bits are trivially the same. */
static void inv_tc_skip(int N, int n_in, int n_out, int leaves, int kind) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_f32((size_t)n_out * n_in, 1.0f);
    if (kind == 4) wf[(size_t)3 * n_in + 5 % n_in] = INFINITY;
    w = store_weight(wf, DTYPE_BF16, (size_t)n_out * n_in);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < n_in; k++) {
            float *v = x + (size_t)n * n_in + k;
            int bf16 = kind == 0 || kind == 4 || (kind == 2 && n % 2 == 0) || (kind == 3 && k < n_in / 2);
            if (bf16) *v = bf16_to_f32(f32_to_bf16(*v));
            if (kind == 3 && k % 37 == 0) *v = k % 74 ? -0.0f : 0.0f;
        }
    float *on = xmalloc(nf(N, n_out)), *off = xmalloc(nf(N, n_out));
    run_matmul(dut, on, x, w, b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_skip(0);
    run_matmul(dut, off, x, w, b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_skip(1);
    static const char *kinds[5] = {"bf16_x", "fp32_x", "rows_alternate", "half_bf16_zeros", "bf16_x,inf_weight"};
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,leaves=%d,%s", N, n_in, n_out, leaves, kinds[kind]);
    cmp_bits("inv.tc_skip", DTYPE_BF16, sh, on, off, (size_t)N * n_out);
    free(x), free(w), free(wf), free(b), free(bf), free(on), free(off);
}
/* tp invariance (kernels.h TP_LEAVES): TP_LEAVES leaves over n_in == the host's tree_sum over t
 * "ranks" of n_in / t columns each with TP_LEAVES / t leaves (the tp sum is host arithmetic,
 * comm_all_reduce_sum_fixed), for t = 2, 4, 8 */
static void inv_matmul_tp(int N, int n_in, int n_out, DType wt) {
    cur_entry = "inv";
    void *w;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *whole = xmalloc(nf(N, n_out)), *parts = xmalloc(nf(TP_LEAVES * N, n_out));
    float *xr = xmalloc(nf(N, n_in));
    char *wr = xmalloc(nw(wt, n_out, n_in));
    size_t es = dtype_size(wt);
    run_matmul(dut, whole, x, w, NULL, wt, N, n_in, n_out, TP_LEAVES);
    for (int t = 2; t <= TP_LEAVES; t *= 2) {
        int Kr = n_in / t;
        for (int r = 0; r < t; r++) {
            for (int n = 0; n < N; n++) memcpy(xr + (size_t)n * Kr, x + (size_t)n * n_in + (size_t)r * Kr, fb(Kr));
            for (int o = 0; o < n_out; o++) memcpy(wr + es * o * Kr, (char *)w + es * ((size_t)o * n_in + (size_t)r * Kr), es * Kr);
            run_matmul(dut, parts + (size_t)r * N * n_out, xr, wr, NULL, wt, N, Kr, n_out, TP_LEAVES / t);
        }
        tree_sum(parts, t, (size_t)N * n_out);
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,tp=%d_vs_1", N, n_in, n_out, t);
        cmp_bits("inv.matmul_tp", wt, sh, parts, whole, (size_t)N * n_out);
    }
    free(x), free(w), free(wf), free(whole), free(parts), free(xr), free(wr);
}
/* matmuls == one matmul per output */
static void inv_matmuls(int N, int n_in, DType wt) {
    cur_entry = "inv";
    const int n_out[3] = {64, 17, 40}, bias[3] = {1, 0, 1};
    MatmulSet s = matmul_set(3, n_out, bias, n_in, wt);
    float *x = rand_f32((size_t)N * n_in, 1.0f), *fused[3], *single[3];
    for (int j = 0; j < 3; j++) fused[j] = xmalloc(nf(N, n_out[j])), single[j] = xmalloc(nf(N, n_out[j]));
    run_matmuls(dut, fused, x, N, n_in, &s, wt);
    for (int j = 0; j < 3; j++) run_matmul(dut, single[j], x, s.w[j], s.b[j], wt, N, n_in, n_out[j], 1);
    for (int j = 0; j < 3; j++) {
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,out=%d/3,n_out=%d", N, n_in, j + 1, n_out[j]);
        cmp_bits("inv.matmuls_eq_matmul", wt, sh, fused[j], single[j], (size_t)N * n_out[j]);
        free(fused[j]), free(single[j]);
    }
    free(x);
    free_set(&s);
}

/* One sequence of T tokens on the dut: a prefill over kv_rows is the reference; the same over a paged
 * cache (block 16, shuffled table, filled by the dut's kv_store, NaN elsewhere); T one-token decode
 * steps, step p storing key p into a fresh NaN pool and attending over keys 0..p (Tq 1, q_pos0 p);
 * and chunks of rows [p0, T) with q_pos0 = p0: all the same bits. */
typedef struct {
    int T, H, Hkv, Dh, window, n_table, n_pool;
    float *q, *k, *v, *sc; /* the dut's: (T, H*Dh), (T, Hkv*Dh) x 2, scratch */
    int *table, *pos;      /* the dut's: (n_table), (T) = 0..T-1 */
    float *nan_pool;       /* host: (n_pool, Hkv, 16, Dh) of NaN */
} InvAttn;
enum { INV_BLOCK = 16 };
static float *inv_pool(Dev *d, const InvAttn *a) { /* a fresh dut pool of NaN */
    return dput(d, a->nan_pool, nf(a->n_pool * INV_BLOCK, a->Hkv * a->Dh));
}
static void inv_attention_paged(Dev *d, const InvAttn *a, const float *full, const char *sh) {
    size_t qn = (size_t)a->T * a->H * a->Dh;
    KVLayout kv = kv_paged(a->table, INV_BLOCK, a->Dh);
    float *kc = inv_pool(d, a), *vc = inv_pool(d, a), *o = dput(d, NULL, fb(qn)), *got = xmalloc(fb(qn));
    dut->kv_store(kc, vc, a->k, a->v, &kv, a->pos, a->T, a->Hkv, a->Dh);
    dut->attention(o, a->q, kc, vc, &kv, a->T, 0, a->H, a->Hkv, a->Dh, a->window, a->sc);
    dget(d, got, o, fb(qn));
    cmp_bits("inv.attention_paged", DTYPE_F32, sh, got, full, qn);
    /* chunks: rows [p0, T) at q_pos0 = p0 over the same cache */
    const int p0s[] = {1, INV_BLOCK, a->T / 2 + 1, a->T - 1};
    for (int c = 0; c < 4; c++) {
        size_t off = (size_t)p0s[c] * a->H * a->Dh;
        dut->attention(o, a->q + off, kc, vc, &kv, a->T - p0s[c], p0s[c], a->H, a->Hkv, a->Dh, a->window, a->sc);
        dget(d, got, o, fb(qn - off));
        char shc[112];
        snprintf(shc, sizeof shc, "%s,p0=%d", sh, p0s[c]);
        cmp_bits("inv.attention_chunk", DTYPE_F32, shc, got, full + off, qn - off);
    }
    free(got);
}
static void inv_attention_decode(Dev *d, const InvAttn *a, const float *full, const char *sh) {
    size_t qs = (size_t)a->H * a->Dh, kvd = (size_t)a->Hkv * a->Dh;
    KVLayout kv = kv_paged(a->table, INV_BLOCK, a->Dh);
    float *kc = inv_pool(d, a), *vc = inv_pool(d, a), *o = dput(d, NULL, fb(a->T * qs)), *got = xmalloc(fb(a->T * qs));
    for (int p = 0; p < a->T; p++) {
        dut->kv_store(kc, vc, a->k + p * kvd, a->v + p * kvd, &kv, a->pos + p, 1, a->Hkv, a->Dh);
        dut->attention(o + p * qs, a->q + p * qs, kc, vc, &kv, 1, p, a->H, a->Hkv, a->Dh, a->window, a->sc);
    }
    dget(d, got, o, fb(a->T * qs));
    cmp_bits("inv.attention_decode", DTYPE_F32, sh, got, full, a->T * qs);
    free(got);
}
static void inv_attention(int T, int H, int Hkv, int Dh, int window) {
    cur_entry = "inv";
    size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh;
    float *q = rand_f32(qn, 1.0f), *k = rand_f32(kn, 1.0f), *v = rand_f32(kn, 1.0f), *full = xmalloc(fb(qn));
    int n_table = (T + INV_BLOCK - 1) / INV_BLOCK, n_pool = n_table + 2, *table = shuffled_table(n_pool);
    int *pos = xmalloc(ni(T));
    for (int t = 0; t < T; t++) pos[t] = t;
    size_t pn = (size_t)n_pool * INV_BLOCK * Hkv * Dh;
    float *nan_pool = xmalloc(fb(pn));
    for (size_t i = 0; i < pn; i++) nan_pool[i] = NAN;
    Dev d = {dut, {0}, 0};
    InvAttn a = {T, H, Hkv, Dh, window, n_table, n_pool, dput(&d, q, fb(qn)), dput(&d, k, fb(kn)), dput(&d, v, fb(kn)),
                 dput(&d, NULL, nf(threads() * H, T)), dput(&d, table, ni(n_table)), dput(&d, pos, ni(T)), nan_pool};
    KVLayout rows = kv_rows(T, Hkv, Dh);
    float *o = dput(&d, NULL, fb(qn));
    dut->attention(o, a.q, a.k, a.v, &rows, T, 0, H, Hkv, Dh, window, a.sc);
    dget(&d, full, o, fb(qn));
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,H=%d,Hkv=%d,Dh=%d,win=%d,block=%d", T, H, Hkv, Dh, window, INV_BLOCK);
    inv_attention_paged(&d, &a, full, sh);
    inv_attention_decode(&d, &a, full, sh);
    dfree(&d);
    free(q), free(k), free(v), free(full), free(table), free(pos), free(nan_pool);
}

/* kv_store_batch and attention_batch: three sequences (a decode row at position 40, a 5-row chunk
 * at 10..14, a first token) with their own shuffled tables in one NaN-free random pool, one call
 * each; on each backend the bits of kv_store and attention called per sequence (the pools too), and
 * the dut's batch against the ref's batch within attention's bound (kv_store_batch: exact). */
static void batch_paged_case(int window) {
    cur_entry = "attention_batch";
    enum { S = 3, H = 8, Hkv = 2, Dh = 64, BLOCK = 16, STRIDE = 4, POOL = 12 };
    static const int pos0[S] = {40, 10, 0}, rows[S] = {1, 5, 1};
    int seq_start[S + 1] = {0}, N;
    for (int i = 0; i < S; i++) seq_start[i + 1] = seq_start[i] + rows[i];
    N = seq_start[S];
    size_t qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh, pn = (size_t)POOL * BLOCK * kvd;
    int *perm = shuffled_table(POOL), tables[S * STRIDE], seq[16], pos[16];
    for (int i = 0; i < S * STRIDE; i++) tables[i] = perm[i];   /* disjoint blocks per sequence */
    for (int i = 0; i < S; i++)
        for (int t = seq_start[i]; t < seq_start[i + 1]; t++) seq[t] = i, pos[t] = pos0[i] + t - seq_start[i];
    float *q = rand_f32((size_t)N * qd, 1.0f), *k = rand_f32((size_t)N * kvd, 1.0f), *v = rand_f32((size_t)N * kvd, 1.0f);
    float *pool_k = rand_f32(pn, 1.0f), *pool_v = rand_f32(pn, 1.0f);
    float *res[2][3];   /* [backend][batch out, per-sequence out, batch pool k] */
    const Backend *be[2] = {ref, dut};
    for (int b = 0; b < 2; b++) {
        Dev d = {be[b], {0}, 0};
        const int *dt = dput(&d, tables, ni(S * STRIDE)), *ds = dput(&d, seq, ni(N)), *dp = dput(&d, pos, ni(N));
        const float *dq = dput(&d, q, fb((size_t)N * qd)), *dk = dput(&d, k, fb((size_t)N * kvd));
        const float *dv = dput(&d, v, fb((size_t)N * kvd));
        float *sc = dput(&d, NULL, nf(threads() * H, 64));
        PagedBatch pb = {dt, STRIDE, BLOCK, ds, dp, N, S, 0, seq_start, pos};
        float *kc1 = dput(&d, pool_k, fb(pn)), *vc1 = dput(&d, pool_v, fb(pn)), *o1 = dput(&d, NULL, fb((size_t)N * qd));
        be[b]->kv_store_batch(kc1, vc1, dk, dv, &pb, Hkv, Dh);
        be[b]->attention_batch(o1, dq, kc1, vc1, &pb, H, Hkv, Dh, window, sc, (size_t)H * 64);
        float *kc2 = dput(&d, pool_k, fb(pn)), *vc2 = dput(&d, pool_v, fb(pn)), *o2 = dput(&d, NULL, fb((size_t)N * qd));
        for (int i = 0; i < S; i++) {
            int t0 = seq_start[i];
            KVLayout kv = kv_paged(dt + i * STRIDE, BLOCK, Dh);
            be[b]->kv_store(kc2, vc2, dk + t0 * kvd, dv + t0 * kvd, &kv, dp + t0, rows[i], Hkv, Dh);
            be[b]->attention(o2 + t0 * qd, dq + t0 * qd, kc2, vc2, &kv, rows[i], pos0[i], H, Hkv, Dh, window, sc);
        }
        for (int r = 0; r < 3; r++) res[b][r] = xmalloc(fb(r == 2 ? pn : (size_t)N * qd));
        dget(&d, res[b][0], o1, fb((size_t)N * qd));
        dget(&d, res[b][1], o2, fb((size_t)N * qd));
        dget(&d, res[b][2], kc1, fb(pn));
        float *k2 = xmalloc(fb(pn));
        dget(&d, k2, kc2, fb(pn));
        char sh[96];
        snprintf(sh, sizeof sh, "%s:S=3,N=%d,H=%d,Hkv=%d,Dh=%d,win=%d", b ? "dut" : "ref", N, H, Hkv, Dh, window);
        cmp_bits("inv.attention_batch", DTYPE_F32, sh, res[b][0], res[b][1], (size_t)N * qd);
        cmp_bits("inv.kv_store_batch", DTYPE_F32, sh, res[b][2], k2, pn);
        free(k2);
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "S=3,N=%d,H=%d,Hkv=%d,Dh=%d,win=%d,paged=%d", N, H, Hkv, Dh, window, BLOCK);
    cmp_exact("kv_store_batch", DTYPE_F32, sh, res[1][2], res[0][2], pn);
    /* the per-sequence calls are what attention's cases bound; the same bound per sequence */
    double *mag = dzeros((size_t)N * qd), tol = 0.0;
    for (int i = 0; i < S; i++) {
        AttnIn a = {rows[i], pos0[i], H, Hkv, Dh, window, 0, q + (size_t)seq_start[i] * qd, NULL, NULL, NULL, NULL, 0,
                    NULL, 0};
        /* the sequence's keys as rows: positions < pos0 from the pool, its own rows from k, v */
        int n_keys = pos0[i] + rows[i];
        a.kr = xmalloc(fb((size_t)n_keys * kvd)), a.vr = xmalloc(fb((size_t)n_keys * kvd));
        for (int j = 0; j < n_keys; j++)
            for (int hk = 0; hk < Hkv; hk++) {
                size_t slot = ((size_t)tables[i * STRIDE + j / BLOCK] * BLOCK * Hkv + (size_t)hk * BLOCK + j % BLOCK) * Dh;
                const float *ks = j < pos0[i] ? pool_k + slot : k + ((size_t)seq_start[i] + j - pos0[i]) * kvd + hk * Dh;
                const float *vs = j < pos0[i] ? pool_v + slot : v + ((size_t)seq_start[i] + j - pos0[i]) * kvd + hk * Dh;
                memcpy(a.kr + (size_t)j * kvd + hk * Dh, ks, fb(Dh));
                memcpy(a.vr + (size_t)j * kvd + hk * Dh, vs, fb(Dh));
            }
        tol = fmax(tol, attention_mag(mag + (size_t)seq_start[i] * qd, &a));
        free(a.kr), free(a.vr);
    }
    cmp_tol("attention_batch", DTYPE_F32, sh, res[1][0], res[0][0], (size_t)N * qd, mag, tol, 0.0);
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 3; r++) free(res[b][r]);
    free(mag), free(perm), free(q), free(k), free(v), free(pool_k), free(pool_v);
}

/* bf16 entries == the fp32 entries on the upcast weights (the dut against itself). CUDA's bf16 matmul
 * and matmuls on the tensor cores (tc_mode) are another function (kernels.h): then the CPU's (ref's)
 * bits are checked instead, and the dut's bf16 result against its fp32 one within the sum of their
 * bounds from the exact sum, gamma(n_in + 1) (fp32 kernel) + (1 + 2^-7) gamma(s(n_in)) (tensor cores)
 * = matmul_tol. On the SIMT kernel (not tc_mode) the dut's own bits, as everywhere else. */
static void bf16_vs_fp32(const char *what, int N, int n_in, int n_out, const float *x, const float *wf,
                         const float *bf, const float *h, const float *f, const float *ref_h, const float *ref_f) {
    char sh[96];
    if (!tc_mode) {
        snprintf(sh, sizeof sh, "%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
        cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * n_out);
        return;
    }
    snprintf(sh, sizeof sh, "ref:%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, ref_h, ref_f, (size_t)N * n_out);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    snprintf(sh, sizeof sh, "bf16_vs_fp32:%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
    cmp_tol("matmul", DTYPE_BF16, sh, h, f, (size_t)N * n_out, mag, matmul_tol(DTYPE_BF16, n_in), 0.0);
    free(mag);
}
static void inv_bf16_matmul(int N, int n_in, int n_out) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, DTYPE_BF16, (size_t)n_out * n_in, 1.0f);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f), *h = xmalloc(nf(N, n_out)), *f = xmalloc(nf(N, n_out));
    float *rh = xmalloc(nf(N, n_out)), *rf = xmalloc(nf(N, n_out));
    run_matmul(dut, h, x, w, b, DTYPE_BF16, N, n_in, n_out, 8);
    run_matmul(dut, f, x, wf, bf, DTYPE_F32, N, n_in, n_out, 8);
    if (tc_mode) {
        run_matmul(ref, rh, x, w, b, DTYPE_BF16, N, n_in, n_out, 8);
        run_matmul(ref, rf, x, wf, bf, DTYPE_F32, N, n_in, n_out, 8);
    }
    char sh[96];
    bf16_vs_fp32("matmul", N, n_in, n_out, x, wf, bf, h, f, rh, rf);
    /* matmuls: the same three weights */
    const int n_outs[3] = {n_out, 9, 33}, bias[3] = {1, 0, 1};
    MatmulSet s = matmul_set(3, n_outs, bias, n_in, DTYPE_BF16), sf = s;
    for (int j = 0; j < 3; j++) sf.w[j] = s.wf[j], sf.b[j] = s.bf[j];
    float *hs[3], *fs[3], *rhs[3], *rfs[3];
    for (int j = 0; j < 3; j++) {
        hs[j] = xmalloc(nf(N, n_outs[j])), fs[j] = xmalloc(nf(N, n_outs[j]));
        rhs[j] = xmalloc(nf(N, n_outs[j])), rfs[j] = xmalloc(nf(N, n_outs[j]));
    }
    run_matmuls(dut, hs, x, N, n_in, &s, DTYPE_BF16);
    run_matmuls(dut, fs, x, N, n_in, &sf, DTYPE_F32);
    if (tc_mode) run_matmuls(ref, rhs, x, N, n_in, &s, DTYPE_BF16), run_matmuls(ref, rfs, x, N, n_in, &sf, DTYPE_F32);
    for (int j = 0; j < 3; j++) {
        snprintf(sh, sizeof sh, "matmuls.out%d/3", j + 1);
        bf16_vs_fp32(sh, N, n_in, n_outs[j], x, s.wf[j], s.bf[j], hs[j], fs[j], rhs[j], rfs[j]);
        free(hs[j]), free(fs[j]), free(rhs[j]), free(rfs[j]);
    }
    free_set(&s);
    free(x), free(w), free(wf), free(b), free(bf), free(h), free(f), free(rh), free(rf);
}
static void inv_bf16_norm_embed(int N, int D) {
    cur_entry = "inv";
    void *w;
    float *x = rand_f32((size_t)N * D, 2.0f), *wf = rand_weight(&w, DTYPE_BF16, D, 1.0f);
    float *h = xmalloc(nf(N, D)), *f = xmalloc(nf(N, D)), *hw = xmalloc(fb(D)), *fw = xmalloc(fb(D));
    char sh[96];
    run_rmsnorm(dut, h, x, w, DTYPE_BF16, N, D, 1e-5f);
    run_rmsnorm(dut, f, x, wf, DTYPE_F32, N, D, 1e-5f);
    snprintf(sh, sizeof sh, "rmsnorm:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * D);
    float *g = rand_f32((size_t)N * D, 1.0f), *dw0 = rand_f32(D, 1.0f);
    run_rmsnorm_backward(dut, h, hw, g, x, dw0, w, DTYPE_BF16, N, D, 1e-5f, 0);
    run_rmsnorm_backward(dut, f, fw, g, x, dw0, wf, DTYPE_F32, N, D, 1e-5f, 0);
    snprintf(sh, sizeof sh, "rmsnorm_backward.dx:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * D);
    snprintf(sh, sizeof sh, "rmsnorm_backward.dw:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, hw, fw, D);
    void *t;
    float *tf = rand_weight(&t, DTYPE_BF16, (size_t)N * D, 1.0f);   /* N rows of D: a table of V_local = N */
    int ids[4] = {7, 7 + N - 1, 3, 7 + N / 2};
    run_embedding(dut, h, t, DTYPE_BF16, ids, 4, D, 7, N);
    run_embedding(dut, f, tf, DTYPE_F32, ids, 4, D, 7, N);
    snprintf(sh, sizeof sh, "embedding:N=4,D=%d,v0=7,V_local=%d", D, N);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)4 * D);
    free(x), free(w), free(wf), free(h), free(f), free(hw), free(fw), free(g), free(dw0), free(t), free(tf);
}
/* matmul_backward at n_out <= 512 only: the CPU's bf16 dx is the sum over blocks of 512 upcast weight
 * rows (kernels/cpu/backward.h), so past 512 its own bf16 bits differ from its fp32 ones */
static void inv_bf16_matmul_backward(int N, int n_in, int n_out) {
    cur_entry = "inv";
    MmBack m = mm_back(N, n_in, n_out, 1, 1, DTYPE_BF16, 0), mf = m;
    mf.w = m.wf;
    float *h[3], *f[3];
    size_t sizes[3] = {(size_t)N * n_in, (size_t)n_out * n_in, (size_t)n_out};
    for (int i = 0; i < 3; i++) h[i] = xmalloc(fb(sizes[i])), f[i] = xmalloc(fb(sizes[i]));
    run_matmul_backward(dut, h[0], h[1], h[2], &m, DTYPE_BF16);
    run_matmul_backward(dut, f[0], f[1], f[2], &mf, DTYPE_F32);
    const char *outs[3] = {"dx", "dw", "db"};
    for (int i = 0; i < 3; i++) {
        char sh[96];
        snprintf(sh, sizeof sh, "matmul_backward.%s:N=%d,n_in=%d,n_out=%d", outs[i], N, n_in, n_out);
        cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h[i], f[i], sizes[i]);
    }
    for (int i = 0; i < 3; i++) free(h[i]), free(f[i]);
    free_mm_back(&m);
}

/* ---- the cases ----------------------------------------------------------------------------------------- */
/* the matmul and matmuls cases, weights of dtype d0 .. bf16 (d0 = 1: bf16 alone, the SIMT pass) */
static void matmul_cases(int d0) {
    static const int mm[][4] = {{1, 1, 1, 1},     {7, 33, 65, 0},   {1, 4096, 1024, 1}, {3, 2048, 256, 0},
                                {33, 1000, 129, 1}, {64, 2048, 11, 0}, {5, 11008, 64, 1}};
    for (int dt = d0; dt < 2; dt++) {
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
            case_matmul(mm[i][0], mm[i][1], mm[i][2], mm[i][3], (DType)dt, 1);
        case_matmul(3, 2048, 256, 0, (DType)dt, 8), case_matmul(33, 1000, 129, 1, (DType)dt, 8);
        case_matmul(1, 5632, 64, 0, (DType)dt, 4), case_matmul(2, 24, 5, 1, (DType)dt, 8);
        case_matmul_ints(2, 4096, 64, (DType)dt, 12), case_matmul_ints(5, 1000, 33, (DType)dt, 12);
    }
    /* the tensor-core kernel's shapes (bf16; fp32 too where cheap): real layers (TinyLlama's gate_proj at a
     * 512-token prefill, its down_proj at decode), each tile variant with tails in n_in, n_out and N,
     * leaves split over the grid (N <= 32) and in turn (N > 32), n_in = 1, unaligned operands, integers */
    case_matmul(512, 2048, 5632, 0, DTYPE_BF16, 1), case_matmul(1, 5632, 2048, 0, DTYPE_BF16, 8);
    case_matmul(1, 5632, 2048, 1, DTYPE_BF16, 1);
    static const int odd[][5] = {{3, 1, 5, 1, 1},   {7, 33, 65, 1, 1},  {9, 17, 100, 1, 1}, {20, 48, 33, 0, 1},
                                 {40, 33, 70, 1, 1}, {65, 130, 67, 1, 1}, {2, 24, 5, 1, 8},   {40, 24, 70, 1, 8},
                                 {7, 64, 65, 0, 64}, {100, 1000, 129, 1, 8}, {31, 4096, 48, 1, 2}};
    for (int dt = d0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
            case_matmul(odd[i][0], odd[i][1], odd[i][2], odd[i][3], (DType)dt, odd[i][4]);
    for (int dt = d0; dt < 2; dt++) {
        case_matmul_unaligned(1, 2048, 67, (DType)dt, 1), case_matmul_unaligned(20, 1000, 33, (DType)dt, 8);
        case_matmul_unaligned(40, 256, 70, (DType)dt, 4);
        case_matmul_ints(40, 4096, 64, (DType)dt, 12), case_matmul_ints(1, 4096, 17, (DType)dt, 12);
        case_matmul_ints(7, 15, 33, (DType)dt, 20), case_matmul_ints(40, 15, 20, (DType)dt, 20);
    }
    const int qkv[3] = {256, 64, 64}, qkv_bias[3] = {0, 1, 1}, gu[2] = {173, 173}, no_bias[2] = {0, 0};
    for (int dt = d0; dt < 2; dt++) {
        case_matmuls(9, 2048, 3, qkv, qkv_bias, (DType)dt);
        case_matmuls(1, 300, 2, gu, no_bias, (DType)dt);
    }
}
static void forward_cases(void) {
    matmul_cases(0);
    for (int dt = 0; dt < 2; dt++) {
        case_rmsnorm(1, 1, 1e-5f, 1.0f, 0, (DType)dt);
        case_rmsnorm(7, 33, 1e-6f, 1.0f, 1, (DType)dt);
        case_rmsnorm(3, 256, 1e-5f, 1.0f, 0, (DType)dt);
        case_rmsnorm(17, 1000, 1e-6f, 30.0f, 0, (DType)dt);
        case_rmsnorm(1, 4096, 1e-5f, 1e-3f, 0, (DType)dt);
        case_rmsnorm(2, 8193, 1e-6f, 1000.0f, 0, (DType)dt);
    }
    for (int dt = 0; dt < 2; dt++) {
        case_round_to(4099, (DType)dt), case_pack(4099, (DType)dt), case_unpack(4099, (DType)dt);
        case_pack(1, (DType)dt), case_unpack(1, (DType)dt);
    }
    const int pos[10] = {0, 1, 2, 17, 100, 1000, 4095, 32767, 100000, 123457}, far[1] = {131071};
    case_rope_table(10, pos, 64, 10000.0);
    case_rope_table(10, pos, 80, 1e6);
    case_rope_table(1, far, 128, 500000.0);
    for (int b = 0; b < 2; b++) case_rope(b, 7, 3, 64), case_rope(b, 1, 32, 128), case_rope(b, 5, 2, 40);
    const int scattered[5] = {0, 15, 16, 33, 63}, one[1] = {40}, run[20] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                            14, 15, 16, 17, 18, 19};
    case_kv_store(5, scattered, 2, 64, 16, 4, 6);
    case_kv_store(1, one, 1, 40, 8, 6, 9);
    case_kv_store(20, run, 3, 16, 24, 0, 1);   /* kv_rows of 24 positions */
}
static void attention_cases(void) {
    batch_paged_case(0);
    batch_paged_case(7);
    case_attention(1, 0, 1, 1, 16, 0, 0);
    case_attention(37, 0, 8, 2, 64, 0, 0);     /* prefill, GQA 4 */
    case_attention(37, 0, 8, 2, 64, 11, 16);   /* sliding window, paged */
    case_attention(1, 70, 4, 1, 128, 0, 16);   /* decode, GQA 4, paged */
    case_attention(9, 40, 6, 3, 40, 17, 8);    /* a chunk, Dh 40, window */
    case_attention(1, 99, 8, 2, 64, 32, 32);   /* decode in a window */
    case_attention(3, 0, 2, 2, 80, 0, 5);      /* block 5: every block split */
}
static void elementwise_cases(void) {
    case_swiglu(1, 0), case_swiglu(4099, 0), case_swiglu(17, 1);
    case_add_to(4099, 0), case_add_to(33, 1), case_copy(1), case_copy(4099);
    case_scale_dropout(37, 64, 0, 64, 0.1f), case_scale_dropout(5, 48, 48, 96, 0.5f);
    case_tree_sum(1, 7), case_tree_sum(2, 1000), case_tree_sum(3, 65), case_tree_sum(4, 4096), case_tree_sum(8, 333);
    const int rows[7] = {12, 0, 5, 5, 7, 12, 1}, one[1] = {0};
    case_gather_rows(13, 7, rows, 33);
    case_gather_rows(1, 1, one, 1);
    const int ids[8] = {100, 149, 99, 150, 0, 123, 123, 101}, big[3] = {7, 0, 3};
    for (int dt = 0; dt < 2; dt++) {
        case_embedding(8, ids, 33, 100, 50, (DType)dt);
        case_embedding(3, big, 4096, 0, 8, (DType)dt);   /* LLaMA-width rows */
    }
    case_mask_cols(3, 37, 30), case_mask_cols(3, 37, 0), case_mask_cols(3, 37, -2), case_mask_cols(3, 37, 37);
    case_mask_cols(2, 37, 50), case_mask_cols(1, 32003, 32000);
}
static void logit_cases(void) {
    case_argmax_rows(1001, 3000), case_argmax_rows(17, 0), case_argmax_rows(32000, 0);
    cases_logits(1, 32000, 0, 1.0f, 0, 1);
    cases_logits(6, 1001, 500, 0.7f, 0, 1);
    cases_logits(6, 1001, 500, 1.0f, 1, 1);
    cases_logits(7, 33, 32, 1.3f, 0, 1);
    cases_logits(1, 32000, 0, 1.0f, 0, 8);
    cases_logits(6, 1001, 500, 1.0f, 1, 4);
    cases_logits(7, 33, 32, 1.3f, 0, 8);
    case_log_add(1), case_log_add(9);
    case_sub_at(1000, 10, 1), case_sub_at(1000, 10, 0), case_sub_at(1, 1, 0);
}
static void backward_cases(void) {
    static const int mb[][5] = {{1, 1, 1, 1, 1}, {7, 33, 65, 1, 0}, {37, 130, 600, 1, 1}, {64, 2048, 48, 1, 0},
                                {5, 64, 1000, 0, 1}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++)
            case_matmul_backward(mb[i][0], mb[i][1], mb[i][2], mb[i][3], mb[i][4], (DType)dt, 0);
    for (int dt = 0; dt < 2; dt++) case_matmul_backward(64, 256, 2048, 1, 1, (DType)dt, 1);
    for (int dt = 0; dt < 2; dt++) {
        case_rmsnorm_backward(1, 16, 1e-5f, 0, (DType)dt);
        case_rmsnorm_backward(7, 33, 1e-6f, 1, (DType)dt);
        case_rmsnorm_backward(5, 2048, 1e-5f, 0, (DType)dt);
        case_rmsnorm_backward(3, 4097, 1e-5f, 0, (DType)dt);
    }
    case_attention_backward(1, 1, 1, 8, 0);
    case_attention_backward(37, 8, 2, 64, 0);
    case_attention_backward(50, 4, 4, 40, 13);
    case_attention_backward(20, 4, 1, 128, 0);
    case_swiglu_backward(1, 0), case_swiglu_backward(4099, 0), case_swiglu_backward(17, 1);
    const int distinct[6] = {100, 149, 99, 150, 120, 101}, repeated[9] = {3, 3, 0, 3, 7, 0, 12, 3, 7};
    case_embedding_backward(6, distinct, 33, 100, 50);
    case_embedding_backward(9, repeated, 64, 0, 8);
    case_logprob_backward(6, 1001, 500, 1.0f, 0, 0);
    case_logprob_backward(12, 1001, 0, 0.7f, 1, 0);
    case_logprob_backward(6, 1001, 500, 1.0f, 1, 1);
    case_logprob_backward(1, 32000, 0, 1.0f, 0, 0);
}
static void inv_bf16_matmuls(void) {
    inv_bf16_matmul(1, 1000, 67), inv_bf16_matmul(3, 2048, 40), inv_bf16_matmul(37, 1000, 67);
}
/* CUDA's bf16 matmul on the SIMT kernel too (cuda_matmul_set_simt_bf16(1), the default): the bf16
 * matmul cases against the CPU within the fp32 bound, its rows' batch invariance, and bf16 == fp32 on
 * the upcast weights bit for bit. --self has one matmul: nothing to add. */
static void simt_bf16_checks(void) {
    if (self_mode) return;
    cuda_matmul_set_simt_bf16(1), tc_mode = 0;
    printf("-- bf16 weights on the SIMT kernel (TANDEM_CUDA_MATMUL=simt)\n");
    matmul_cases(1);
    inv_matmul_batch(1000, 67, 1, DTYPE_BF16, 1), inv_matmul_batch(2048, 32, 0, DTYPE_BF16, 8);
    inv_bf16_matmuls();
    cuda_matmul_set_simt_bf16(0), tc_mode = 1;
}
static void invariance_checks(void) {
    for (int dt = 0; dt < 2; dt++) {
        inv_matmul_batch(1000, 67, 1, (DType)dt, 1), inv_matmul_batch(2048, 32, 0, (DType)dt, 8);
        inv_matmul_batch(33, 65, 1, (DType)dt, 1), inv_matmul_batch(24, 70, 1, (DType)dt, 8);
    }
    /* runs: 2 of a leaf with a partial chunk; 16 (two a warp at decode); 4 a leaf x 8 leaves */
    inv_matmul_batch(4096, 40, 1, DTYPE_BF16, 1), inv_matmul_batch(8192, 24, 0, DTYPE_BF16, 8);
    /* bf16-valued x: N = 512, 37, 64 on the hi-only kernel where the shape allows, against decode */
    inv_matmul_batch_x(1000, 67, 1, DTYPE_BF16, 1, 1), inv_matmul_batch_x(2048, 32, 0, DTYPE_BF16, 8, 1);
    inv_matmul_batch_x(1000, 67, 1, DTYPE_BF16, 8, 1), inv_matmul_batch_x(4096, 300, 1, DTYPE_BF16, 1, 1);
    inv_matmul_batch_x(8192, 24, 0, DTYPE_BF16, 8, 1), inv_matmul_batch_x(1024, 40, 1, DTYPE_BF16, 64, 1);
    static const int fast_shape[][4] = {{512, 2048, 256, 1}, {37, 1000, 67, 1}, {300, 1040, 200, 2}, {64, 2048, 70, 8},
                                        {129, 4096, 130, 1}};
    for (int i = 0; i < 5; i++)
        for (int kind = 0; kind < 6; kind++)
            inv_tc_fast(fast_shape[i][0], fast_shape[i][1], fast_shape[i][2], fast_shape[i][3], kind);
    const int skip_n[3] = {1, 20, 64};
    for (int i = 0; i < 3; i++)
        for (int kind = 0; kind < 5; kind++) inv_tc_skip(skip_n[i], kind == 3 ? 1000 : 2048, 70, kind == 1 ? 8 : 1, kind);
    for (int dt = 0; dt < 2; dt++) inv_matmuls(2, 300, (DType)dt), inv_matmuls(9, 1000, (DType)dt);
    for (int dt = 0; dt < 2; dt++) inv_matmul_tp(1, 2048, 67, (DType)dt), inv_matmul_tp(37, 5632, 40, (DType)dt);
    inv_attention(45, 8, 2, 64, 0);
    inv_attention(45, 8, 2, 64, 13);
    inv_attention(40, 4, 4, 40, 0);
    inv_attention(33, 12, 3, 128, 7);
    inv_bf16_matmuls();
    inv_bf16_norm_embed(5, 1000);
    inv_bf16_matmul_backward(37, 130, 300);
}

/* every entry compared; in --self the guard saw no fault and every allocation freed; a requested
 * corruption happened. Returns the failures these add. */
static int final_checks(void) {
    int bad = 0;
    for (int i = 0; i < N_ENTRIES; i++)
        if (!hits[i]) printf("FAIL coverage: %s never compared\n", ENTRIES[i]), bad++;
    if (!bad) printf("coverage: all %d entries compared (%d compute + memory)\n", N_ENTRIES, N_ENTRIES - 1);
    if (dut == &cpu_guarded_backend) {   /* its misuse lines are on stderr; each counts as a failure */
        GuardedStats g = cpu_guarded_stats();
        n_failed += (int)g.faults;
        if (g.live) printf("FAIL guard: %ld dut allocations never freed\n", g.live), bad++;
        printf("guard: %ld dut allocations, every entry pointer in dut memory: %s\n", g.allocs, g.faults ? "NO" : "yes");
    }
    if (corrupt_entry && !corrupted) printf("FAIL corrupt: %s returned nothing to corrupt\n", corrupt_entry), bad++;
    return bad;
}

static int known_entry(const char *name) {
    for (int i = 0; i < N_ENTRIES; i++)
        if (!strcmp(ENTRIES[i], name)) return 1;
    return 0;
}

/* ---- the bf16 tensor-core matmul, host-side (kernels/cuda/matmul_tc.cu, cuda.h) ----------------------
 * The PTX ISA's fragment layout of mma.m16n8k16 for .bf16 ("Matrix Fragments for mma.m16n8k16 with
 * floating point type"), written here from the ISA's text independently of cuda.h; g = lane >> 2,
 * t = lane % 4. A (16 x 16): element i (0..7; register i / 2, low half first) at row g for i in
 * {0, 1, 4, 5}, else g + 8; column 2t + (i & 1), + 8 for i >= 4. B (16 x 8): element i (0..3) at row
 * 2t + (i & 1), + 8 for i >= 2; column g. C, D (16 x 8): element i (0..3) at row g, + 8 for i >= 2;
 * column 2t + (i & 1). */
static void ptx_a(int lane, int i, int *row, int *col) {
    *row = lane / 4 + (i == 2 || i == 3 || i == 6 || i == 7 ? 8 : 0);
    *col = 2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0);
}
static void ptx_b(int lane, int i, int *row, int *col) {
    *row = 2 * (lane % 4) + (i & 1) + (i >= 2 ? 8 : 0);
    *col = lane / 4;
}
static void ptx_c(int lane, int i, int *row, int *col) {
    *row = lane / 4 + (i >= 2 ? 8 : 0);
    *col = 2 * (lane % 4) + (i & 1);
}
static void host_line(int bad, const char *what, const char *shape) {
    printf("%-4s %-27s %-4s %-46s %-9s %-9s %s\n", bad ? "FAIL" : "ok", what, "host", shape, "0.000e+00", "0.000e+00",
           "0.000e+00");
}
/* The kernel's fragment map (cuda.h mma_*) against the ISA's: every A element's row is the ISA's,
 * A and B put the same k in each of the 16 slots, a permutation of 0..15, so D (row, col) = sum over
 * k of W[row][k] x[col][k], each k once; C elements are written where the ISA puts them; and the
 * vector loads' assumptions (a lane's k are 4t .. 4t + 3: registers r and r + 2 of A one 8-byte load,
 * B's two registers one 16-byte load, starts 4-element aligned). Returns the failures. */
static int mma_map_checks(void) {
    int bad = 0, ak[16][16], bk[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) ak[i][j] = -1, bk[j][i % 8] = -1;
    for (int lane = 0; lane < 32; lane++) {
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) {
                int row, col;
                ptx_a(lane, 2 * r + h, &row, &col);
                bad += row != mma_a_row(lane, r) || ak[row][col] != -1;
                ak[row][col] = mma_a_k(lane, r, h);
                bad += mma_a_k(lane, r, h) != mma_a_k(lane, 0, 0) + 2 * (r >> 1) + h || mma_a_row(lane, r) != mma_a_row(lane, r & 1);
            }
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++) {
                int row, col;
                ptx_b(lane, 2 * r + h, &row, &col);
                bad += col != mma_b_col(lane) || bk[row][col] != -1;
                bk[row][col] = mma_b_k(lane, r, h);
                bad += mma_b_k(lane, r, h) != mma_b_k(lane, 0, 0) + 2 * r + h;
            }
        for (int i = 0; i < 4; i++) {
            int row, col;
            ptx_c(lane, i, &row, &col);
            bad += row != mma_c_row(lane, i) || col != mma_c_col(lane, i);
        }
        bad += mma_a_k(lane, 0, 0) % 4 != 0 || mma_b_k(lane, 0, 0) % 4 != 0;
    }
    for (int row = 0; row < 16; row++)
        for (int col = 0; col < 8; col++) {
            int seen[16] = {0};
            for (int slot = 0; slot < 16; slot++) {
                int k = ak[row][slot];
                bad += k < 0 || k >= 16 || k != bk[slot][col];
                if (k >= 0 && k < 16) bad += seen[k]++ != 0;
            }
        }
    host_line(bad, "mma.fragment_map", "A,B,C_vs_PTX_ISA,32_lanes");
    return bad != 0;
}
/* mma_split3 (cuda.h): hi + mid + lo == x exactly for x a multiple of 2^-133 (every |x| >= 2^-110),
 * within 2^-133 below; |mid| + |lo| < 2^-7 |x| (the bound's (1 + 2^-7)); a bf16 value is its own hi;
 * inf and NaN stay in hi. Over random bit patterns of every exponent, and the edges. */
static int mma_split_checks(void) {
    int bad = 0;
    for (int i = 0; i < 1 << 20; i++) {
        uint32_t u = (uint32_t)rand_u64();
        if (i < 64) u = (uint32_t)i | (i & 1 ? 0x80000000u : 0u);   /* the least subnormals */
        if (i >= 64 && i < 128) u = 0x7f7fffffu - (uint32_t)(i - 64); /* the largest floats */
        float x;
        memcpy(&x, &u, 4);
        uint16_t p[3];
        mma_split3(x, p);
        double hi = bf16_to_f32(p[0]), mid = bf16_to_f32(p[1]), lo = bf16_to_f32(p[2]);
        if (isnan(x)) { bad += !isnan(hi) || p[1] || p[2]; continue; }
        if (isinf(x)) { bad += hi != x || p[1] || p[2]; continue; }
        double err = fabs(hi + mid + lo - (double)x);   /* the pieces span <= 24 bits: exact in double */
        int exact = fabs(x) >= 0x1p-110 || fmod(fabs((double)x), 0x1p-133) == 0.0;
        bad += exact ? err != 0.0 : !(err < 0x1p-133);
        bad += !(fabs(mid) + fabs(lo) <= 0x1p-7 * fabs((double)x));
        uint16_t q[3];
        mma_split3(bf16_to_f32(f32_to_bf16(x)), q);   /* a bf16 value: hi alone */
        bad += !isinf(bf16_to_f32(f32_to_bf16(x))) && (q[0] != f32_to_bf16(x) || q[1] || q[2]);
    }
    host_line(bad, "mma.split_exact", "2^20_random_floats_and_edges");
    return bad != 0;
}
/* The kernel's index arithmetic, emulated: for each block, warp (its tile and its share of the tile's
 * units, leaves x runs), unit, and lane and chunk of the unit's run, the operands it loads (with its
 * bounds: row < n_out, x row < N, k < the leaf's end) placed where the ISA says, multiplied slot by
 * slot into the output the ISA's D element is written to: every product W[o][k] x[n][k] is
 * accumulated exactly once into out[n][o], by the unit whose leaf and run hold k; a tile's warps
 * take contiguous aligned power-of-two groups of its units, together each unit once (so their
 * stacks and the shared-memory rounds add tree_sum's tree); every output is written once.
 * Returns the failures. */
static int mma_emulate(int N, int n_in, int n_out, int leaves) {
    MmaGeometry g = cuda_mma_geometry(N, n_in, n_out, leaves);
    unsigned char *count = xcalloc((size_t)N * n_out * (n_in ? n_in : 1), 1), *written = xcalloc((size_t)N * n_out, 1);
    int bad = 0, KL = n_in / leaves, R = g.runs, C = (KL + MMA_K - 1) / MMA_K, S = leaves * R;
    int tiles = g.warps / g.share, per = S / g.share, *cov = xcalloc((size_t)S, sizeof(int));
    bad += R != mma_runs(KL) || per * g.share != S || (per & (per - 1)) != 0;
    for (unsigned bx = 0; bx < g.grid_x; bx++)
        for (unsigned by = 0; by < g.grid_y; by++)
            for (int tile = 0; tile < tiles; tile++) {
                memset(cov, 0, sizeof(int) * (size_t)S);
                for (int sub = 0; sub < g.share; sub++) {
                    int o0 = ((int)bx * tiles + tile) * MMA_M * g.mt, n0 = (int)by * MMA_N * g.nt;
                    if (o0 >= n_out) {
                        bad += g.share > 1;   /* a block that leaves before its __syncthreads */
                        continue;
                    }
                    for (int i = 0; i < per; i++) {
                        int u = sub * per + i, lf = u / R, c0, c1, kb = lf * KL, kend = kb + KL;
                        cov[u]++;
                        mma_run_chunks(C, R, u % R, &c0, &c1);
                        for (int mt = 0; mt < g.mt; mt++)
                            for (int nt = 0; nt < g.nt; nt++)
                                for (int c = c0; c < c1; c++) {
                                    int ao[16][16], ak[16][16], bn[16][8], bk[16][8], kc = kb + c * MMA_K;
                                    for (int lane = 0; lane < 32; lane++) {
                                        for (int e = 0; e < 8; e++) {
                                            int row, col, o = o0 + MMA_M * mt + mma_a_row(lane, e / 2);
                                            int k = kc + mma_a_k(lane, e / 2, e % 2);
                                            ptx_a(lane, e, &row, &col);
                                            ao[row][col] = o < n_out && k < kend ? o : -1, ak[row][col] = k;
                                        }
                                        for (int e = 0; e < 4; e++) {
                                            int row, col, n = n0 + MMA_N * nt + mma_b_col(lane);
                                            int k = kc + mma_b_k(lane, e / 2, e % 2);
                                            ptx_b(lane, e, &row, &col);
                                            bn[row][col] = n < N && k < kend ? n : -1, bk[row][col] = k;
                                        }
                                    }
                                    for (int lane = 0; lane < 32; lane++)
                                        for (int e = 0; e < 4; e++) {
                                            int row, col, o = o0 + MMA_M * mt + mma_c_row(lane, e);
                                            int n = n0 + MMA_N * nt + mma_c_col(lane, e);
                                            ptx_c(lane, e, &row, &col);
                                            for (int slot = 0; slot < 16; slot++) {
                                                if (ao[row][slot] < 0 || bn[slot][col] < 0) continue;   /* a zero operand */
                                                int k = ak[row][slot];
                                                bad += ak[row][slot] != bk[slot][col] || ao[row][slot] != o || bn[slot][col] != n;
                                                bad += k < kb || k >= kend || (k - kb) / MMA_K < c0 || (k - kb) / MMA_K >= c1;
                                                if (o < n_out && n < N && k < n_in) count[((size_t)n * n_out + o) * n_in + k]++;
                                            }
                                        }
                                }
                    }
                    if (sub == 0)   /* share > 1: warp 0 of the block writes the tile's sums */
                        for (int mt = 0; mt < g.mt; mt++)
                            for (int nt = 0; nt < g.nt; nt++)
                                for (int lane = 0; lane < 32; lane++)
                                    for (int e = 0; e < 4; e++) {
                                        int o = o0 + MMA_M * mt + mma_c_row(lane, e), n = n0 + MMA_N * nt + mma_c_col(lane, e);
                                        if (o < n_out && n < N) written[(size_t)n * n_out + o]++;
                                    }
                }
                int o0 = ((int)bx * tiles + tile) * MMA_M * g.mt;
                for (int u = 0; u < S && o0 < n_out; u++) bad += cov[u] != 1;
            }
    for (size_t e = 0; e < (size_t)N * n_out; e++) {
        bad += written[e] != 1;
        for (int k = 0; k < n_in; k++) bad += count[e * n_in + k] != 1;
    }
    free(count), free(written), free(cov);
    return bad;
}
/* The hi-only kernel's index arithmetic (matmul_tc.cu matmul_tc_hi_kernel, cuda.h MmaHiGeometry),
 * emulated as the kernel runs it: per block, the stages' chunks (mma_hi_chunk) staged by the 16-byte
 * copies (mma_hi_w_copy, mma_hi_x_copy; each tile slot written once, a copy wholly inside its leaf
 * and row or zero-filled), each warp's fragments read from the tiles as the kernel reads them, placed
 * where the ISA says: every product W[o][k] x[n][k] accumulated exactly once into out[n][o], while
 * the unit that holds k is open; the units closed in order, each once, the stack within
 * MMA_HI_DEPTH and empty at the end; every output written once. Returns the failures. */
static int mma_hi_emulate(int N, int n_in, int n_out, int leaves, int sms) {
    MmaHiGeometry g = cuda_mma_hi_geometry(N, n_in, n_out, leaves, sms);
    if (!g.ok) return 1;
    int bad = 0, KL = n_in / leaves, R = g.runs, C = (KL + MMA_K - 1) / MMA_K, S = leaves * R, J = leaves * C;
    int BM = MMA_HI_BM, BN = MMA_HI_WN * g.wn, T = 64 * g.wn, NS = (J + MMA_HI_SC - 1) / MMA_HI_SC;
    int MT = MMA_HI_WM / MMA_M, NT = MMA_HI_WN / MMA_N;
    unsigned char *count = xcalloc((size_t)N * n_out * n_in, 1), *written = xcalloc((size_t)N * n_out, 1);
    int *wo = xmalloc(sizeof(int) * BM * MMA_K), *wk = xmalloc(sizeof(int) * BM * MMA_K);
    int *xn = xmalloc(sizeof(int) * BN * MMA_K), *xk = xmalloc(sizeof(int) * BN * MMA_K);
    bad += (g.wn != 2 && g.wn != 4) || R != mma_runs(KL);
    for (unsigned bx = 0; bx < g.grid_x; bx++)
        for (unsigned by = 0; by < g.grid_y; by++) {
            int o0 = (int)bx * BM, n0 = (int)by * BN, u = 0, uend = mma_hi_unit_end(0, C, R), top = 0, closed = 0;
            for (int s = 0; s < NS; s++)
                for (int q = 0; q < MMA_HI_SC; q++) {
                    int j = s * MMA_HI_SC + q, kc, kend;
                    if (j >= J) break;
                    mma_hi_chunk(j, C, KL, &kc, &kend);
                    for (int i = 0; i < BM * MMA_K; i++) wo[i] = -2;
                    for (int i = 0; i < BN * MMA_K; i++) xn[i] = -2;
                    for (int t = 0; t < T; t++) {   /* the copies, thread by thread as the kernel loops */
                        for (int c = 0; c < BM * 2 / T; c++) {
                            int i = t + c * T, row, k;
                            mma_hi_w_copy(i, &row, &k);
                            int ok = o0 + row < n_out && kc + k < kend;
                            for (int e = 0; e < 8; e++) {
                                int slot = row * MMA_K + k + e;
                                bad += row < 0 || row >= BM || k + e >= MMA_K || wo[slot] != -2;
                                if (ok) bad += kc + k + e >= kend || kc + k + e >= n_in;
                                wo[slot] = ok ? o0 + row : -1, wk[slot] = kc + k + e;
                            }
                        }
                        for (int c = 0; c < BN * 4 / T; c++) {
                            int i = t + c * T, row, k;
                            mma_hi_x_copy(i, &row, &k);
                            int ok = n0 + row < N && kc + k < kend;
                            for (int e = 0; e < 4; e++) {
                                int slot = row * MMA_K + k + e;
                                bad += row < 0 || row >= BN || k + e >= MMA_K || xn[slot] != -2;
                                if (ok) bad += kc + k + e >= kend || kc + k + e >= n_in;
                                xn[slot] = ok ? n0 + row : -1, xk[slot] = kc + k + e;
                            }
                        }
                    }
                    for (int i = 0; i < BM * MMA_K; i++) bad += wo[i] == -2;
                    for (int i = 0; i < BN * MMA_K; i++) bad += xn[i] == -2;
                    int lf = u / R, c0, c1;
                    mma_run_chunks(C, R, u % R, &c0, &c1);
                    for (int warp = 0; warp < T / 32; warp++) {
                        int wm = warp & 1, wnn = warp >> 1;
                        for (int mt = 0; mt < MT; mt++)
                            for (int nt = 0; nt < NT; nt++) {
                                int ao[16][16], ak[16][16], bn[16][8], bk[16][8];
                                for (int lane = 0; lane < 32; lane++) {
                                    for (int r = 0; r < 2; r++) {   /* uint2 at (row, k 4t): registers r, r + 2 */
                                        int base = mma_hi_a_off(wm, mt, lane, r);
                                        bad += base % 4 != 0 || base < 0 || base + 4 > BM * MMA_K;
                                        for (int e = 0; e < 4; e++) {
                                            int reg = e < 2 ? r : r + 2, row, col;
                                            ptx_a(lane, 2 * reg + (e & 1), &row, &col);
                                            ao[row][col] = wo[base + e], ak[row][col] = wk[base + e];
                                        }
                                    }
                                    int base = mma_hi_b_off(wnn, nt, lane);
                                    bad += base % 4 != 0 || base < 0 || base + 4 > BN * MMA_K;
                                    for (int e = 0; e < 4; e++) {   /* uint4 .x .y -> register 0, .z .w -> 1 */
                                        int row, col;
                                        ptx_b(lane, e, &row, &col);
                                        bn[row][col] = xn[base + e], bk[row][col] = xk[base + e];
                                    }
                                }
                                for (int lane = 0; lane < 32; lane++)
                                    for (int e = 0; e < 4; e++) {
                                        int row, col, o = o0 + MMA_HI_WM * wm + MMA_M * mt + mma_c_row(lane, e);
                                        int n = n0 + MMA_HI_WN * wnn + MMA_N * nt + mma_c_col(lane, e);
                                        ptx_c(lane, e, &row, &col);
                                        for (int slot = 0; slot < 16; slot++) {
                                            if (ao[row][slot] < 0 || bn[slot][col] < 0) continue;
                                            int k = ak[row][slot];
                                            bad += k != bk[slot][col] || ao[row][slot] != o || bn[slot][col] != n;
                                            bad += k < lf * KL || k >= (lf + 1) * KL || (k - lf * KL) / MMA_K < c0 ||
                                                   (k - lf * KL) / MMA_K >= c1;
                                            if (o < n_out && n < N && k < n_in) count[((size_t)n * n_out + o) * n_in + k]++;
                                        }
                                    }
                            }
                    }
                    if (j + 1 == uend) {   /* the kernel's close: the stack */
                        bad += closed != u;
                        closed++;
                        for (int m = u + 1; m % 2 == 0; m /= 2) top--;
                        bad += top < 0;
                        if (u + 1 < S) {
                            top++;
                            bad += top > MMA_HI_DEPTH;
                            u++;
                            uend = mma_hi_unit_end(u, C, R);
                        }
                    }
                }
            bad += closed != S || top != 0;
            for (int warp = 0; warp < T / 32; warp++)
                for (int mt = 0; mt < MT; mt++)
                    for (int nt = 0; nt < NT; nt++)
                        for (int lane = 0; lane < 32; lane++)
                            for (int e = 0; e < 4; e++) {
                                int o = o0 + MMA_HI_WM * (warp & 1) + MMA_M * mt + mma_c_row(lane, e);
                                int n = n0 + MMA_HI_WN * (warp >> 1) + MMA_N * nt + mma_c_col(lane, e);
                                if (o < n_out && n < N) written[(size_t)n * n_out + o]++;
                            }
        }
    for (size_t e = 0; e < (size_t)N * n_out; e++) {
        bad += written[e] != 1;
        for (int k = 0; k < n_in; k++) bad += count[e * n_in + k] != 1;
    }
    free(count), free(written), free(wo), free(wk), free(xn), free(xk);
    return bad;
}
/* cuda_mma_hi_geometry: ok exactly for N > 32, n_in >= 16, n_in and its leaves' length multiples of 8
 * and at most MMA_HI_MAX_UNITS units; runs mma_runs(n_in / leaves); wn 4 when the 128 x 128 blocks
 * are at least sms, else 2; the grid covers every output and row with less than one block of slack.
 * Returns the failures. */
static int mma_hi_geometry_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 65, 256, 2048, 5632, 32000}, lvs[] = {1, 2, 8, 64}, sms[] = {1, 132};
    static const int ins[] = {64, 1000, 1004, 2048, 4096, 5632, 11008, 65536, 8};
    int bad = 0;
    for (int N = 1; N <= 700; N += N < 140 ? 1 : 37)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
            for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++)
                for (int l = 0; l < 4; l++)
                    for (int m = 0; m < 2; m++) {
                        if (ins[q] % lvs[l]) continue;
                        MmaHiGeometry g = cuda_mma_hi_geometry(N, ins[q], outs[o], lvs[l], sms[m]);
                        int KL = ins[q] / lvs[l], R = mma_runs(KL);
                        int ok = N > 32 && ins[q] >= MMA_K && ins[q] % 8 == 0 && KL % 8 == 0 && lvs[l] * R <= MMA_HI_MAX_UNITS;
                        long bx = (outs[o] + 127) / 128, big = (N + 127) / 128, rows = MMA_HI_WN * (long)g.wn;
                        int wn = bx * big >= sms[m] ? 4 : 2, depth = 0;
                        for (int u = 1; u < lvs[l] * R; u *= 2) depth++;
                        if (g.ok != ok || g.runs != R || g.wn != wn || g.grid_x * (long)MMA_HI_BM < outs[o] ||
                            (g.grid_x - 1) * (long)MMA_HI_BM >= outs[o] || g.grid_y * rows < N || (g.grid_y - 1) * rows >= N ||
                            (ok && depth > MMA_HI_DEPTH))
                            if (bad++ < 5) printf("FAIL geometry.mma_hi N=%d n_in=%d n_out=%d leaves=%d sms=%d\n", N, ins[q], outs[o], lvs[l], sms[m]);
                    }
    host_line(bad, "geometry.mma_hi", "N=1..700,9_n_in,9_n_out,leaves_1..64,sms");
    static const int em[][5] = {{33, 64, 17, 1, 1},    {40, 1000, 67, 1, 132}, {130, 1040, 200, 2, 132}, {100, 8192, 40, 8, 132},
                                {129, 2048, 140, 1, 2}, {48, 1024, 33, 64, 132}, {200, 48, 300, 2, 1}, {65, 4096, 16, 16, 132}};
    int ebad = 0;
    for (size_t i = 0; i < sizeof em / sizeof em[0]; i++) {
        int b = mma_hi_emulate(em[i][0], em[i][1], em[i][2], em[i][3], em[i][4]);
        if (b && ebad < 3) printf("FAIL mma_hi.emulated_cover N=%d n_in=%d n_out=%d leaves=%d sms=%d\n", em[i][0], em[i][1], em[i][2], em[i][3], em[i][4]);
        ebad += b != 0;
    }
    host_line(ebad, "mma_hi.emulated_cover", "8_shapes,wn_2_and_4,partial_chunks,64_units");
    return bad + ebad;
}
/* mma_runs and mma_run_chunks (cuda.h) for every leaf length up to 2^17 and some beyond: R a power of
 * two <= MMA_MAX_RUNS, the largest with C >= 16 R (1 below 32 chunks); the runs cover the chunks in
 * order, none empty, lengths within one of each other, each >= 16 chunks when R > 1. Returns the
 * failures. */
static int mma_run_checks(void) {
    int bad = 0;
    for (long KL = 0; KL <= 1L << 20; KL += KL < 1 << 17 ? 1 : 4093) {
        int C = (int)((KL + MMA_K - 1) / MMA_K), R = mma_runs((int)KL), want = 1;
        while (want < MMA_MAX_RUNS && C >= MMA_RUN_CHUNKS * 2 * want) want *= 2;
        bad += R != want || R < 1 || (R & (R - 1)) || R > MMA_MAX_RUNS || (R > 1 && C < MMA_RUN_CHUNKS * R) ||
               (R < MMA_MAX_RUNS && C >= MMA_RUN_CHUNKS * 2 * R);
        int next = 0, lo = 1 << 30, hi = 0;
        for (int r = 0; r < R; r++) {
            int c0, c1;
            mma_run_chunks(C, R, r, &c0, &c1);
            bad += c0 != next || (C > 0 && c1 <= c0) || (R > 1 && c1 - c0 < MMA_RUN_CHUNKS);
            lo = c1 - c0 < lo ? c1 - c0 : lo, hi = c1 - c0 > hi ? c1 - c0 : hi;
            next = c1;
        }
        bad += next != C || hi - lo > 1;
        if (bad && bad < 3) printf("FAIL mma.runs KL=%ld R=%d\n", KL, R);
    }
    host_line(bad, "mma.runs", "KL=0..2^17,..2^20");
    return bad != 0;
}
/* cuda_mma_geometry: blocks cover every output and x row with less than one block of slack; runs is
 * mma_runs(n_in / leaves); share a power of two dividing leaves x runs, at most MMA_MAX_WARPS, > 1
 * only at N <= 32 (the prefill kernel has no shared memory for it) and then the whole block; a
 * tile the launcher has a kernel for; then the runs, the map, the split, and the emulation at odd
 * shapes. Returns the failures. */
static int mma_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 65, 256, 2048, 5632, 32000}, lvs[] = {1, 2, 8, 64};
    static const int ins[] = {64, 1000, 2048, 4096, 5632, 11008, 65536};
    int bad = 0;
    for (int N = 1; N <= 600; N += N < 80 ? 1 : 37)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
            for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++)
                for (int l = 0; l < 4; l++) {
                    if (ins[q] % lvs[l]) continue;
                    MmaGeometry g = cuda_mma_geometry(N, ins[q], outs[o], lvs[l]);
                    int S = lvs[l] * g.runs, kernel = (g.mt == 1 && g.nt == 1 && g.unroll == 16) ||
                                                      (g.mt == 1 && g.nt == 4 && g.unroll == 4) ||
                                                      (g.mt == 2 && g.nt == 4 && g.unroll == 2 && g.share == 1);
                    if (g.share < 1 || (g.share & (g.share - 1)) || S % g.share || g.share > MMA_MAX_WARPS ||
                        g.warps < 1 || g.warps > MMA_MAX_WARPS || g.warps % g.share || (g.share > 1 && g.warps != g.share) ||
                        (N > 32 && g.share != 1) || g.runs != mma_runs(ins[q] / lvs[l]) || !kernel || g.unroll < 1) {
                        if (bad++ < 5) printf("FAIL geometry.mma N=%d n_in=%d n_out=%d leaves=%d\n", N, ins[q], outs[o], lvs[l]);
                        continue;
                    }
                    long per_x = (long)MMA_M * g.mt * (g.warps / g.share), per_y = (long)MMA_N * g.nt;
                    if (g.grid_x * per_x < outs[o] || (g.grid_x - 1) * per_x >= outs[o] || g.grid_y * per_y < N ||
                        (g.grid_y - 1) * per_y >= N)
                        if (bad++ < 5) printf("FAIL geometry.mma N=%d n_out=%d leaves=%d: grid\n", N, outs[o], lvs[l]);
                }
    host_line(bad, "geometry.mma", "N=1..600,7_n_in,9_n_out,leaves_1..64");
    bad += mma_run_checks() + mma_map_checks() + mma_split_checks();
    static const int em[][4] = {{1, 1, 1, 1},      {7, 33, 65, 1},   {2, 24, 5, 8},     {9, 17, 100, 1},
                                {20, 48, 33, 4},   {40, 33, 70, 1},  {40, 24, 70, 8},   {65, 130, 67, 2},
                                {7, 64, 17, 64},   {1, 0, 3, 1},     {1, 1000, 17, 1},  {20, 4096, 16, 1},
                                {40, 1000, 33, 2}, {3, 8192, 16, 8}, {37, 4100, 20, 1}, {9, 1016, 40, 1}};
    int ebad = 0;
    for (size_t i = 0; i < sizeof em / sizeof em[0]; i++) ebad += mma_emulate(em[i][0], em[i][1], em[i][2], em[i][3]);
    host_line(ebad, "mma.emulated_cover", "16_odd_shapes,every_variant,runs");
    return bad + (ebad != 0) + mma_hi_geometry_checks();
}

/* The matmul's launch geometry (host-side, cuda_matmul_geometry): the grid covers every output row
 * and x row exactly once, with less than one tile of slack, and x rows per warp is the smallest of
 * 1, 2, 4, 8 holding min(N, 8). Runs in every mode, GPU or not. Returns the failures. */
static int geometry_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 256, 2048, 5632, 32000};
    int bad = 0, tile = CUDA_MM_ROWS * CUDA_MM_WARPS;
    for (int N = 1; N <= 70; N++)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
            MatmulGeometry g = cuda_matmul_geometry(N, outs[o]);
            int want_xr = N > 4 ? 8 : N > 2 ? 4 : N;   /* the smallest of 1, 2, 4, 8 that holds min(N, 8) */
            if ((long)g.grid_x * tile < outs[o] || (long)(g.grid_x - 1) * tile >= outs[o] || g.x_rows != want_xr ||
                (long)g.grid_y * g.x_rows < N || (long)(g.grid_y - 1) * g.x_rows >= N) {
                if (bad++ < 5) printf("FAIL geometry N=%d n_out=%d: grid %u x %u, %d x rows per warp\n", N, outs[o], g.grid_x,
                                      g.grid_y, g.x_rows);
            }
        }
    printf("%-4s %-27s %-4s %-46s %-9s %-9s %s\n", bad ? "FAIL" : "ok", "geometry.matmul", "host", "N=1..70,8_n_out_sizes",
           "0.000e+00", "0.000e+00", "0.000e+00");
    return bad + mma_checks();
}

/* The dut's link (NCCL) on a group of one rank, the most one GPU can hold (NCCL refuses two ranks
 * on one device): the library loads, the bootstrap id and the communicator are made, and each call
 * moves the bytes it should (all-gather and broadcast of one rank copy or keep; max keeps; a grouped
 * send to itself and receive from itself copy). Two ranks and more need two GPUs. */
static void link_checks(void) {
    const DeviceLink *L = dut->link;
    if (!L) return;
    char *id = xcalloc(1, L->id_bytes);
    const char *why = L->make_id(id);
    if (why) {
        printf("note link: %s: %s (groups of ranks on their own GPUs would stage through host memory)\n", L->name, why);
        free(id);
        return;
    }
    void *h = NULL;
    why = L->open(&h, id, 0, 1);
    if (why) printf("FAIL link: open: %s\n", why), n_failed++;
    size_t n = 1000;
    float *x = rand_f32(n, 1.0f), *got = xmalloc(fb(n));
    Dev d = {dut, {0}, 0};
    float *a = dput(&d, x, fb(n)), *b = dput(&d, NULL, fb(n)), *c = dput(&d, NULL, fb(n));
    const char *what[4] = {"link.all_gather", "link.broadcast", "link.max", "link.send_recv_self"};
    for (int k = 0; k < 4 && h; k++) {
        if (k == 0) L->all_gather(h, a, b, n);
        if (k == 1) dut->copy(b, a, n), L->broadcast(h, b, fb(n), 0);
        if (k == 2) dut->copy(b, a, n), L->max(h, b, n);
        if (k == 3) L->group_begin(), L->send(h, a, fb(n), 0), L->recv(h, c, fb(n), 0), L->group_end(), dut->copy(b, c, n);
        dget(&d, got, b, fb(n));
        dut->zero(b, fb(n));
        cmp_exact(what[k], DTYPE_F32, "ranks=1,n=1000", got, x, n);
    }
    if (h) L->close(h);
    dfree(&d);
    free(x), free(got), free(id);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--self")) self_mode = 1;
        else if (!strcmp(argv[i], "--corrupt")) corrupt_entry = "attention";
        else if (!strncmp(argv[i], "--corrupt=", 10) && known_entry(argv[i] + 10)) corrupt_entry = argv[i] + 10;
        else {
            fprintf(stderr, "usage: cuda_vs_cpu [--self] [--corrupt[=ENTRY]]\n");
            return 2;
        }
    }
    if (geometry_checks()) return 1;
    backend_set_threads(0);
    ref = &cpu_backend;
    dut = self_mode ? &cpu_guarded_backend : backend_named("cuda");
    if (self_mode) cpu_guarded_count_faults(1);   /* a misused argument fails its run, not the process */
    if (!dut) {
        printf("SKIP: this build has no CUDA backend (cuda_backend not linked)\n");
        return 77;
    }
    const char *why = dut->open(0);
    if (why) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    if (ref->open(0)) return 2;
    if (!self_mode) cuda_matmul_set_simt_bf16(0), tc_mode = 1;   /* bf16 weights on the tensor cores first */
    printf("dut %s vs ref %s, %d threads%s\n", dut->name, ref->name, threads(),
           corrupt_entry ? ", one bit corrupted" : "");
    printf("%-4s %-27s %-4s %-46s %-9s %-9s %s\n", "", "entry", "type", "shape", "max_abs", "max_rel", "tol");
    case_memory();
    forward_cases();
    attention_cases();
    elementwise_cases();
    logit_cases();
    backward_cases();
    invariance_checks();
    simt_bf16_checks();
    link_checks();
    int bad = final_checks();
    if (n_failed || bad) {
        printf("FAIL: %d of %d cases failed%s\n", n_failed, n_cases, bad ? ", and the final checks above" : "");
        return 1;
    }
    printf("PASS: %d cases, dut %s %s ref %s\n", n_cases, dut->name, self_mode ? "is exactly" : "matches", ref->name);
    return 0;
}
