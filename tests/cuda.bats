#!/usr/bin/env bats
# The CUDA backend against the CPU oracle (tests/cuda/cuda_vs_cpu.c, built by `make build` in every
# build: without nvcc it has no CUDA table and says SKIP). The harness is proven on the CPU table
# itself (--self, no GPU needed: every entry run, every input through alloc/to_device/to_host, 0
# difference), including that it fails when one result loses one bit (--corrupt). With nvcc the
# build must link the CUDA table; where a GPU is present every entry must match the oracle.
load helpers

CUDA_VS_CPU="$ROOT/build/tests/cuda_vs_cpu"
need_harness() {
    [ -x "$CUDA_VS_CPU" ] || { echo "$CUDA_VS_CPU missing: make build builds it"; return 1; }
}

@test "cuda backend builds" {
    command -v nvcc >/dev/null || skip "nvcc not on PATH"
    run make -C "$ROOT" build
    echo "$output"
    [ "$status" -eq 0 ]
    [ -x "$CUDA_VS_CPU" ]
    # the CUDA table is linked in (defined, not the weak undefined reference of a CPU-only build)
    nm "$CUDA_VS_CPU" | grep -qE ' [RrDd] cuda_backend$'
}

@test "oracle harness runs every entry on the CPU table (--self)" {
    need_harness
    run "$CUDA_VS_CPU" --self
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '^FAIL' <<<"$output")" -eq 0 ]
    grep -q "^coverage: all 36 entries compared" <<<"$output"
    grep -q '^guard: [0-9]* dut allocations, every entry pointer in dut memory: yes$' <<<"$output"
    grep -q '^PASS: [0-9]* cases, dut cpu-guarded is exactly ref cpu$' <<<"$output"
    # every entry has an ok line, each with max_abs 0
    for e in matmul matmuls rmsnorm round_to pack unpack rope_table rope kv_store attention swiglu add_to copy \
        gather_rows embedding mask_cols argmax_rows row_max row_sumexp pick_logits log_add row_entropy_part sub_at \
        matmul_backward rmsnorm_backward rope_backward attention_backward swiglu_backward embedding_backward \
        logprob_backward kv_store_batch attention_batch scale dropout memory; do
        grep -qE "^ok +$e(\.[a-z_]+)? " <<<"$output" || { echo "no case for $e"; false; }
    done
    [ "$(grep '^ok ' <<<"$output" | awk '$5 != "0.000e+00"' | wc -l)" -eq 0 ]
    # and the dut's own invariances ran
    for c in matmul_rows matmuls_eq_matmul attention_paged attention_chunk attention_decode bf16_eq_fp32; do
        grep -q "^ok   inv\.$c " <<<"$output" || { echo "no invariance check $c"; false; }
    done
}

@test "harness catches a corrupted entry (--self --corrupt exits 1)" {
    need_harness
    run "$CUDA_VS_CPU" --self --corrupt
    echo "$output"
    [ "$status" -eq 1 ]
    # exactly the one corrupted case fails (its lowest bit), and the summary says so
    [ "$(grep -c '^FAIL ' <<<"$output")" -eq 1 ]
    grep -qE '^FAIL +attention ' <<<"$output"
    grep -q '^FAIL: 1 of [0-9]* cases failed$' <<<"$output"
}

@test "cuda backend matches the cpu oracle" {
    need_harness
    run "$CUDA_VS_CPU"
    echo "$output"
    [ "$status" -ne 77 ] || skip "$(grep -m1 '^SKIP: ' <<<"$output")"
    [ "$status" -eq 0 ]
    grep -q "^coverage: all 36 entries compared" <<<"$output"
}

@test "the GPU check script runs its checks on the CPU too (tests/cuda/gpu_check.py --device cpu): it stays runnable" {
    # the script a GPU call runs (parity, bf16 sigma, greedy vs HF, batch invariance, rollout == eval)
    # is plain python over bin/tandem; on the CPU every check must pass as it does on the GPU
    need_assets
    run python3 "$ROOT/tests/cuda/gpu_check.py" --device cpu --assets "$ASSETS" --out "$BATS_TEST_TMPDIR"
    echo "$output" | grep -v '^PASS' | cut -c1-300
    [ "$status" -eq 0 ]
    tail -1 <<<"$output" | jq -e '.passed >= 46 and .failed == 0'
    jq -e '.results | length >= 46 and all(.pass)' "$BATS_TEST_TMPDIR/gpu_check.json"
}
