/* test_bf16_kernels.c — the CPU's bf16 choices (kernels/cpu/cpu.h):
 * 1. vdpbf16ps's emulation (cpu_dpbf16_lane) against the instruction itself, lane by lane, bit for
 *    bit, where the CPU has AVX512_BF16 (said so where it has not: then only the emulation runs):
 *    random pairs, denormal inputs, products and sums that land in the denormals, overflow, exact
 *    cancellation (the sign of zero), NaN (compared as NaN);
 * 2. --cpu-bf16-dot native's matmul against a restatement of its documented arithmetic (each run: 16
 *    lanes over 32-element chunks zero-padded, cpu_dpbf16_lane per pair, hsum16's tree written out;
 *    runs by tree_sum; then the bias), bit for bit, instruction and emulation alike; rows alone vs
 *    batches at offsets and 1 and 2 threads (batch invariance); and not the exact path's bits;
 * 3. --kv-dtype bf16's attention: cpu_attention_batch on a bf16 cache has the bits of the fp32 cache
 *    holding the same bf16-rounded keys and values (block sizes 16 and 5, decode and prefill rows),
 *    and differs from attention on the unrounded fp32 keys and values by at most the bound derived
 *    below from bf16's relative rounding error.
 * Usage: test_bf16_kernels (one line per check; exits 1 on any failure) */
