#!/usr/bin/env bats
# Backward kernels for training (kernels/cpu/backward.c, kernels/cpu/backward.h), two oracles each:
#   torch: PyTorch autograd of HF-style forward ops (fixtures written by
#          tests/fixtures/backward/make_backward_fixtures.py), fp32 within 1e-5 relative; the
#          forward kernel is checked against torch's output on the same inputs too
#   fd:    central finite differences of OUR forward kernels (kernels/cpu/ops.c), within 1e-2
#          relative: the backward is the gradient of exactly the forward we ship
# Both also check the buffer contract: activation gradients written, parameter gradients accumulated.
# Tolerances are explained in tests/test_backward.c.
load helpers

TB="$ROOT/build/tests/test_backward"
CASES="$FIX/backward/cases.json"

# vs_torch KERNEL / vs_fd KERNEL: test_backward's check of one kernel against torch autograd (the
# fixture) or against finite differences of our own forward kernel; it prints one ok line.
vs_torch() {
    run "$TB" "$1" torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: $1 forward and backward match torch"* ]]
}
vs_fd() {
    run "$TB" "$1" fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: $1 backward matches finite differences of the forward"* ]]
}

@test "backward matmul: matches torch autograd (dx = dout w, dw += dout^T x, db += column sums (OpenBLAS))" {
    vs_torch matmul
}

@test "backward matmul: matches finite differences of the forward kernel" {
    vs_fd matmul
}

@test "backward rmsnorm: matches torch autograd (dx = r (g - xh mean(g xh)), dw += dout xh, HF order, a row where eps matters)" {
    vs_torch rmsnorm
}

@test "backward rmsnorm: matches finite differences of the forward kernel" {
    vs_fd rmsnorm
}

@test "backward rope: matches torch autograd (inverse rotation of rotate_half pairs (i, i + Dh/2))" {
    vs_torch rope
}

@test "backward rope: matches finite differences of the forward kernel" {
    vs_fd rope
}

@test "backward attention: matches torch autograd (dq, dk, dv with GQA, causal and sliding window)" {
    vs_torch attention
}

@test "backward attention: matches finite differences of the forward kernel" {
    vs_fd attention
}

@test "backward swiglu: matches torch autograd (dgate, dup of silu(gate) * up)" {
    vs_torch swiglu
}

@test "backward swiglu: matches finite differences of the forward kernel" {
    vs_fd swiglu
}

@test "backward embedding: matches torch autograd (vocab-parallel dtable += over 3 shards, repeated ids)" {
    vs_torch embedding
}

@test "backward embedding: matches finite differences of the forward kernel" {
    vs_fd embedding
}

@test "backward xent: matches torch autograd (vocab-parallel cross-entropy over 3 shards: lse protocol, loss and dlogits)" {
    vs_torch xent
}

@test "backward xent: matches finite differences of the forward kernel" {
    vs_fd xent
}

@test "backward: fixture generator is present and the fixtures are small" {
    [ -f "$FIX/backward/make_backward_fixtures.py" ]
    [ "$(stat -c %s "$CASES")" -lt 300000 ]
}
