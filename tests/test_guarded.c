/* test_guarded.c — the cpu-guarded backend (kernels/cpu/guarded.c) catches what it exists for, and
 * computes what the CPU backend computes.
 * Usage: test_guarded CASE
 *   ok          a matmul, an embedding and paged attention on guarded memory give the CPU backend's
 *               bits; to_device / to_host round-trip; zero zeroes; prints "ok", exits 0
 *   host-arg    matmul handed a host x: its one line names the entry and the argument, then abort
 *   host-ints   embedding handed host ids: the same for an int array
 *   host-table  attention with a host block table (KVLayout.table)
 *   host-read   the host reads guarded memory directly: a segfault, with its one line
 *   host-write  the host writes it directly: the same
 *   freed       a kernel handed a freed buffer
 *   short       matmul's out one float shorter than its (N, n_out): the line names out and the bytes
 * The counting mode (cpu_guarded_count_faults) is tests/test_backend.c's. */
#include "kernels/cpu/cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const Backend *G = &cpu_guarded_backend;

/* n floats on the guarded backend, holding v[i] */
static float *up(const float *v, size_t n) {
    float *d = G->alloc(sizeof(float) * n);
    G->to_device(d, v, sizeof(float) * n);
    return d;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: test_guarded CASE\n"); return 2; }
    const char *c = argv[1];
    if (G->open(0)) return 1;
    cpu_set_threads(2);   /* attention's scratch below: 64 threads at most */
    enum { N = 5, K = 48, O = 33, V = 20, H = 4, HKV = 2, DH = 16, BLOCK = 4, T = 7 };
    float x[N * K], w[O * K], out[N * O], ref[N * O];
    unsigned s = 7;
    for (int i = 0; i < N * K; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
    for (int i = 0; i < O * K; i++) w[i] = (float)((s = s * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
    float *dx = up(x, N * K), *dw = up(w, O * K), *dout = G->alloc(sizeof out);

    if (!strcmp(c, "host-arg")) G->matmul(dout, x, dw, NULL, DTYPE_F32, N, K, O, 1);
    if (!strcmp(c, "host-ints")) {
        int ids[N] = {1, 2, 3, 4, 5};
        float *demb = G->alloc(sizeof(float) * N * K);
        G->embedding(demb, dw, DTYPE_F32, ids, N, K, 0, O);
    }
    if (!strcmp(c, "host-read")) printf("%g\n", dx[3]);
    if (!strcmp(c, "host-write")) dx[3] = 1.0f;
    if (!strcmp(c, "short")) {
        float *dshort = G->alloc(sizeof out - sizeof(float));   /* (N, O) less one float */
        G->matmul(dshort, dx, dw, NULL, DTYPE_F32, N, K, O, 1);
    }
    if (!strcmp(c, "freed")) {
        G->free(dx);
        G->matmul(dout, dx, dw, NULL, DTYPE_F32, N, K, O, 1);
    }

    /* paged attention over T keys in blocks of BLOCK (table {1, 0}), queries at positions 0 .. T-1 */
    int table[2] = {1, 0}, pos[T];
    float q[T * H * DH], kv[2 * BLOCK * HKV * DH], att[T * H * DH], att_ref[T * H * DH], scratch[64 * H * T];
    for (int i = 0; i < T; i++) pos[i] = i;
    for (int i = 0; i < T * H * DH; i++) q[i] = (float)((s = s * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
    for (int i = 0; i < 2 * BLOCK * HKV * DH; i++) kv[i] = (float)((s = s * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
    int *dtable = G->alloc(sizeof table), *dpos = G->alloc(sizeof pos);
    G->to_device(dtable, table, sizeof table);
    G->to_device(dpos, pos, sizeof pos);
    float *dq = up(q, T * H * DH), *dk = up(kv, 2 * BLOCK * HKV * DH), *datt = G->alloc(sizeof att);
    float *dscratch = G->alloc(sizeof scratch);
    if (!strcmp(c, "host-table")) {
        KVLayout paged = kv_paged(table, BLOCK, DH);
        G->attention(datt, dq, dk, dk, &paged, T, 0, H, HKV, DH, 0, dscratch);
    }
    if (strcmp(c, "ok")) { fprintf(stderr, "test_guarded: case %s was not caught\n", c); return 1; }

    int bad = 0;
    cpu_matmul(ref, x, w, NULL, DTYPE_F32, N, K, O, 1);
    G->matmul(dout, dx, dw, NULL, DTYPE_F32, N, K, O, 1);
    G->to_host(out, dout, sizeof out);
    bad |= memcmp(out, ref, sizeof out) != 0;
    int ids[N] = {0, 7, 32, 3, 3};
    float emb[N * K], emb_ref[N * K], *demb = G->alloc(sizeof emb);
    int *dids = G->alloc(sizeof ids);
    G->to_device(dids, ids, sizeof ids);
    cpu_embedding(emb_ref, w, DTYPE_F32, ids, N, K, 0, O);
    G->embedding(demb, dw, DTYPE_F32, dids, N, K, 0, O);
    G->to_host(emb, demb, sizeof emb);
    bad |= memcmp(emb, emb_ref, sizeof emb) != 0;
    KVLayout host_paged = kv_paged(table, BLOCK, DH), dev_paged = kv_paged(dtable, BLOCK, DH);
    cpu_attention(att_ref, q, kv, kv, &host_paged, T, 0, H, HKV, DH, 0, scratch);
    G->attention(datt, dq, dk, dk, &dev_paged, T, 0, H, HKV, DH, 0, dscratch);
    G->to_host(att, datt, sizeof att);
    bad |= memcmp(att, att_ref, sizeof att) != 0;
    G->zero(dout, sizeof out);
    G->to_host(out, dout, sizeof out);
    for (int i = 0; i < N * O; i++) bad |= out[i] != 0.0f;
    G->free(dx); G->free(dw); G->free(dout); G->free(dtable); G->free(dpos); G->free(dq); G->free(dk);
    G->free(datt); G->free(dscratch); G->free(dids); G->free(demb);
    printf(bad ? "FAIL: cpu-guarded differs from cpu\n" : "ok\n");
    return bad;
}
