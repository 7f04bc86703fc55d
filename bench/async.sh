#!/usr/bin/env bash
# Asynchronous GRPO steps (rlhf/async.h) in one run, the same seeds: the actor's rollout on a rank of
# its own (--rollout-ranks 1) and its trainer on another (--actor-ranks 1), 1 thread each, at
# --async-lag 0 (synchronous: generate, then train), 1 and 2, on the random 15M-shape model; the
# rollout's and the training's work made about equal (1 prompt x 4 samples of 96 new tokens: on
# this 2-core VM both take ~2-3 s). Per lag, the median over steps 2..N of the step time, of each
# group's idle time (the trainer waiting for a batch, the rollout waiting for weights) and of its
# generation and update times, and the step time over lag 0's. Then the weight transfer alone
# (tests/test_weight_sync.c: the actor's arena to the rollout rank, checked) at the 110M and 1.1B
# (TinyLlama: dim 2048, 22 layers, 32 heads, 4 kv heads) random shapes, fp32 and bf16: bytes and
# seconds per transfer, i.e. per step. One JSON line each.
# Usage: bench/async.sh [STEPS] [SHAPES]   (defaults: 8, "110M 1.1B"; SHAPES "" skips the transfers)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}; SHAPES=${2-"110M 1.1B"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun -q --allow-run-as-root --oversubscribe -np 2"
make -s bin/tandem build/tests/test_weight_sync
mkdir -p build/bench
[ -d build/bench/15M ] || bin/tandem convert --from random --shape 15M --out build/bench/15M 2>/dev/null
cp -n ../shared/assets/tokenizers/llama2/tokenizer.model build/bench/15M/ 2>/dev/null || true
med() { echo "(map(.[\"$1\"]) | sort | .[length / 2 | floor])"; }
base=""
for L in 0 1 2; do
    OUT=build/bench/async-l$L
    rm -rf "$OUT"
    $MPI bin/tandem ppo --actor build/bench/15M --reward-cmd "python3 -u tests/fixtures/ppo/split_reward.py" \
        --prompts tests/fixtures/ppo/story_prompts_train.jsonl --advantage grpo --kl-coef 0 --actor-lr 1e-5 \
        --rollout-batch-size 1 --n-samples-per-prompt 4 --max-new-tokens 96 --steps "$STEPS" --threads 1 \
        --actor-ranks 1 --rollout-ranks 1 --async-lag $L --out "$OUT" 2>/dev/null
    line=$(jq -s -c --argjson L $L ".[1:] | {bench: \"async_step\", model: \"15M random\", lag: \$L, steps: ($STEPS - 1),
        step_s: $(med timing_s/step), trainer_idle_s: $(med timing/trainer_idle_s), rollout_idle_s: $(med timing/rollout_idle_s),
        rollout_gen_s: $(med timing/rollout_gen_s), update_s: $(med timing_s/update_actor), prox_s: $(med timing_s/ref),
        weight_sync_bytes: $(med weight_sync/bytes), weight_sync_s: $(med weight_sync/s),
        staleness_max: (map(.[\"async/staleness_max\"]) | max)}" "$OUT/metrics.jsonl")
    [ -n "$base" ] || base=$(jq .step_s <<<"$line")
    jq -c --argjson b "$base" '. + {step_over_lag0: (.step_s / $b * 1000 | round / 1000)}' <<<"$line"
done
shape_of() { [ "$1" = 1.1B ] && echo 2048,5632,22,32,4,32000,2048 || echo "$1"; }
for s in $SHAPES; do
    [ -d build/bench/$s ] || bin/tandem convert --from random --shape "$(shape_of $s)" --out build/bench/$s 2>/dev/null
    for dt in fp32 bf16; do
        $MPI build/tests/test_weight_sync build/bench/$s 3 $dt 2>/dev/null | grep '^{' | jq -c --arg s $s '. + {shape: $s}'
    done
done
