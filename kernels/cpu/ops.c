/* ops.c — CPU kernels (the oracle for CUDA). Matmuls go to OpenBLAS; the rest are plain loops.
 * Owns no memory and does no communication. */
#include "kernels/kernels.h"
#include <cblas.h>
#include <math.h>
#include <string.h>

void cpu_set_threads(int n) { openblas_set_num_threads(n > 0 ? n : 1); }

void cpu_matmul(float *out, const float *x, const float *w, const float *bias, int N, int n_in, int n_out) {
    if (N == 0 || n_out == 0) return;
    if (bias) {
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * n_out, bias, sizeof(float) * n_out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n_out, n_in, 1.0f, x, n_in, w, n_in,
                bias ? 1.0f : 0.0f, out, n_out);
}

void cpu_rmsnorm(float *out, const float *x, const float *w, int N, int D, float eps) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * D;
        float *o = out + (size_t)n * D;
        float ss = 0.0f;
        for (int i = 0; i < D; i++) ss += xr[i] * xr[i];
        float scale = 1.0f / sqrtf(ss / D + eps);
        for (int i = 0; i < D; i++) o[i] = w[i] * (xr[i] * scale);
    }
}

void cpu_rope(float *x, const int *pos, const float *inv_freq, int N, int n_heads, int Dh) {
    int half = Dh / 2;
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[n] * inv_freq[i];
            float c = cosf(angle), s = sinf(angle);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((size_t)n * n_heads + h) * Dh;
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;        /* x * cos + rotate_half(x) * sin, rotate_half = (-b, a) */
                xh[i + half] = b * c + a * s;
            }
        }
    }
}

void cpu_attention(float *out, const float *q, const float *k, const float *v, const int *table, int block,
                   int Tq, int q_pos0, int H, int Hkv, int Dh, int window, float *scratch) {
    int group = H / Hkv;
    float scale = 1.0f / sqrtf((float)Dh);
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
    for (int h = 0; h < H; h++) {
        int hk = h / group;
        for (int t = 0; t < Tq; t++) {
            int i = q_pos0 + t;
            const float *qi = q + t * qs + (size_t)h * Dh;
            int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
            float mx = -INFINITY;
            for (int j = j0; j <= i; j++) {
                const float *kj = k + ((size_t)table[j / block] * block + j % block) * ks + (size_t)hk * Dh;
                float s = 0.0f;
                for (int d = 0; d < Dh; d++) s += qi[d] * kj[d];
                s *= scale;
                scratch[j] = s;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int j = j0; j <= i; j++) sum += (scratch[j] = expf(scratch[j] - mx));
            float *oi = out + t * qs + (size_t)h * Dh;
            memset(oi, 0, sizeof(float) * Dh);
            for (int j = j0; j <= i; j++) {
                const float *vj = v + ((size_t)table[j / block] * block + j % block) * ks + (size_t)hk * Dh;
                float p = scratch[j] / sum;
                for (int d = 0; d < Dh; d++) oi[d] += p * vj[d];
            }
        }
    }
}

void cpu_swiglu(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void cpu_embedding(float *out, const float *table, const int *ids, int N, int D, int v0, int V_local) {
    for (int n = 0; n < N; n++) {
        int r = ids[n] - v0;
        float *o = out + (size_t)n * D;
        if (r >= 0 && r < V_local) memcpy(o, table + (size_t)r * D, sizeof(float) * D);
        else memset(o, 0, sizeof(float) * D);
    }
}
