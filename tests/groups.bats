#!/usr/bin/env bats
# Role groups (tests/test_groups.c): one mpirun split into named groups of ranks, each with its own
# tp x pp x dp mesh over its own communicator, running its own model at the same time. Every group
# must write exactly the bytes (hex floats of logsumexp, logprobs, argmax) it writes when run alone;
# two models (two meshes) in one process must each equal that model alone. A bad input inside one
# group stops the whole job with one "tandem: [group] ..." line, a non-zero exit and no hang.
load helpers

TG="$ROOT/build/tests/test_groups"
M="$FIX/models"

# groups_run NP ARGS...: runs test_groups under mpirun (or alone for NP=1) with a hang guard; $output
# is each rank's own (helpers.bash run_ranks: one group's ok line cannot land inside another's error)
groups_run() {
    local np=$1; shift
    if [ "$np" -eq 1 ]; then run timeout -k 5 60 "$TG" "$@"
    else run_ranks "-k 5 60" "$np" "$TG" "$@"; fi
    echo "$output"
}

@test "groups: a (3 ranks, qwen2_swa at pp 3) and b (2 ranks, llama_gqa at tp 2, then mistral_swa at pp 2 in the same processes) at once == each alone" {
    local d="$BATS_TEST_TMPDIR"
    groups_run 5 "$d/both" "a:3:$M/qwen2_swa:1:3" "b:2:$M/llama_gqa:2:1+$M/mistral_swa:1:2"
    [ "$status" -eq 0 ]
    groups_run 3 "$d/alone" "a:3:$M/qwen2_swa:1:3"
    [ "$status" -eq 0 ]
    groups_run 2 "$d/alone" "b:2:$M/llama_gqa:2:1"
    [ "$status" -eq 0 ]
    groups_run 2 "$d/alone" "b:2:$M/mistral_swa:1:2"
    [ "$status" -eq 0 ]
    mv "$d/alone.b.0.txt" "$d/alone.b.1.txt"     # mistral alone was model 0 of its run
    groups_run 2 "$d/alone" "b:2:$M/llama_gqa:2:1"
    [ "$status" -eq 0 ]
    for f in a.0 b.0 b.1; do
        [ -s "$d/both.$f.txt" ]
        cmp "$d/both.$f.txt" "$d/alone.$f.txt"
    done
    # the two models of group b are different models: their outputs differ
    ! cmp -s "$d/both.b.0.txt" "$d/both.b.1.txt"
}

@test "groups: a 1-rank group beside a tp 2 group == a plain single-process run; both pick the same argmax tokens" {
    local d="$BATS_TEST_TMPDIR"
    groups_run 3 "$d/g" "a:1:$M/llama_gqa:1:1" "b:2:$M/llama_gqa:2:1"
    [ "$status" -eq 0 ]
    groups_run 1 "$d/one" "a:1:$M/llama_gqa:1:1"
    [ "$status" -eq 0 ]
    cmp "$d/g.a.0.txt" "$d/one.a.0.txt"
    # argmax ids (column 4) agree between the tp 2 group and the 1x1 group
    diff <(cut -d' ' -f4 "$d/g.a.0.txt") <(cut -d' ' -f4 "$d/g.b.0.txt")
}

@test "groups: a missing model directory in group b stops every rank with one [b] line" {
    groups_run 5 "$BATS_TEST_TMPDIR/x" "a:3:$M/qwen2_swa:1:3" "b:2:/nonexistent:1:1"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    [[ "$output" == *"tandem: [b] /nonexistent: model directory not found"* ]]
    [ ! -e "$BATS_TEST_TMPDIR/x.a.0.txt" ] || [ ! -e "$BATS_TEST_TMPDIR/x.b.0.txt" ]
}

@test "groups: an impossible layout inside group b is named with the group" {
    groups_run 5 "$BATS_TEST_TMPDIR/x" "a:3:$M/qwen2_swa:1:3" "b:2:$M/llama_gqa:3:1"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    [[ "$output" == *"tandem: [b] 2 ranks are not divisible by tp*pp = 3*1"* ]]
}

@test "groups: group sizes that do not add up to the job's ranks are one error" {
    groups_run 5 "$BATS_TEST_TMPDIR/x" "a:2:$M/qwen2_swa:1:1" "b:2:$M/llama_gqa:1:1"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    [[ "$output" == *"group ranks"* ]]
    [[ "$output" == *"5"* ]]
}
