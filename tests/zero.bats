#!/usr/bin/env bats
# --zero 2 and --zero 3 (issue 29 item 1; train/optim.h, runtime/model.h): ZeRO-2 (DeepSpeed's stage
# 2) partitions the gradients over the dp ranks too: each layer's gradient is reduce-scattered right
# after its backward from one buffer all layers share, the embedding and head keep whole buffers for
# the step. ZeRO-3 (FSDP's full sharding, each decoder layer a unit, every other tensor one) also
# keeps only 1/dp of every weight: a layer all-gathered before its forward and again before its
# backward (the next layer's gather started ahead), the embedding for the lookup, the head from its
# forward to its backward, and everything whole for eval, saving and the PPO rollout. Every dp sum adds
# the ranks by one fixed pairwise tree (comm_reduce_scatter_sum_fixed), so with one micro-batch per
# dp rank a step, plain dp, ZeRO-1, ZeRO-2 and ZeRO-3 give the same bits: losses, eval losses,
# gradient norms, saved weights and optimizer state (dp 4; tp 2 x dp 2; pp 2 x dp 2 with the tied
# embedding summed across stages; bf16; rm, dpo, ppo's actor and critic), with less gradient
# (ZeRO-2/3) and weight (ZeRO-3) memory per rank.
# With M > 1 micro-batches ZeRO-2/3 sum each micro-batch over dp before adding the micro-batches,
# plain dp the other way round: the same fp32 terms in another order, so that comparison is
# resume_layout.bats' 1e-5 relative on the losses (its header derives it), not bits.
# Model: stories260K (a step is ms); 2 to 4 ranks.
load helpers

setup_file() {
    awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
         printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, s } }' > "$BATS_FILE_TMPDIR/digits.jsonl"
}

# same_files A B: every safetensors file (weights and optimizer state) under A equals B's, byte for byte
same_files() {
    local f n=0
    diff <(cd "$1" && find . -name '*.safetensors' | sort) <(cd "$2" && find . -name '*.safetensors' | sort)
    for f in $(cd "$1" && find . -name '*.safetensors' | sort); do cmp "$1/$f" "$2/$f"; n=$((n + 1)); done
    echo "$1 = $2: $n files"
    [ "$n" -ge 3 ]
}
# column $2 (weights 1, grads 3) of rank 0's row of the memory plan in the output $1, in MiB
plan_mib() { awk -v c="$2" '/^memory plan/ { h = 1; next } h && /rank 0 / { print $(6 + c); exit }' <<<"$1"; }
# zero_same NP ARGS...: `tandem ARGS` on NP ranks with --zero 0, 2 and 3 (and ZERO1=1: --zero 1): the
# same metrics and checkpoints; ZeRO-2's gradients take less memory, and ZeRO-3's weights with
# W3=1. ZeRO-3 holds 1/dp of every weight plus two gathered layers and the embedding or the head
# whole while in use, where plain holds everything: less only where the layers are many enough
# (stories260K's 5 layers at dp 4 or tp 2 x dp 2, not the 3 of a pp 2 stage at dp 2)
zero_same() {
    local np=$1 t="$BATS_TEST_TMPDIR" z; shift
    rm -rf "$t"/z*
    for z in 0 2 3 ${ZERO1:+1}; do
        run timeout 200 $MPIRUN "$np" "$TANDEM" "$@" --zero $z --out "$t/z$z"
        [ "$status" -eq 0 ] || { echo "$output"; false; }
        eval "w$z=$(plan_mib "$output" 1) g$z=$(plan_mib "$output" 3)"
    done
    echo "$*: rank 0 MiB: grads plain $g0, ZeRO-2 $g2; weights plain $w0, ZeRO-3 $w3"
    awk -v a="$g0" -v b="$g2" -v c="$w0" -v d="$w3" -v w="${W3:-0}" 'BEGIN { exit !(b + 0 < a + 0 && (!w || d + 0 < c + 0)) }'
    for z in 2 3 ${ZERO1:+1}; do
        diff <(numbers "$t/z0/metrics.jsonl") <(numbers "$t/z$z/metrics.jsonl")
        same_files "$t/z0" "$t/z$z"
    done
    [ "$(numbers "$t/z0/metrics.jsonl" | wc -l)" -ge 3 ]
}

