#!/usr/bin/env bats
# The optimizer (train/optim.c). Against torch (fixture by tests/fixtures/optim/make_optim_fixtures.py):
# the lr schedules vs HF's LambdaLR, and AdamW + clip_grad_norm_ + warmup/cosine over five steps:
# bit-identical params when the clip factor comes from torch's norm, within 16 ulp end to end (our
# norm is summed in double; see tests/test_optim.c). On a real model's arena (llama_gqa & co): every
# layout -- dp plain / ZeRO-1, tp, pp and mixes, 1 to 4 ranks -- must print the same grad norms and the
# same layout-invariant param checksum as 1x1 after 4 steps, bit for bit (the test gradients are exact
# in fp32, so only a wrong count can differ: see tests/test_optim.c), with dp replicas and
# tp-replicated norms identical on every rank. The layout-free state (train/optim_state.c) saved at
# one layout and loaded at another continues that run bit for bit. The per-rank format of earlier
# builds (optim_save / optim_load, still read at its own layout) resumes bit-identically; a bad
# state file is one clear message.
load helpers

TO="$ROOT/build/tests/test_optim"
M="$FIX/models"

# the norm and checksum lines of a run
summary() { grep -E '^(norm|checksum)' <<<"$1"; }

# same_as_1x1 MODEL NP TP PP ZERO: the run on NP ranks prints what the 1x1 plain run prints
same_as_1x1() {
    local model=$1 np=$2 tp=$3 pp=$4 zero=$5
    run timeout 60 "$TO" mesh "$M/$model" 1 1 0 4
    [ "$status" -eq 0 ]
    local ref
    ref=$(summary "$output")
    [ "$(grep -c '^norm' <<<"$ref")" -eq 4 ]
    run_ranks 120 "$np" "$TO" mesh "$M/$model" "$tp" "$pp" "$zero" 4
    echo "$model np=$np tp=$tp pp=$pp zero=$zero:"
    echo "$output" | grep -v '^[|+]'
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: optim mesh' <<<"$output")" -eq "$np" ]
    diff <(echo "$ref") <(summary "$output")
}

@test "optim: a backend's adamw, sum_squares and bf16 pack equal the CPU kernels bit for bit (cpu-guarded; cuda where a GPU is)" {
    run "$TO" backend cpu-guarded
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q 'ok: optim backend cpu-guarded' <<<"$output"
    nvidia-smi -L >/dev/null 2>&1 || return 0
    run "$TO" backend cuda
    echo "$output"
    [ "$status" -eq 0 ]
}

@test "optim vs torch: lr schedules match HF; AdamW bit-identical given torch's clip factor, <= 16 ulp end to end" {
    run "$TO" torch "$FIX/optim/adamw.json"
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q '1025 of 1025 param values bit-identical to torch' <<<"$output"
    grep -q 'ok: optim torch' <<<"$output"
}

@test "optim 1 rank: ZeRO-1 with dp=1 equals plain; every param moves; norms clip on steps 0 and 2" {
    same_as_1x1 llama_gqa 1 1 1 1
    grep -q '(26784 of 26784 params changed)' <<<"$output"
    grep -q '^norm 0 .*clip x0\.' <<<"$output"
    grep -q '^norm 1 .*clip x1)' <<<"$output"
    grep -q '^norm 2 .*clip x0\.' <<<"$output"
}

@test "optim dp=2: plain all-reduce and ZeRO-1 (reduce-scatter, 1/dp moments, all-gather) both equal dp=1 bit for bit" {
    same_as_1x1 llama_gqa 2 1 1 0
    same_as_1x1 llama_gqa 2 1 1 1
}

@test "optim dp=4: plain and ZeRO-1 equal dp=1 (ZeRO slices cut tensors mid-way; padded arena)" {
    same_as_1x1 llama_gqa 4 1 1 0
    same_as_1x1 llama_gqa 4 1 1 1
}

@test "optim tp=2, tp=4, pp=2: the same grad norm as tp=1 (replicated norms and kv heads counted once)" {
    same_as_1x1 llama_gqa 2 2 1 0
    same_as_1x1 llama_gqa 2 1 2 0
    same_as_1x1 llama_gqa 4 4 1 0
}

@test "optim tp x dp x pp mixes with ZeRO-1: tp2 dp2, pp2 dp2, tp2 pp2" {
    same_as_1x1 llama_gqa 4 2 1 1
    same_as_1x1 llama_gqa 4 1 2 1
    same_as_1x1 llama_gqa 4 2 2 1
}

@test "optim llama_mqa tp=2, tp=4: one kv head replicated on every tp rank counts once" {
    same_as_1x1 llama_mqa 2 2 1 1
    same_as_1x1 llama_mqa 4 4 1 0
}

@test "optim qwen2_bias pp=2: the tied embedding's copy on the last stage counts once, and stays equal" {
    same_as_1x1 qwen2_bias 2 1 2 1
    same_as_1x1 qwen2_bias 4 2 2 0
}

@test "optim llama_odd_vocab tp=2, tp=4: padded vocab rows (97 -> 98, 100) change nothing" {
    same_as_1x1 llama_odd_vocab 2 2 1 1
    same_as_1x1 llama_odd_vocab 4 4 1 0
}

