#!/usr/bin/env bash
# One PPO step's time split on the random 15M-shape model (actor, reference and critic; the rule
# as --reward-cmd), all roles colocated on one rank: the median over steps 2..N of each phase
# (rollout, reference logprobs, reward, values, advantages, actor update, critic update) and of the
# whole step, and what the step costs beyond the sum of its phases (the exchange between roles,
# prompt selection, metrics); then (--bench-alone 3) each phase run by itself on the last step's
# shapes, and the median step against the sum of those.
# Usage: bench/ppo.sh [THREADS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; STEPS=${2:-6}
mkdir -p build/bench
[ -d build/bench/15M ] || bin/tandem convert --from random --shape 15M --out build/bench/15M
cp -n ../shared/assets/tokenizers/llama2/tokenizer.model build/bench/15M/ 2>/dev/null || true
OUT=build/bench/ppo
rm -rf "$OUT"
bin/tandem ppo --actor build/bench/15M --critic build/bench/15M --reward-cmd "python3 -u tests/fixtures/ppo/happy_reward.py" \
    --prompts tests/fixtures/ppo/story_prompts_train.jsonl --out "$OUT" --rollout-batch-size 8 --n-samples-per-prompt 2 \
    --max-new-tokens 32 --steps "$STEPS" --kl-coef 0.01 --threads "$TH" --bench-alone 3 2>/dev/null
jq -s --argjson th "$TH" '.[1:] as $r | def med($k): ($r | map(.[$k]) | sort | .[length / 2 | floor]);
    ["gen", "ref", "reward", "values", "adv", "update_actor", "update_critic"] as $ph
    | ($ph | map({key: ., value: med("timing_s/" + .)}) | from_entries) as $m
    | ($m | add) as $sum | med("timing_s/step") as $step
    | {bench: "ppo", model: "15M random", threads: $th, sequences: ($r[0]["samples_per_s"] * $r[0]["timing_s/step"] | round),
       median_s: $m, sum_of_phases_s: $sum, step_s: $step, step_over_sum: ($step / $sum)}' "$OUT/metrics.jsonl"
