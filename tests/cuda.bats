#!/usr/bin/env bats
# The CUDA backend: it builds wherever nvcc is (CI has nvcc but no GPU), and where a GPU is present its
# kernels match the CPU oracle (tests/cuda/cuda_vs_cpu.c). Without nvcc both tests skip; without a GPU
# the second one skips.
load helpers

CUDA_VS_CPU="$ROOT/build/tests/cuda_vs_cpu"

@test "cuda backend builds" {
    command -v nvcc >/dev/null || skip "nvcc not on PATH"
    run make -C "$ROOT" cuda
    echo "$output"
    [ "$status" -eq 0 ]
    [ -x "$CUDA_VS_CPU" ]
}

@test "cuda matmul and rmsnorm match cpu" {
    if command -v nvcc >/dev/null; then
        # up to date after the test above; builds it when this test runs alone
        run make -C "$ROOT" cuda
        [ "$status" -eq 0 ] || { echo "$output"; false; }
    fi
    [ -x "$CUDA_VS_CPU" ] || skip "nvcc not on PATH and $CUDA_VS_CPU not built"
    run "$CUDA_VS_CPU"
    echo "$output"
    [ "$status" -ne 77 ] || skip "no CUDA device (the backend was built; numerics need a GPU)"
    [ "$status" -eq 0 ]
}
