#!/usr/bin/env bash
# A tool-using policy, shown learning on CPU in under 10 minutes: a random-initialised tiny Llama is
# taught by SFT to call a lookup tool and answer with what it returns, to a partial success rate; then
# GRPO over multi-turn episodes against the tool (examples/lookup_env.py, --env-cmd) takes it further.
# The held-out names and numbers are never seen in training (lookup_env.py's classes: letter sum and
# digit sum multiples of 5); the held-out success rate is ppo's own greedy eval (--eval-prompts)
# before the first GRPO step and after the last.
#   bash examples/tool_use.sh [HELDOUT.jsonl]                               (run from anywhere)
# HELDOUT lines: {"prompt": "What is the number of kivo?", "name": "kivo", "number": "4821"}, every
# one from the held-out class (checked); without it (or with "-") OUT/heldout.jsonl, 200 such lines.
# The last line printed is JSON: {"heldout_success_before": .., "heldout_success_after": .., ...}.
# An episode: the question; the model's turn " <lookup> NAME</lookup>" (it ends at the stop string; the
# space makes the name's pieces the question's, lookup_env.py says why);
# the environment's " <result>NUMBER</result>" (its text tokenised on its own) or "<result>unknown</result>";
# the model's " <answer>NUMBER</answer>"; reward 1 when it is the line's number (at most 3 turns).
# SFT sees the same ids: each demonstration is two records, the lookup turn, and the answer turn
# whose prompt holds the lookup and the result, so the environment's tokens are out of the loss.
# Measured (200 held-out lines, THREADS=1 on a loaded 2-core machine, ~7 min a run): held-out greedy
# success, seeds 1-3, after 150 GRPO steps: 0.605 -> 0.92, 0.59 -> 0.67, 0.43 -> 0.885 (after 60 steps:
# 0.91, 0.69, 0.645; seed 2 again, 9.5 min with another run beside it: 0.59 -> 0.67). Before the space
# (" <lookup>NAME"), 60 steps: 0.59 -> 0.72, 0.495 -> 0.495, 0.46 -> 0.705.
# Why seed 2 plateaus (--dump-rollouts, tool_use.sh's README section): SFT teaches two copies, the name
# into the call and the number into the answer, and a seed learns them in either order. Seed 1 stops SFT
# with the call learned and the answer's digits partial (greedy 0.64), seed 3 with the answer learned and
# the call partial for every kind of name; seed 2 with the answer learned and names holding a multi-letter
# piece ("▁b s an w h": "an", "ll", "st"; 26% of names) never copied (greedy 0.00, 2% of samples at T 0.3):
# 90-97% of its failed episodes are a wrong name in the call, 23% of its groups are all 0 and GRPO never
# finds those pieces (T 0.6: 0.59 -> 0.71; T 1.0, lr 1e-3: worse). Two SFT stages (the call alone to 0.9,
# then both turns to 0.45) make every seed's partial success the digits, but the digits' copy then forms
# late or not at all: seed 1 stays at 0.000 for 910 steps of stage 2, seed 3 reaches 0.48 -> 0.745 (seed
# 2: 0.56 -> 0.935); not adopted.
# Environment (defaults are the demonstration's recipe; tests/tool_use.bats shrinks them):
#   OUT=runs/tool_use (under the repository) SEED=1 THREADS=1 (1 thread per process) TANDEM=bin/tandem
#   SHAPE                                  dim, hidden, layers, heads, kv heads, vocab, positions
#   SFT_MAX SFT_CHUNK SFT_TARGET SFT_LR    SFT's cosine schedule length, the steps between checks, the
#       greedy success rate on 200 *training* lines at which SFT stops (the tool's answers given: the
#       lookup turn and the answer turn checked apart, lookup_env.py score), its lr
#   SFT_MODEL                              GRPO alone, from a model this script SFT'd (steps 1-2 skipped)
#   RL_STEPS RL_PROMPTS RL_G RL_LR RL_TEMP GRPO's steps, prompts per step, group size, lr, temperature
#   RL_EXTRA                               more ppo options (e.g. "--dump-rollouts FILE --eval-every 20")
set -euo pipefail
HELD_IN=${1:--}
[ "$HELD_IN" = - ] || HELD_IN=$(realpath -- "$HELD_IN")   # the user's path, before the cd
SFT_MODEL=${SFT_MODEL:+$(realpath -- "$SFT_MODEL")}
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/tool_use}
SEED=${SEED:-1}
THREADS=${THREADS:-1}
SHAPE=${SHAPE:-64,192,2,4,4,512,128}
SFT_MAX=${SFT_MAX:-1200} SFT_CHUNK=${SFT_CHUNK:-25} SFT_TARGET=${SFT_TARGET:-0.45} SFT_LR=${SFT_LR:-3e-3}
RL_STEPS=${RL_STEPS:-150} RL_PROMPTS=${RL_PROMPTS:-32} RL_G=${RL_G:-8} RL_LR=${RL_LR:-3e-4} RL_TEMP=${RL_TEMP:-0.3}
N_TRAIN=${N_TRAIN:-4000}
T=${TANDEM:-bin/tandem}
ENV=examples/lookup_env.py
TOK=../shared/assets/models/stories260K/tok512.model
TH=(--threads "$THREADS")
die() { echo "tool_use.sh: $*" >&2; exit 1; }
[ -x "$T" ] || die "$T missing: run make"
PPO_HELP=$($T ppo --help 2>&1 || true)
for f in --env-cmd --eval-prompts; do grep -q -- "^  $f " <<<"$PPO_HELP" || die "this tandem's ppo has no $f"; done
rm -rf "$OUT"; mkdir -p "$OUT"
t0=$SECONDS; times=()
lap() { times+=("\"$1\": $((SECONDS - t0))"); t0=$SECONDS; }