@test "sft --zero 2 and 3: plain dp's bits and ZeRO-1's (dp 4, with eval), with tp 2 x dp 2, pp 2 x dp 2 (tied embedding across stages), bf16; less memory" {
    need_story
    head -24 "$BATS_FILE_TMPDIR/digits.jsonl" > "$BATS_TEST_TMPDIR/val.jsonl"
    A=(sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/digits.jsonl" --seq-len 32 --batch-size 8 --lr 3e-3 --warmup 2
       --threads 1 --max-steps 3 --save-every 3)
    ZERO1=1 W3=1 zero_same 4 "${A[@]}" --eval-data "$BATS_TEST_TMPDIR/val.jsonl" --eval-every 2
    [ "$(jq -s 'map(select(.eval_loss)) | length' "$BATS_TEST_TMPDIR/z3/metrics.jsonl")" -ge 2 ]
    W3=1 zero_same 4 "${A[@]}" --tp 2
    zero_same 4 "${A[@]}" --pp 2
    zero_same 2 "${A[@]}" --dtype bf16
}

@test "sft --zero 2 and 3 with 2 micro-batches per dp rank: each micro-batch summed over dp first, the same bits as each other, within 1e-5 of plain dp" {
    need_story
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/digits.jsonl" --seq-len 32 --batch-size 8 --lr 3e-3 --warmup 2
       --threads 1 --max-steps 6 --micro-batches 2)
    for z in 0 2 3; do
        run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --zero $z --out "$t/m$z"
        [ "$status" -eq 0 ]
    done
    diff <(numbers "$t/m2/metrics.jsonl") <(numbers "$t/m3/metrics.jsonl")
    within 1e-5 <(losses "$t/m0") <(losses "$t/m2")
    [ "$(losses "$t/m2" | wc -l)" -eq 6 ]
    # the order did change something: the gradient norms are not all equal bit for bit
    ! diff <(jq .grad_norm "$t/m0/metrics.jsonl") <(jq .grad_norm "$t/m2/metrics.jsonl") >/dev/null
}

@test "rm and dpo --zero 2 and 3 at dp 2: plain dp's bits" {
    need_story
    for c in rm dpo; do
        zero_same 2 $c --model "$STORIES" --data "$PF/story_train.jsonl" --seq-len 64 --batch-size 4 --max-steps 3 --lr 3e-3 \
            --save-every 3 --threads 1
    done
}

@test "ppo --zero 2 and 3: the actor and the critic at dp 2 give plain dp's bits; the rollout logprobs still equal training's" {
    need_story
    t="$BATS_TEST_TMPDIR"
    "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$t/rm" --seq-len 64 --batch-size 8 --lr 3e-3 \
        --max-steps 4 --threads 1 2>/dev/null
    RM="$t/rm/checkpoint-4"
    for z in 0 2 3; do
        run timeout 200 $MPIRUN 4 "$TANDEM" ppo --actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$TRAIN" \
            --n-samples-per-prompt 2 --rollout-batch-size 4 --max-new-tokens 12 --steps 2 --kl-coef 0.01 --actor-lr 3e-4 \
            --critic-lr 1e-3 --threads 1 --actor-ranks 2 --critic-ranks 2 --colocate actor,ref:critic,reward --zero $z \
            --out "$t/p$z"
        [ "$status" -eq 0 ] || { echo "$output"; false; }
    done
    for z in 2 3; do
        diff <(numbers "$t/p0/metrics.jsonl") <(numbers "$t/p$z/metrics.jsonl")
        same_files "$t/p0/checkpoint-2" "$t/p$z/checkpoint-2"
        [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$t/p$z/metrics.jsonl" -c)" = "[0]" ]
    done
}

