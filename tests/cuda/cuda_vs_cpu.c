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
 * Owns: main, the report, the random inputs, the memory and link cases and the drivers' order; the
 * cases are in one file per entry family, the tolerances' derivation in cuda_vs_cpu.h (its files
 * are listed there). --self runs on
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
#include "tests/cuda/cuda_vs_cpu.h"

const Backend *ref, *dut;    /* the oracle and the table under test */
int self_mode;               /* --self: dut is the CPU table too, every difference must be 0 */
const char *cur_entry;       /* the entry the running case compares (--corrupt's hook) */
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
uint64_t rand_u64(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
float rand_uniform(void) { return (float)(rand_u64() >> 40) / (float)(1 << 24) * 2.0f - 1.0f; } /* [-1, 1) */
int rand_int(int n) { return (int)(rand_u64() % (uint64_t)n); }                              /* [0, n) */

float *rand_f32(size_t n, float amp) { /* (n) uniform in [-amp, amp) */
    float *a = xmalloc(fb(n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = amp * rand_uniform();
    return a;
}
/* f (n) stored as a weight of dtype dt (returned, host); bf16: f becomes the upcast of the rounded
 * values, the exact fp32 values the mags and the fp32 twin of a bf16 call read */
void *store_weight(float *f, DType dt, size_t n) {
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
float *rand_weight(void **w, DType dt, size_t n, float amp) {
    float *f = rand_f32(n, amp);
    *w = store_weight(f, dt, n);
    return f;
}
/* (n) integers exact in fp32: bits 0: +-1; else odd, |v| in [2^(bits-1) + 1, 2^bits - 1] (bits significant
 * bits; 12: [2049, 4095]) */
float *rand_ints(size_t n, int bits) {
    float *a = xmalloc(fb(n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float m = bits ? (float)((1 << (bits - 1)) + 1 + 2 * rand_int(1 << (bits - 2))) : 1.0f;
        a[i] = rand_u64() >> 63 ? -m : m;
    }
    return a;
}
/* x[0..) gets the values at the edges of rounding first: ties to even down and up, a tie up to inf,
 * NaNs (quiet, signalling, negative), infinities, the largest float, a subnormal, -0 */
void plant_specials(float *x, size_t n) {
    static const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7f8000u, 0x7fc00000u,
                                    0x7fa00001u, 0xffc12345u, 0xff800000u, 0x7f800000u, 0x7f7fffffu,
                                    0x00012345u, 0x80000000u, 0xbf7f8000u, 0x00000001u};
    for (size_t i = 0; i < n && i < sizeof bits / sizeof bits[0]; i++) memcpy(x + i, bits + i, 4);
}
double *dzeros(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }

/* ---- the report ---------------------------------------------------------------------------------- */
static void mark(const char *entry) {
    size_t len = strcspn(entry, ".");
    for (int i = 0; i < N_ENTRIES; i++)
        if (strlen(ENTRIES[i]) == len && !strncmp(ENTRIES[i], entry, len)) hits[i]++;
}
void report(const char *entry, DType dt, const char *shape, double max_abs, double max_rel, double tol, int ok) {
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
void cmp_exact(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n) {
    cmp_floats(entry, dt, shape, got, want, n, NULL, 0.0, 0.0, 0);
}
void cmp_tol(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n,
                    const double *mag, double tol, double floor) {
    cmp_floats(entry, dt, shape, got, want, n, mag, tol, floor, 0);
}
/* the dut against itself: the same bits */
void cmp_bits(const char *entry, DType dt, const char *shape, const float *got, const float *want, size_t n) {
    cmp_floats(entry, dt, shape, got, want, n, NULL, 0.0, 0.0, 1);
}
void cmp_ints(const char *entry, const char *shape, const int *got, const int *want, size_t n) {
    double max_abs = 0.0;
    for (size_t i = 0; i < n; i++) max_abs = fmax(max_abs, fabs((double)got[i] - want[i]));
    report(entry, DTYPE_F32, shape, max_abs, 0.0, 0.0, max_abs == 0.0);
}
static int bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
void cmp_bf16(const char *entry, const char *shape, const uint16_t *got, const uint16_t *want, size_t n) {
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
/* bytes of be's memory holding host (NULL: zeroed, alloc's contract) */
void *dput(Dev *d, const void *host, size_t bytes) {
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
void dget(Dev *d, void *host, const void *src, size_t bytes) {
    d->be->to_host(host, src, bytes);
    if (d->be == dut && corrupt_entry && !corrupted && cur_entry && !strcmp(cur_entry, corrupt_entry) && bytes >= 4) {
        ((unsigned char *)host)[bytes / 8 * 4] ^= 1;   /* little-endian: the low byte of element n/2 */
        corrupted = 1;
    }
}
void dfree(Dev *d) {
    while (d->n > 0) d->be->free(d->p[--d->n]);
}
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

static void forward_cases(void) {
    matmul_cases(0);
    norm_rope_cases();
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