# ---- data: training lines, their demonstrations, 200 more for SFT's check, the held-out lines ----------
python3 $ENV data "$OUT" 1 "$N_TRAIN"
if [ "$HELD_IN" = - ]; then
    HELD=$OUT/heldout.jsonl
else
    HELD=$HELD_IN
    [ -s "$HELD" ] || die "$HELD: missing or empty"
    python3 $ENV check "$HELD" || die "$HELD: not a held-out file"
fi
lap data

if [ -n "$SFT_MODEL" ]; then   # GRPO alone, from a model this script SFT'd (tests/tool_use.bats' learning test)
    [ -f "$SFT_MODEL/config.json" ] || die "SFT_MODEL=$SFT_MODEL: not a model directory"
    SFT=$SFT_MODEL step=0
else
# ---- 1. a random model with the 512-piece SentencePiece vocabulary (digits and most letters single pieces)
$T convert --from random --shape "$SHAPE" --seed "$SEED" --tokenizer "$TOK" --out "$OUT/init" > "$OUT/init.log" 2>&1 ||
    { cat "$OUT/init.log" >&2; exit 1; }
lap init

# ---- 2. SFT in chunks of SFT_CHUNK steps of one cosine schedule, until the greedy success rate on the
# validation lines reaches SFT_TARGET (a partial one, so that RL has room) ----------------------------
# success MODEL: both turns greedily (turn 1 from the question, turn 2 given the right lookup and result)
success() {
    local p=$OUT/val
    $T generate --model "$1" --input "$OUT/val_turn1.jsonl" --output "$p.g1" --temperature 0 --max-new-tokens 24 \
        --stop '</lookup>' "${TH[@]}" 2>"$p.log" || { cat "$p.log" >&2; exit 1; }
    $T generate --model "$1" --input "$OUT/val_turn2.jsonl" --output "$p.g2" --temperature 0 --max-new-tokens 24 \
        --stop '</answer>' "${TH[@]}" 2>"$p.log" || { cat "$p.log" >&2; exit 1; }
    python3 $ENV score "$OUT/val.jsonl" "$p.g1" "$p.g2"
}
args=(--data "$OUT/sft.jsonl" --out "$OUT/sft" --seq-len 96 --batch-size 64 --max-steps "$SFT_MAX" --lr "$SFT_LR"
      --warmup $((SFT_MAX > 40 ? 20 : SFT_MAX / 2)) --seed "$SEED" --log-every "$SFT_CHUNK" "${TH[@]}")
from=(--model "$OUT/init")
step=0
while [ "$step" -lt "$SFT_MAX" ]; do
    step=$((step + SFT_CHUNK)); [ "$step" -gt "$SFT_MAX" ] && step=$SFT_MAX
    $T sft "${from[@]}" "${args[@]}" --stop-after "$step" > "$OUT/sft_$step.log" 2>&1 || { cat "$OUT/sft_$step.log" >&2; exit 1; }
    [ "$step" -gt "$SFT_CHUNK" ] && rm -rf "$OUT/sft/checkpoint-$((step - SFT_CHUNK))"
    from=(--model "$OUT/init" --resume "$OUT/sft/checkpoint-$step")
    val=$(success "$OUT/sft/checkpoint-$step")
    echo "sft step $step: validation success $val"
    awk -v v="$val" -v t="$SFT_TARGET" 'BEGIN { exit !(v >= t) }' && break
done
SFT=$OUT/sft/checkpoint-$step
lap sft
fi

# ---- 3. GRPO over episodes with the lookup environment; ppo's greedy eval on HELD before and after ------
RL=(--actor "$SFT" --prompts "$OUT/rl.jsonl" --out "$OUT/rl" --env-cmd "python3 $ENV" --max-turns 3
    --stop '["</lookup>", "</answer>"]' --max-new-tokens 24 --max-episode-tokens 96
    --advantage grpo --steps "$RL_STEPS" --rollout-batch-size "$RL_PROMPTS" --n-samples-per-prompt "$RL_G"
    --actor-lr "$RL_LR" --temperature "$RL_TEMP" --kl-coef 0 --seed "$SEED" --log-every 5
    --eval-prompts "$HELD" "${TH[@]}")
read -r -a extra <<<"${RL_EXTRA:-}"
RL+=("${extra[@]}")
$T ppo "${RL[@]}" > "$OUT/rl.log" 2>&1 || { cat "$OUT/rl.log" >&2; exit 1; }
grep -E "^step|^eval|^ppo:" "$OUT/rl.log"
lap rl
ev() { jq -s --argjson k "$1" 'map(select(.step == $k and has("eval/reward_mean")))[0]["eval/reward_mean"] * 10000 | round / 10000' "$OUT/rl/metrics.jsonl"; }
before=$(ev 0) after=$(ev "$RL_STEPS")
echo "held-out success: before $before, after $after"
n=$(wc -l < "$HELD")
echo "{\"seed\": $SEED, \"heldout_lines\": $n, \"sft_steps\": $step, \"heldout_success_before\": $before, \"heldout_success_after\": $after, \"seconds\": {$(IFS=,; echo "${times[*]}" | sed 's/,/, /g')}}"
