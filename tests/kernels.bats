#!/usr/bin/env bats
# The CPU kernels' batch-invariance contract (tests/test_kernels.c): the same bits for a row at any
# batch size, offset and thread count. This is what lets generation and training agree exactly.
load helpers

@test "cpu_matmul and cpu_attention are batch- and thread-invariant, bit for bit" {
    run "$ROOT/build/tests/test_kernels"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c 'bit-identical' <<<"$output")" -eq 9 ]
}