@test "optim save/load: 2 steps + save + load + 2 steps == 4 steps, bit for bit (1 rank plain; 4 ranks tp2 dp2 ZeRO-1)" {
    d="$BATS_TEST_TMPDIR/resume1"; mkdir -p "$d"
    run timeout 60 "$TO" resume "$M/llama_gqa" 1 1 0 "$d"
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q 'ok: optim resume rank 0' <<<"$output"
    [ "$(stat -c %s "$d/optim.rank0.bin")" -eq $((64 + 2 * 4 * 26784)) ]
    [ -z "$(ls "$d" | grep tmp)" ]   # the atomic write left no temp file
    d="$BATS_TEST_TMPDIR/resume4"; mkdir -p "$d"
    run_ranks 120 4 "$TO" resume "$M/llama_gqa" 2 1 1 "$d"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: optim resume' <<<"$output")" -eq 4 ]
}

# reshard MODEL "NP TP PP ZERO" "NP TP PP ZERO": 2 steps at the first layout, its weights and layout-free
# optimizer state saved, loaded at the second, 2 more steps: the norms of steps 2 and 3 and the
# checksum equal 4 steps at 1x1 bit for bit (a lost, misplaced or wrong-replica moment would not)
reshard() {
    local model=$1 ref out d="$BATS_TEST_TMPDIR/rs"
    ref=$("$TO" mesh "$M/$model" 1 1 0 4 | grep -E '^(norm [23] |checksum)')
    set -- $2 $3
    rm -rf "$d"
    run timeout 120 $MPIRUN "$1" "$TO" reshard "$M/$model" "$2" "$3" "$4" "$d" save
    [ "$status" -eq 0 ]
    [ -e "$d/optimizer/optimizer.json" ]
    run_ranks 120 "$5" "$TO" reshard "$M/$model" "$6" "$7" "$8" "$d" load
    echo "$model np=$1 tp=$2 pp=$3 zero=$4 -> np=$5 tp=$6 pp=$7 zero=$8:"
    echo "$output" | grep -v '^[|+]'
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: optim reshard load' <<<"$output")" -eq "$5" ]
    diff <(echo "$ref") <(grep -E '^(norm [23] |checksum)' <<<"$output")
}

@test "optim layout-free state: saved at one tp x pp x dp x zero, resumed at another, continues 1x1's run bit for bit (replicated kv heads, tied embedding across stages, padded vocab, ZeRO slices)" {
    reshard llama_gqa "4 2 2 0" "2 1 1 1"
    reshard llama_gqa "2 1 1 1" "4 2 1 1"
    reshard llama_mqa "1 1 1 0" "4 4 1 0"
    reshard llama_mqa "4 4 1 1" "1 1 1 0"
    reshard qwen2_bias "4 1 2 1" "1 1 1 0"
    reshard qwen2_bias "1 1 1 0" "4 2 2 0"
    reshard llama_odd_vocab "2 2 1 1" "4 4 1 0"
    reshard llama_odd_vocab "4 4 1 0" "4 1 1 1"
}

@test "optim load errors: wrong magic, version, layout, model, truncated file each say what is wrong; missing file is rc -1" {
    d="$BATS_TEST_TMPDIR/err"; mkdir -p "$d"
    run timeout 60 "$TO" resume "$M/llama_gqa" 1 1 0 "$d"
    [ "$status" -eq 0 ]
    good="$d/optim.rank0.bin"

    run "$TO" load "$M/llama_gqa" 1 1 0 "$good"
    [ "$status" -eq 0 ]
    grep -q 'ok: optim load rank 0: step 2' <<<"$output"

    cp "$good" "$d/magic.bin"; printf 'GARBAGE!' | dd of="$d/magic.bin" conv=notrunc 2>/dev/null
    run "$TO" load "$M/llama_gqa" 1 1 0 "$d/magic.bin"
    echo "$output"
    [ "$status" -ne 0 ]
    grep -q 'magic.bin: not a Tandem optimizer state file' <<<"$output"

    cp "$good" "$d/version.bin"; printf '\x03' | dd of="$d/version.bin" bs=1 seek=8 conv=notrunc 2>/dev/null
    run "$TO" load "$M/llama_gqa" 1 1 0 "$d/version.bin"
    echo "$output"
    [ "$status" -ne 0 ]
    grep -q 'format version 3; this build reads version 2' <<<"$output"

    run "$TO" load "$M/llama_gqa" 1 1 1 "$good"
    echo "$output"
    [ "$status" -ne 0 ]
    grep -q 'saved by a tp=1 pp=1 dp=1 zero=0 run .* this is tp=1 pp=1 dp=1 zero=1 .*resume with the same' <<<"$output"

    run "$TO" load "$M/llama_mqa" 1 1 0 "$good"
    echo "$output"
    [ "$status" -ne 0 ]
    grep -q 'saved for another model' <<<"$output"

    head -c 1000 "$good" > "$d/trunc.bin"
    run "$TO" load "$M/llama_gqa" 1 1 0 "$d/trunc.bin"
    echo "$output"
    [ "$status" -ne 0 ]
    grep -q 'trunc.bin: 1000 bytes, expected 214336' <<<"$output"

    head -c 10 "$good" > "$d/short.bin"
    run "$TO" load "$M/llama_gqa" 1 1 0 "$d/short.bin"
    [ "$status" -ne 0 ]
    grep -q 'shorter than the 64-byte optimizer state header' <<<"$output"

    run "$TO" load "$M/llama_gqa" 1 1 0 "$d/absent.bin"
    [ "$status" -eq 2 ]
    grep -q 'cannot open' <<<"$output"
}

@test "optim: fixture generator is present and the fixture is small (< 100 KB)" {
    [ -f "$FIX/optim/make_optim_fixtures.py" ]
    [ "$(wc -c < "$FIX/optim/adamw.json")" -lt 100000 ]
}
