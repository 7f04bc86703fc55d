#!/usr/bin/env bats
# --sequence-parallel (issue 29 item 2, Megatron's): at tp > 1 the residual stream and the norms'
# outputs (x_in, x_mid, xb1, xb2 of every layer, the final x) keep 1/tp of the tokens per rank; a norm's
# output is all-gathered before the column-parallel matmuls, a row-parallel output reduce-scattered
# with the tp sum's own tree (comm_reduce_scatter_rows_fixed), and the backward gathers the kept rows
# where it needs all of them. So every value is the one the run without it computes: losses, gradient
# norms and saved weights bit for bit, for sft, rm, dpo and ppo, fp32 and bf16, with recompute, at
# tp 2, tp 2 x pp 2 and tp 4; and the activation arena is smaller.
load helpers

setup_file() { make_rev_data "$BATS_FILE_TMPDIR"; }

# sp_same NP ARGS...: `tandem sft ARGS` on NP ranks without and with --sequence-parallel: the same metrics and
# weights; prints both activation lines
sp_same() {
    local np=$1; shift
    rm -rf "$BATS_TEST_TMPDIR/off" "$BATS_TEST_TMPDIR/on"
    run timeout 200 $MPIRUN "$np" "$TANDEM" "$@" --out "$BATS_TEST_TMPDIR/off"
    [ "$status" -eq 0 ]
    off=$(grep -m1 '^train activations' <<<"$output")
    run timeout 200 $MPIRUN "$np" "$TANDEM" "$@" --sequence-parallel --out "$BATS_TEST_TMPDIR/on"
    [ "$status" -eq 0 ]
    on=$(grep -m1 '^train activations' <<<"$output")
    echo "$*: $off | $on"
    [[ "$on" == *"sequence parallel"* ]]
    diff <(numbers "$BATS_TEST_TMPDIR/off/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/on/metrics.jsonl")
    [ "$(wc -l < "$BATS_TEST_TMPDIR/on/metrics.jsonl")" -ge 3 ]
    ck=$(ls -d "$BATS_TEST_TMPDIR"/off/checkpoint-* | tail -1)
    cmp <(cat "$ck"/*.safetensors) <(cat "$BATS_TEST_TMPDIR/on/$(basename "$ck")"/*.safetensors)
    # the arena's MiB, without and with: smaller with (the residual's rows are a share)
    awk -v a="$(sed 's/.*activations: \([0-9.]*\) MiB.*/\1/' <<<"$off")" -v b="$(sed 's/.*activations: \([0-9.]*\) MiB.*/\1/' <<<"$on")" \
        'BEGIN { exit !(b + 0 < a + 0) }'
}

@test "sft --sequence-parallel: the run without it bit for bit (tp 2, tp 2 x pp 2, tp 4, bf16, recompute); less activation memory" {
    need_assets
    A=(sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --seq-len 32 --batch-size 8 --micro-batches 2
       --max-steps 3 --lr 3e-3 --save-every 3)
    sp_same 2 "${A[@]}" --tp 2
    sp_same 4 "${A[@]}" --tp 4 --dtype bf16
    sp_same 4 "${A[@]}" --tp 2 --recompute full
}

@test "sft --sequence-parallel with pp 2: the same bits (stages pass their rows of the residual)" {
    need_assets
    # the first stage's activation line is the one compared: it has layers on both sides of the split
    A=(sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --seq-len 32 --batch-size 8 --micro-batches 2
       --max-steps 3 --lr 3e-3 --save-every 3 --tp 2 --pp 2)
    sp_same 4 "${A[@]}"
}

@test "rm and dpo --sequence-parallel at tp 2: the same bits (score head; chosen / rejected pairs)" {
    need_assets
    for cmd in rm dpo; do
        sp_same 2 "$cmd" --model "$STORIES" --data "$PF/story_train.jsonl" --seq-len 64 --batch-size 8 --max-steps 3 --lr 3e-3 \
            --save-every 3 --tp 2
    done
}

@test "ppo --sequence-parallel: actor and critic at tp 2 give the same metrics and weights; rollout == training logprobs" {
    need_story
    "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/rm" --seq-len 64 --batch-size 8 \
        --lr 3e-3 --max-steps 4 2>/dev/null
    RM="$BATS_TEST_TMPDIR/rm/checkpoint-4"
    A=(--actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4
       --max-new-tokens 16 --steps 2 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --temperature 0.8 --actor-tp 2
       --critic-tp 2 --colocate all)
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/off"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --sequence-parallel --out "$BATS_TEST_TMPDIR/on"
    [ "$status" -eq 0 ]
    diff <(numbers "$BATS_TEST_TMPDIR/off/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/on/metrics.jsonl")
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/on/metrics.jsonl" -c)" = "[0]" ]
    for r in actor critic; do
        cmp <(cat "$BATS_TEST_TMPDIR"/off/checkpoint-2/$r/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/on/checkpoint-2/$r/*.safetensors)
    done
}

@test "--sequence-parallel without tp > 1 is one line (sft, ppo, bench)" {
    need_assets
    run "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --sequence-parallel
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --sequence-parallel: needs --tp > 1 (it shares the tp ranks' rows)" ]
    run "$TANDEM" ppo --actor "$STORIES" --reward-cmd true --advantage grpo --n-samples-per-prompt 2 --prompts "$TRAIN" --out "$BATS_TEST_TMPDIR/y" --sequence-parallel
    [ "$status" -ne 0 ]
    [ "$output" = "tandem: --sequence-parallel: needs --actor-tp or --critic-tp > 1 (it shares a trained role's tp ranks' rows)" ]
    run "$TANDEM" bench --model "$STORIES" --train --sequence-parallel
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --sequence-parallel: needs --tp > 1 (it shares the tp ranks' rows)" ]
}
