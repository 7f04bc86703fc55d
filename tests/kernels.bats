#!/usr/bin/env bats
# The CPU kernels' batch-invariance contract (tests/test_kernels.c): the same bits for a row at any
# batch size, offset and thread count. This is what lets generation and training agree exactly.
load helpers

@test "cpu_matmul and cpu_attention are batch-, thread- and layout-invariant, bit for bit; silu within 4 roundings; argmax is the first maximum" {
    run "$ROOT/build/tests/test_kernels"
    echo "$output"
    [ "$status" -eq 0 ]
    # 8 matmul shapes (2048: cache-blocked runs), then 6 head sizes x 2 windows of attention (threads; paged layout)
    [ "$(grep -c '^cpu_matmul.*: bit-identical' <<<"$output")" -eq 8 ]
    grep -q '^tp invariance: .*tp ranks. tree == 1x1, bit for bit$' <<<"$output"
    [ "$(grep -c 'threads bit-identical; paged prefill and decode bit-identical' <<<"$output")" -eq 12 ]
    # silu's vectorised exp against exact silu, 4 fp32 roundings at most
    grep -q '^cpu_swiglu (exp16): 1000003 points, .*: within$' <<<"$output"
    # the one-pass vectorised argmax against a plain scan, ties, NaN and -inf included
    grep -q "^cpu_argmax: 54 rows (ties, NaN, -inf): the plain scan's index$" <<<"$output"
}

@test "backend_check refuses a table with a NULL entry, naming it; cpu-guarded's counting mode counts and goes on; backend_fatal is one line, exit 1" {
    run "$ROOT/build/tests/test_backend"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '^FAIL' <<<"$output")" -eq 0 ]
    grep -q '^ok   internal error: backend cpu: entry rope_backward is NULL in its table$' <<<"$output"
    grep -q '^ok   cpu-guarded$' <<<"$output"
    grep -q '^ok   counting: a host x is one fault, the call runs$' <<<"$output"
    # the counted misuses still print their lines (stderr)
    [ "$(grep -c "^tandem: internal error: --device cpu-guarded: " <<<"$output")" -eq 3 ]
    [ "${lines[-1]}" = ok ]
    run "$ROOT/build/tests/test_backend" fatal
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: internal error: test" ]
}