@test "resume: dp 2 ZeRO-3 -> 1x1 plain -> dp 2 ZeRO-2 follows the uninterrupted run within 1e-5; ZeRO-2 to dp 4 ZeRO-3 and back with no step is byte for byte" {
    need_story
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/digits.jsonl" --seq-len 32 --batch-size 8 --lr 3e-3 --warmup 2
       --threads 1 --max-steps 6 --save-every 2)
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --zero 2 --out "$t/straight"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --zero 3 --out "$t/c" --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 200 "$TANDEM" "${A[@]}" --micro-batches 2 --out "$t/c" --resume "$t/c/checkpoint-2" --stop-after 4
    [ "$status" -eq 0 ]
    [[ "$output" == *"saved with tp=1 pp=1 dp=2 zero=3, now tp=1 pp=1 dp=1 zero=0"* ]]
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --zero 2 --out "$t/c" --resume "$t/c/checkpoint-4"
    [ "$status" -eq 0 ]
    within 1e-5 <(losses "$t/straight") <(losses "$t/c")
    [ "$(losses "$t/c" | wc -l)" -eq 6 ]
    # checkpoint-2 (dp 2 ZeRO-2) to dp 4 ZeRO-3 and back to dp 2 ZeRO-2, no step between: the same files
    run timeout 200 $MPIRUN 4 "$TANDEM" "${A[@]}" --zero 3 --max-steps 2 --out "$t/b4" --resume "$t/straight/checkpoint-2"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --zero 2 --max-steps 2 --out "$t/b2" --resume "$t/b4/checkpoint-2"
    [ "$status" -eq 0 ]
    same_files "$t/straight/checkpoint-2" "$t/b2/checkpoint-2"
}

@test "bench --train --plan at dp 4: ZeRO-1 holds 1/4 of the moments, ZeRO-2 also less gradient, ZeRO-3 also less weight (the plan of the run's own allocations)" {
    need_story
    for z in 0 1 2 3; do
        $MPIRUN 4 "$TANDEM" bench --train --plan --model "$STORIES" --batch 2 --seq 32 --threads 1 --zero $z 2>/dev/null |
            grep '^{"bench": "train_plan"' >> "$BATS_TEST_TMPDIR/plans"
    done
    jq -c '{zero, weights_mib, grads_mib, moments_mib, total_mib}' "$BATS_TEST_TMPDIR/plans"
    # moments: 1/4 of plain's up to the padding of each unit to 16 x 4 floats (< 1%); the rest as the header says
    jq -s -e '(.[1].moments_mib / .[0].moments_mib - 0.25 | fabs) < 0.01 and .[1].grads_mib >= .[0].grads_mib
        and .[2].grads_mib < .[0].grads_mib and .[2].moments_mib == .[3].moments_mib and .[3].weights_mib < .[0].weights_mib
        and .[3].total_mib < .[2].total_mib and .[2].total_mib < .[1].total_mib and .[1].total_mib < .[0].total_mib' "$BATS_TEST_TMPDIR/plans"
}

@test "--zero: a stage other than 0 to 3 is one line" {
    need_story
    run "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/digits.jsonl" --out "$BATS_TEST_TMPDIR/x" --zero 4
    [ "$status" -ne 0 ]
    [ "${lines[-1]}" = "tandem: --zero 4: must be 0, 1, 2 or 3" ]
    run "$TANDEM" ppo --actor "$STORIES" --reward-cmd true --prompts "$TRAIN" --out "$BATS_TEST_TMPDIR/x" --advantage grpo \
        --n-samples-per-prompt 2 --zero -1
    [ "$status" -ne 0 ]
    [ "${lines[-1]}" = "tandem: --zero -1: must be 0, 1, 2 or 3" ]
}
