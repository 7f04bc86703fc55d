#!/usr/bin/env bash
# tests/cuda/gpu_layouts.sh [DIR] — tp, pp and dp on the lent GPU (one GPU: the ranks share it, so
# runtime/comm_device.c stages their buffers through host memory; NCCL needs a GPU per rank).
# Checks, printed as lines: generate with logprobs at 1x1, tp 2, pp 2, tp 2 x pp 2 and dp 3 on cuda
# gives the same bytes (fp32 and bf16); eval tp 2 x pp 2 on cuda gives 1x1's numbers; sft at tp 2 x
# pp 2, dp 2, ZeRO-1, -2 and -3 on cuda beside the cpu at the same layout (losses, grad norms); ppo with a tp-2 actor
# on 2 ranks, critic and reference on their own (rollout logprob diff 0). DIR: the bundle (.device).
# DEVICE=cpu-guarded checks the script here (bin/tandem, ../shared/assets).
set -u
DEV=${DEVICE:-cuda}
if [ "$DEV" = cuda ]; then
    source tests/cuda/device_env.sh "${1:-.device}" >/dev/null
    T=$TANDEM MD=$TANDEM_ASSETS/models
else
    T=bin/tandem MD=../shared/assets/models
fi
S=$MD/stories260K-hf W=/tmp/gpu_layouts P=tests/fixtures/ppo/story_prompts_train.jsonl
rm -rf "$W"; mkdir -p "$W"
MPI="mpirun --oversubscribe -np"
for dt in fp32 bf16; do
    for L in "1" "2 --tp 2" "2 --pp 2" "4 --tp 2 --pp 2" "3"; do
        set -- $L; n=$1; shift
        o=$W/g.$dt.$(echo "$L" | tr -d ' -').jsonl
        timeout 120 $MPI $n $T generate --model $S --input $P --output $o "$@" --dtype $dt --max-new-tokens 24 \
            --temperature 0.8 --seed 3 --logprobs 2 --device $DEV 2> $W/e || tail -3 $W/e
        echo "generate $dt np $n $*: $(md5sum < $o | cut -c1-12) $(wc -l < $o) lines"
    done
done
for L in "1" "4 --tp 2 --pp 2"; do
    set -- $L; n=$1; shift
    echo "eval np $n $*: $(timeout 120 $MPI $n $T eval --model $S --reference tests/fixtures/refs/stories260K.jsonl --dtype fp32 "$@" \
        --device $DEV --quiet 2>&1 | grep -o '"max_abs_logprob_diff": [^,]*\|"greedy_mismatches": [^,]*' | tr '\n' ' ')"
done
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
     r = ""; for (k = 4; k > 0; k--) r = r substr(s, k, 1); printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, r } }' > $W/rt.jsonl
$T convert --from random --shape 64,256,2,4,2,512,64 --tokenizer $MD/stories260K/tok512.model --seed 1 --out $W/m 2>/dev/null
L() { grep '"loss"' $1/metrics.jsonl | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]+).*"grad_norm": ([^,]+).*/\1 \2 \3/' | tr '\n' ' '; echo; }
for Lay in "4 --tp 2 --pp 2" "2" "2 --tp 2 --sequence-parallel --dtype bf16" "2 --zero 2 --dtype bf16" "4 --tp 2 --zero 1" "2 --zero 3"; do
    set -- $Lay; n=$1; shift
    for dev in cpu $DEV; do
        timeout 120 $MPI $n $T sft --model $W/m --data $W/rt.jsonl --seq-len 32 --batch-size 8 --max-steps 6 --lr 3e-3 "$@" \
            --threads 4 --device $dev --out $W/s$n$dev 2> $W/e > /dev/null || tail -3 $W/e
        echo "sft np $n $* $dev: $(L $W/s$n$dev)"
        rm -rf $W/s$n$dev
    done
done
$T rm --model $S --data tests/fixtures/pref/story_train.jsonl --out $W/rm --seq-len 64 --batch-size 4 --max-steps 1 --lr 1e-3 >/dev/null 2>&1
K='"actor/grad_norm": [^,]*\|"critic/grad_norm": [^,]*\|"rollout_logprob_diff_max": [^,]*'
for dev in cpu $DEV; do
    timeout 180 $MPI 4 $T ppo --actor $S --critic $W/rm/checkpoint-1 --reward $W/rm/checkpoint-1 --prompts $P --n-samples-per-prompt 2 \
        --rollout-batch-size 4 --max-new-tokens 16 --steps 2 --kl-coef 0.01 --actor-ranks 2 --actor-tp 2 --critic-ranks 1 \
        --ref-ranks 1 --reward-ranks 0 --threads 4 --device $dev --out $W/ppo.$dev 2> $W/e > /dev/null || tail -3 $W/e
    echo "ppo 4 ranks (actor tp 2) $dev: $(grep -o "$K" $W/ppo.$dev/metrics.jsonl | tr '\n' ' ')"
done