#include "kernels/cpu/cpu.h"
#include "runtime/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned rng = 7;
static float frand(void) {
    rng = rng * 1103515245u + 12345u;
    return ((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}
static uint32_t urand(void) {
    rng = rng * 1103515245u + 12345u;
    uint32_t a = rng >> 16;
    rng = rng * 1103515245u + 12345u;
    return a | (rng & 0xffff0000u);
}
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* two bf16 in a dword: lo = element 2i, hi = element 2i + 1 */
static uint32_t pair(float lo, float hi) { return f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16; }

/* 1. the emulation against the instruction: 16 lanes per call, `calls` calls of each kind */
static int check_lane_model(void) {
    /* the SDM's rounding at the normal boundary, on every machine: the exact sum 2^-126 - 2^-150 rounds
     * (24 bits, unbounded exponent) to itself, below 2^-126: flushed to +0 (fmaf alone gives 2^-126) */
    float edge = cpu_dpbf16_lane(0x1p-126f, pair(0.0f, -0x1p-75f), pair(0.0f, 0x1p-75f));
    printf("vdpbf16ps emulation: 2^-126 + (-2^-75 x 2^-75) = %a (want 0x0p+0)\n", edge);
    if (bits(edge) != 0) return 1;
    if (!cpu_has_avx512bf16()) {
        printf("vdpbf16ps: this CPU has no AVX512_BF16: the emulation alone runs (NOT compared with the instruction)\n");
        return 0;
    }
    int bad = 0, n = 0;
    for (int kind = 0; kind < 7; kind++)
        for (int call = 0; call < 4000; call++) {
            float acc[16], want[16], acc0[16];
            uint32_t a[16], b[16];
            for (int l = 0; l < 16; l++) {
                switch (kind) {
                case 0: acc[l] = frand() * 4; a[l] = pair(frand(), frand()); b[l] = pair(frand(), frand()); break;
                case 1: /* any bit patterns: denormals, inf, NaN, huge and tiny exponents */
                    acc[l] = from_bits(urand()); a[l] = urand(); b[l] = urand(); break;
                case 2: /* products near the denormal range: 2^-63 x 2^-63 and around */
                    acc[l] = frand() * 0x1p-124f; a[l] = pair(frand() * 0x1p-62f, frand() * 0x1p-64f);
                    b[l] = pair(frand() * 0x1p-62f, frand() * 0x1p-63f); break;
                case 3: /* denormal bf16 inputs and accumulators */
                    acc[l] = frand() * 0x1p-127f; a[l] = pair(frand() * 0x1p-128f, frand());
                    b[l] = pair(frand(), frand() * 0x1p-130f); break;
                case 4: /* exact cancellation: acc = -(hi product), lo product 0 or -0 */
                    { float x = frand(), y = frand(); a[l] = pair(call & 1 ? -0.0f : 0.0f, x); b[l] = pair(frand(), y);
                      acc[l] = -(bf16_to_f32(f32_to_bf16(x)) * bf16_to_f32(f32_to_bf16(y))); } break;
                case 5: /* sums within 2^-149 of +-2^-126: the flush decided after the rounding */
                    { float sg = call & 1 ? -1.0f : 1.0f; acc[l] = sg * 0x1p-126f;
                      a[l] = pair(frand() * 0x1p-90f, -sg * (1.0f + (float)(urand() % 8) / 128.0f) * 0x1p-75f);
                      b[l] = pair(frand() * 0x1p-90f, (1.0f + (float)(urand() % 8) / 128.0f) * 0x1p-75f); } break;
                default: /* overflow */
                    acc[l] = frand() * 0x1p127f; a[l] = pair(frand() * 0x1p64f, frand() * 0x1p64f);
                    b[l] = pair(frand() * 0x1p64f, frand() * 0x1p63f); break;
                }
                want[l] = cpu_dpbf16_lane(acc[l], a[l], b[l]);
            }
            memcpy(acc0, acc, sizeof acc);
            cpu_dpbf16_hw(acc, a, b);
            for (int l = 0; l < 16; l++, n++)
                if (!(bits(acc[l]) == bits(want[l]) || (isnan(acc[l]) && isnan(want[l])))) {
                    if (bad++ < 5)
                        printf("  kind %d: acc %a a %08x b %08x: instruction %a (%08x), emulation %a (%08x)\n", kind, acc0[l],
                               a[l], b[l], acc[l], bits(acc[l]), want[l], bits(want[l]));
                }
        }
    printf("vdpbf16ps: the emulation against the instruction, %d lanes (random, any bits, denormal products and "
           "inputs, cancellation, the 2^-126 boundary, overflow): %s\n", n, bad ? "DIFFERENT" : "bit-identical");
    return bad != 0;
}

/* hsum16's tree written out: lanes i + (i + 8), then i + (i + 4), then 0 + 2, 1 + 3, then those two */
static float tree16(const float *a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    float d0 = c[0] + c[2], d1 = c[1] + c[3];
    return d0 + d1;
}
/* the native dot of one run of K (x already bf16 values) */
static float native_dot_ref(const float *x, const uint16_t *w, int K) {
    float lane[16] = {0};
    for (int k = 0; k < K; k += 32)
        for (int l = 0; l < 16; l++) {
            int e = k + 2 * l;
            uint32_t a = (e < K ? f32_to_bf16(x[e]) : 0) | (uint32_t)(e + 1 < K ? f32_to_bf16(x[e + 1]) : 0) << 16;
            uint32_t b = (e < K ? w[e] : 0) | (uint32_t)(e + 1 < K ? w[e + 1] : 0) << 16;
            lane[l] = cpu_dpbf16_lane(lane[l], a, b);
        }
    return tree16(lane);
}

/* 2. the native matmul */
static int check_native_matmul(void) {
    const int shapes[][2] = {{16, 4}, {33, 7}, {64, 64}, {96, 9}, {288, 40}, {47, 13}, {1, 5}, {768, 6}};
    int bad = 0, bad_inv = 0, same_as_exact = 0, outputs = 0, hw = cpu_has_avx512bf16();
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int K = shapes[si][0], O = shapes[si][1], NMAX = 37;
        float *x = xmalloc(sizeof(float) * NMAX * K), *ref = xmalloc(sizeof(float) * NMAX * O), *out = xmalloc(sizeof(float) * NMAX * O);
        float *ex = xmalloc(sizeof(float) * NMAX * O);
        uint16_t *w = xmalloc(2 * (size_t)O * K), *bias = xmalloc(2 * (size_t)O);
        for (int i = 0; i < NMAX * K; i++) x[i] = bf16_to_f32(f32_to_bf16(frand()));   /* bf16 mode's matmul inputs */
        for (int i = 0; i < O * K; i++) w[i] = f32_to_bf16(frand());
        for (int i = 0; i < O; i++) bias[i] = f32_to_bf16(frand());
        for (int leaves = 1; leaves <= 8; leaves *= 2) {
            if (K % leaves) continue;
            int Kl = K / leaves;
            for (int n = 0; n < NMAX; n++)
                for (int o = 0; o < O; o++) {
                    float part[8];
                    for (int l = 0; l < leaves; l++) part[l] = native_dot_ref(x + (size_t)n * K + l * Kl, w + (size_t)o * K + l * Kl, Kl);
                    tree_sum(part, leaves, 1);
                    ref[(size_t)n * O + o] = part[0] + bf16_to_f32(bias[o]);
                }
            for (int emu = 0; emu <= hw; emu++) {   /* the instruction (where present), then the emulation */
                cpu_bf16_dot_emulate(emu || !hw);
                cpu_set_bf16_dot(1);
                for (int th = 1; th <= 2; th++) {
                    cpu_set_threads(th);
                    for (int N = 1; N <= NMAX; N += N < 5 ? 1 : 8)
                        for (int off = 0; off + N <= NMAX; off += N + 3) {
                            cpu_matmul(out, x + (size_t)off * K, w, bias, DTYPE_BF16, N, K, O, leaves);
                            if (memcmp(out, ref + (size_t)off * O, sizeof(float) * N * O)) *(N == NMAX ? &bad : &bad_inv) += 1;
                        }
                }
                cpu_set_bf16_dot(0);
            }
            cpu_matmul(ex, x, w, bias, DTYPE_BF16, NMAX, K, O, leaves);
            for (int i = 0; i < NMAX * O; i++, outputs++) same_as_exact += ex[i] == ref[i];
        }
        free(x); free(ref); free(out); free(ex); free(w); free(bias);
    }
    cpu_bf16_dot_emulate(0);
    cpu_set_threads(1);
    printf("--cpu-bf16-dot native matmul (%s): the documented arithmetic restated: %s; batches 1..37 at offsets, 1 and 2 "
           "threads, 1-8 leaves: %s; equal to the exact path in %d of %d outputs\n",
           hw ? "the instruction and the emulation" : "the emulation", bad ? "DIFFERENT" : "bit-identical",
           bad_inv ? "DIFFERENT" : "bit-identical", same_as_exact, outputs);
    return bad != 0 || bad_inv != 0 || same_as_exact == outputs;
}

/* 3. attention on a bf16 cache. The bound: keys and values rounded to bf16 move each by at most
 * u = 2^-8 of itself (bf16 keeps 8 significant bits: round to nearest is within 2^-9, 2^-8 leaves
 * room). A score s_j = scale * q.k_j then moves by at most d_j = u * scale * sum_i |q_i k_ji| (plus
 * fp32's own rounding, ~K 2^-24 of the same sum, absorbed in u's factor of 2); the softmax
 * p_j = exp(s_j) / sum exp(s) by at most a factor exp(+-2 dmax) each, so |dp_j| <= p_j (e^(2 dmax) - 1);
 * the output o_d = sum_j p_j v_jd then moves by at most
 *   sum_j |dp_j| |v_jd| + sum_j p_j u |v_jd|  <=  (e^(2 dmax) - 1 + u (1 + e^(2 dmax) - 1)) sum_j p_j |v_jd|
 * (p the unrounded run's probabilities), plus fp32 rounding of o, bounded by 2^-20 sum_j p_j |v_jd|. */
static int check_attention(void) {
    enum { H = 4, HKV = 2, DH = 32, T = 41 };
    int bad_bits = 0, bad_bound = 0, cases = 0;
    double worst = 0;   /* the largest difference as a fraction of its bound */
    for (int bs = 5; bs <= 16; bs += 11) {
        int nb = (T + bs - 1) / bs;
        size_t kvd = HKV * DH, pool = (size_t)nb * bs * kvd;
        float *k = xmalloc(sizeof(float) * T * kvd), *v = xmalloc(sizeof(float) * T * kvd), *q = xmalloc(sizeof(float) * T * H * DH);
        float *kr = xmalloc(sizeof(float) * T * kvd), *vr = xmalloc(sizeof(float) * T * kvd);
        for (size_t i = 0; i < T * kvd; i++) { k[i] = 3 * frand(); v[i] = frand(); }
        for (size_t i = 0; i < (size_t)T * H * DH; i++) q[i] = 3 * frand();
        memcpy(kr, k, sizeof(float) * T * kvd);
        memcpy(vr, v, sizeof(float) * T * kvd);
        cpu_round_to(kr, T * kvd, DTYPE_BF16);
        cpu_round_to(vr, T * kvd, DTYPE_BF16);
        int table[16], pos[T], seq[T], start[2] = {0, T};
        for (int b = 0; b < nb; b++) table[b] = nb - 1 - b;   /* blocks in reverse: a real table */
        for (int t = 0; t < T; t++) pos[t] = t, seq[t] = 0;
        float *kc32 = xcalloc(pool, 4), *vc32 = xcalloc(pool, 4), *kc16 = xcalloc(pool, 2), *vc16 = xcalloc(pool, 2);
        float *kc0 = xcalloc(pool, 4), *vc0 = xcalloc(pool, 4);
        float *o32 = xmalloc(sizeof(float) * T * H * DH), *o16 = xmalloc(sizeof(float) * T * H * DH), *o0 = xmalloc(sizeof(float) * T * H * DH);
        float *scratch = xmalloc(sizeof(float) * 4 * H * T);
        PagedBatch pb = {table, 0, bs, seq, pos, T, 1, 0, start, pos, DTYPE_F32};
        cpu_kv_store_batch(kc32, vc32, kr, vr, &pb, HKV, DH);
        cpu_kv_store_batch(kc0, vc0, k, v, &pb, HKV, DH);
        cpu_attention_batch(o32, q, kc32, vc32, &pb, H, HKV, DH, 0, scratch, (size_t)H * T);
        cpu_attention_batch(o0, q, kc0, vc0, &pb, H, HKV, DH, 0, scratch, (size_t)H * T);
        pb.kv_dtype = DTYPE_BF16;
        cpu_kv_store_batch(kc16, vc16, k, v, &pb, HKV, DH);   /* unrounded in: the store rounds */
        cpu_attention_batch(o16, q, kc16, vc16, &pb, H, HKV, DH, 0, scratch, (size_t)H * T);
        bad_bits += memcmp(o16, o32, sizeof(float) * T * H * DH) != 0;
        /* decode: the last row alone against the cache (a one-row batch at position T - 1) */
        PagedBatch one = {table, 0, bs, seq, pos + T - 1, 1, 1, 0, (int[]){0, 1}, pos + T - 1, DTYPE_BF16};
        float last[H * DH];
        cpu_attention_batch(last, q + (size_t)(T - 1) * H * DH, kc16, vc16, &one, H, HKV, DH, 0, scratch, (size_t)H * T);
        bad_bits += memcmp(last, o32 + (size_t)(T - 1) * H * DH, sizeof last) != 0;
        /* the bound, per output element, from the unrounded run */
        const double u = 0x1p-8, scale = 1.0 / sqrt((double)DH);
        for (int i = 0; i < T; i++)
            for (int h = 0; h < H; h++) {
                const float *qi = q + ((size_t)i * H + h) * DH;
                int hk = h / (H / HKV);
                double s[T], dmax = 0, mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0, mag = 0;
                    for (int d = 0; d < DH; d++) {
                        double kv_ = k[(size_t)j * kvd + hk * DH + d];
                        dot += qi[d] * kv_, mag += fabs(qi[d] * kv_);
                    }
                    s[j] = scale * dot;
                    dmax = fmax(dmax, u * scale * mag);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                double grow = exp(2 * dmax) - 1;
                for (int d = 0; d < DH; d++) {
                    double pv = 0;
                    for (int j = 0; j <= i; j++) pv += exp(s[j] - mx) / sum * fabs(v[(size_t)j * kvd + hk * DH + d]);
                    double bound = (grow + u * (1 + grow) + 0x1p-20) * pv;
                    size_t e = ((size_t)i * H + h) * DH + d;
                    double diff = fabs((double)o16[e] - o0[e]);
                    cases++;
                    if (diff > bound) bad_bound++;
                    if (bound > 0) worst = fmax(worst, diff / bound);
                }
            }
        free(k); free(v); free(q); free(kr); free(vr); free(kc32); free(vc32); free(kc16); free(vc16); free(kc0); free(vc0);
        free(o32); free(o16); free(o0); free(scratch);
    }
    printf("--kv-dtype bf16 attention (blocks 5 and 16, prefill rows and a decode row): the fp32 cache's bits on the "
           "rounded keys and values: %s; against the unrounded: %d of %d outputs within the derived bound (largest "
           "difference %.3f of its bound)\n", bad_bits ? "DIFFERENT" : "bit-identical", cases - bad_bound, cases, worst);
    return bad_bits != 0 || bad_bound != 0 || worst == 0;
}

int main(void) {
    cpu_set_threads(1);
    int fail = check_lane_model();
    fail |= check_native_matmul();
    fail |= check_attention();
    return fail;
}
