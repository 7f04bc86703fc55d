#!/usr/bin/env bats
# Backward kernels for training (kernels/cpu/backward.c, kernels/backward.h), two oracles each:
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

@test "backward matmul: matches torch autograd (dx = dout w, dw += dout^T x, db += column sums (OpenBLAS))" {
    run "$TB" matmul torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: matmul forward and backward match torch"* ]]
}

@test "backward matmul: matches finite differences of the forward kernel" {
    run "$TB" matmul fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: matmul backward matches finite differences of the forward"* ]]
}

@test "backward rmsnorm: matches torch autograd (dx = r (g - xh mean(g xh)), dw += dout xh, HF order, a row where eps matters)" {
    run "$TB" rmsnorm torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: rmsnorm forward and backward match torch"* ]]
}

@test "backward rmsnorm: matches finite differences of the forward kernel" {
    run "$TB" rmsnorm fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: rmsnorm backward matches finite differences of the forward"* ]]
}

@test "backward rope: matches torch autograd (inverse rotation of rotate_half pairs (i, i + Dh/2))" {
    run "$TB" rope torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: rope forward and backward match torch"* ]]
}

@test "backward rope: matches finite differences of the forward kernel" {
    run "$TB" rope fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: rope backward matches finite differences of the forward"* ]]
}

@test "backward attention: matches torch autograd (dq, dk, dv with GQA, causal and sliding window)" {
    run "$TB" attention torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: attention forward and backward match torch"* ]]
}

@test "backward attention: matches finite differences of the forward kernel" {
    run "$TB" attention fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: attention backward matches finite differences of the forward"* ]]
}

@test "backward swiglu: matches torch autograd (dgate, dup of silu(gate) * up)" {
    run "$TB" swiglu torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: swiglu forward and backward match torch"* ]]
}

@test "backward swiglu: matches finite differences of the forward kernel" {
    run "$TB" swiglu fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: swiglu backward matches finite differences of the forward"* ]]
}

@test "backward embedding: matches torch autograd (vocab-parallel dtable += over 3 shards, repeated ids)" {
    run "$TB" embedding torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: embedding forward and backward match torch"* ]]
}

@test "backward embedding: matches finite differences of the forward kernel" {
    run "$TB" embedding fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: embedding backward matches finite differences of the forward"* ]]
}

@test "backward xent: matches torch autograd (vocab-parallel cross-entropy over 3 shards: lse protocol, loss and dlogits)" {
    run "$TB" xent torch "$CASES"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: xent forward and backward match torch"* ]]
}

@test "backward xent: matches finite differences of the forward kernel" {
    run "$TB" xent fd
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: xent backward matches finite differences of the forward"* ]]
}

@test "backward: fixture generator is present and the fixtures are small" {
    [ -f "$FIX/backward/make_backward_fixtures.py" ]
    [ "$(stat -c %s "$CASES")" -lt 300000 ]
}
