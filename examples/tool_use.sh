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
# SFT has two stages: the call alone until 0.9 of the validation lookups are right, then both turns until
# the episode's success reaches 0.45. Why: in one stage the seeds learn the two copies (the name into the
# call, the number into the answer) in either order. Seed 2 learned the answer first (greedy 0.99) and
# stopped with names holding a multi-letter piece ("▁b s an w h": "an", "ll", "st"; 26% of names) never
# copied (0.00 greedy; 2% of samples at T 0.3): GRPO's groups on them were all 0 (23-27% of its groups,
# 80-85% of all groups equal), its rollouts' failures were 95% a wrong name in the call and ~0 wrong
# digits, and it stalled at 0.59 -> 0.67 (T 0.6: 0.71; T 1.0 or lr 1e-3: worse). With the call learned
# first, the partial success is the answer's digits, ten pieces GRPO finds at once.
# Measured (200 held-out lines, THREADS=1, two runs at once on a loaded 2-core machine): MEASURED_TABLE
# Environment (defaults are the demonstration's recipe; tests/tool_use.bats shrinks them):
#   OUT=runs/tool_use (under the repository) SEED=1 THREADS=1 (1 thread per process) TANDEM=bin/tandem
#   SHAPE                                  dim, hidden, layers, heads, kv heads, vocab, positions
#   SFT_MAX SFT_CHUNK SFT_LR SFT_CALL_TARGET   stage 1 (the call alone): its cosine schedule's length, the
#       steps between checks, its lr, the greedy rate of right lookups on 200 *training* lines at which it stops
#   SFT2_MAX SFT2_CHUNK SFT2_LR SFT_TARGET     stage 2 (both turns, constant lr): its steps at most, between
#       checks, its lr, the greedy success on the 200 lines at which it stops (the tool's answers given: the
#       lookup turn and the answer turn checked apart, lookup_env.py score)
#   SFT_MODEL                              GRPO alone, from this SFT'd model (steps 1-2 skipped)
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
SFT_MAX=${SFT_MAX:-1200} SFT_CHUNK=${SFT_CHUNK:-25} SFT_LR=${SFT_LR:-3e-3} SFT_CALL_TARGET=${SFT_CALL_TARGET:-0.9}
SFT2_MAX=${SFT2_MAX:-1000} SFT2_CHUNK=${SFT2_CHUNK:-10} SFT2_LR=${SFT2_LR:-3e-3} SFT_TARGET=${SFT_TARGET:-0.45}
RL_STEPS=${RL_STEPS:-60} RL_PROMPTS=${RL_PROMPTS:-32} RL_G=${RL_G:-8} RL_LR=${RL_LR:-3e-4} RL_TEMP=${RL_TEMP:-0.3}
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

# ---- 2. SFT in two stages, each in chunks of one cosine schedule, checked greedily on the validation lines
# after each chunk: (a) the call alone (sft_call.jsonl) until SFT_CALL_TARGET of the lookups are right;
# (b) from there, both turns (sft.jsonl) until the episode's success reaches SFT_TARGET (a partial one,
# so that RL has room). Why two stages: in one, seeds learn the two copies in either order; where the
# answer comes first, the partial success is names with a multi-letter piece ("an", "ll") never copied,
# which sampling finds in ~2% of episodes, and GRPO stalled (seed 2: 0.59 -> 0.67).
# success MODEL [call]: both turns greedily (turn 1 from the question, turn 2 given the right lookup and
# result), or the call alone
success() {
    local p=$OUT/val
    $T generate --model "$1" --input "$OUT/val_turn1.jsonl" --output "$p.g1" --temperature 0 --max-new-tokens 24 \
        --stop '</lookup>' "${TH[@]}" 2>"$p.log" || { cat "$p.log" >&2; exit 1; }
    [ "${2:-}" = call ] && { python3 $ENV score "$OUT/val.jsonl" "$p.g1"; return; }
    $T generate --model "$1" --input "$OUT/val_turn2.jsonl" --output "$p.g2" --temperature 0 --max-new-tokens 24 \
        --stop '</answer>' "${TH[@]}" 2>"$p.log" || { cat "$p.log" >&2; exit 1; }
    python3 $ENV score "$OUT/val.jsonl" "$p.g1" "$p.g2"
}
# sft_stage NAME MODEL DATA MAX CHUNK LR SCHEDULE TARGET [call]: chunks of CHUNK steps from MODEL until success
# >= TARGET (or MAX steps); sets $step and leaves OUT/NAME/checkpoint-$step
sft_stage() {
    local name=$1 model=$2 data=$3 max=$4 chunk=$5 lr=$6 sched=$7 target=$8 what=${9:-} val from
    local args=(--data "$data" --out "$OUT/$name" --seq-len 96 --batch-size 64 --max-steps "$max" --lr "$lr"
                --lr-schedule "$sched" --warmup $((max > 40 ? 20 : max / 2)) --seed "$SEED" --log-every "$chunk" "${TH[@]}")
    from=(--model "$model")
    step=0
    while [ "$step" -lt "$max" ]; do
        step=$((step + chunk)); [ "$step" -gt "$max" ] && step=$max
        $T sft "${from[@]}" "${args[@]}" --stop-after "$step" > "$OUT/${name}_$step.log" 2>&1 ||
            { cat "$OUT/${name}_$step.log" >&2; exit 1; }
        [ "$step" -gt "$chunk" ] && rm -rf "$OUT/$name/checkpoint-$((step - chunk))"
        from=(--model "$model" --resume "$OUT/$name/checkpoint-$step")
        val=$(success "$OUT/$name/checkpoint-$step" $what)
        echo "$name step $step: validation ${what:-success} $val"
        awk -v v="$val" -v t="$target" 'BEGIN { exit !(v >= t) }' && break
    done
    return 0
}
sft_stage sft_call "$OUT/init" "$OUT/sft_call.jsonl" "$SFT_MAX" "$SFT_CHUNK" "$SFT_LR" cosine "$SFT_CALL_TARGET" call
call_steps=$step
sft_stage sft "$OUT/sft_call/checkpoint-$step" "$OUT/sft.jsonl" "$SFT2_MAX" "$SFT2_CHUNK" "$SFT2_LR" constant "$SFT_TARGET"
SFT=$OUT/sft/checkpoint-$step
step=$((call_steps + step))
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
