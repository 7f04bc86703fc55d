#!/usr/bin/env bash
# RL with a verifiable reward, shown learning on CPU in under 10 minutes: a random-initialised tiny
# Llama learns sums of two integers 0..99 by SFT to a partial accuracy, then GRPO with a math reward
# (1 when the last \boxed{} equals the answer) takes it further. Neither stage ever sees a pair with
# (a + 2b) mod 7 == 0: those are the held-out problems, scored greedily before and after RL.
#   bash examples/rlvr.sh [HELDOUT.jsonl [grpo|drgrpo|distill]]      (run from anywhere)
# HELDOUT lines: {"prompt": "What is 37 + 58?", "answer": "95"}, every pair from the held-out class
# (checked); without it (or with "-") the script writes OUT/heldout.jsonl, all 1429 such pairs.
# The last line printed is JSON: {"heldout_accuracy_before": .., "heldout_accuracy_after": .., ...}.
# The recipe: a Llama of dim 64, 2 layers, 4 heads, the 512-piece stories260K vocabulary (every digit
# its own piece); responses that add the units first, then the tens with the carry, then box the sum:
# " 7 + 8 = 15, 3 + 5 + 1 = 9. \boxed{95}". With the bare " \boxed{95}" the model has to emit the
# carried tens digit first; it learns that only after ~1100 SFT steps, in one sudden jump, and GRPO
# from a half-trained model of that kind did not move in 60 steps at lr 1e-4 and broke it at >= 3e-4.
# With the chain every token is a one-digit sum or a copy: SFT (lr 3e-3, batch 64) passes 0.45 at
# ~300-400 steps, where it stops; GRPO (G 8 x 32 prompts, lr 1e-4, temperature 0.7, 60 steps, no KL)
# then takes held-out greedy accuracy from 0.46-0.54 to 0.86-0.93 (seeds 1-4), in ~100 s on 2 idle
# cores (~5 min with three runs at once). The same GRPO with a random 0/1 reward instead of the
# verifier takes seed 1 from 0.54 to 0.01: the gain is the verifier's.
# Environment (defaults are the demonstration's recipe; tests/rlvr.bats shrinks them):
#   OUT=runs/rlvr (under the repository) SEED=1 THREADS=1 (1 thread per process: on a loaded machine 2 spin-wait)
#   SFT_MAX=1500 SFT_CHUNK=25 SFT_TARGET=0.45  SFT's cosine schedule length, the steps between
#       accuracy checks, and the greedy accuracy on 296 *training* problems at which SFT stops
#   RL_STEPS RL_PROMPTS RL_G RL_LR RL_TEMP        GRPO's steps, prompts per step, group size, lr, temperature
set -euo pipefail
HELD_IN=${1:--}
[ "$HELD_IN" = - ] || HELD_IN=$(realpath -- "$HELD_IN")   # the user's path, before the cd
cd "$(dirname "$0")/.."
MODE=${2:-grpo}
OUT=${OUT:-runs/rlvr}
SEED=${SEED:-1}
THREADS=${THREADS:-1}
SHAPE=${SHAPE:-64,192,2,4,4,512,64}          # dim, hidden, layers, heads, kv heads, vocab, positions
STUDENT_SHAPE=${STUDENT_SHAPE:-48,128,2,4,4,512,64} STUDENT_TARGET=${STUDENT_TARGET:-0.1}
SFT_MAX=${SFT_MAX:-1500} SFT_CHUNK=${SFT_CHUNK:-25} SFT_TARGET=${SFT_TARGET:-0.45} SFT_LR=${SFT_LR:-3e-3}
RL_STEPS=${RL_STEPS:-60} RL_PROMPTS=${RL_PROMPTS:-32} RL_G=${RL_G:-8} RL_LR=${RL_LR:-1e-4} RL_TEMP=${RL_TEMP:-0.7}
T=bin/tandem
TOK=../shared/assets/models/stories260K/tok512.model
TH=(--threads "$THREADS")
die() { echo "rlvr.sh: $*" >&2; exit 1; }
[ -x "$T" ] || die "$T missing: run make"
# ppo_has FLAG: this build's ppo has FLAG (drgrpo and distill need flags that land with issue #40)
PPO_HELP=$($T ppo --help 2>&1 || true)
ppo_has() { grep -q -- "^  $1 " <<<"$PPO_HELP"; }
case $MODE in
grpo)    ;;
drgrpo)  for f in --loss-agg --dynamic-sampling; do ppo_has $f || die "mode drgrpo: this tandem's ppo has no $f"; done ;;
distill) ppo_has --teacher || die "mode distill: this tandem's ppo has no --teacher" ;;
*)       die "mode '$MODE': expected grpo, drgrpo or distill" ;;
esac
rm -rf "$OUT"; mkdir -p "$OUT"
t0=$SECONDS; times=()
lap() { times+=("\"$1\": $((SECONDS - t0))"); t0=$SECONDS; }

# ---- the verifier: tandem verify math, the same grader as ppo --reward-fn math --------------------------
# math_verify IN OUT: {"response", "answer"} lines -> {"reward", "reason"} lines
math_verify() { $T verify math --input "$1" --output "$2" --workers 2 2>/dev/null; }
REWARD=(--reward-fn math)                                  # against the prompt line's "answer"

# ---- data ---------------------------------------------------------------------------------------
bash examples/rlvr_data.sh "$OUT"   # OUT/sft.jsonl, OUT/rl.jsonl, OUT/val.jsonl, OUT/heldout_all.jsonl
if [ "$HELD_IN" = - ]; then
    HELD=$OUT/heldout.jsonl; cp "$OUT/heldout_all.jsonl" "$HELD"
else
    HELD=$HELD_IN
    [ -s "$HELD" ] || die "$HELD: missing or empty"
    # every line a held-out pair with its right answer, or the demonstration proves nothing
    jq -r '[input_line_number, .prompt, .answer] | @tsv' "$HELD" | awk -F'\t' '{
        if (match($2, /^What is [0-9]+ \+ [0-9]+\?$/) == 0) { print FILENAME ": line " $1 ": prompt \"" $2 "\" is not \"What is A + B?\""; exit 1 }
        split(substr($2, 9), x, /[ +?]+/); a = x[1] + 0; b = x[2] + 0
        if ((a + 2 * b) % 7 != 0) { print "line " $1 ": " a " + " b " is not held out ((a + 2b) mod 7 != 0)"; exit 1 }
        if ($3 != a + b "") { print "line " $1 ": answer \"" $3 "\" is not " a + b; exit 1 } }' >&2 ||
        die "$HELD: not a held-out file"
fi
lap data

# accuracy MODEL TAG: greedy answers to HELD, scored by the verifier; prints the mean reward
accuracy() { score "$1" "$HELD" "$OUT/eval_$2"; }
score() {   # MODEL PROMPTS(prompt, answer) PREFIX
    jq -c '{id: input_line_number, prompt}' "$2" > "$3.in"
    $T generate --model "$1" --input "$3.in" --output "$3.gen" --temperature 0 --max-new-tokens 48 "${TH[@]}" \
        2>"$3.log" || { cat "$3.log" >&2; exit 1; }
    jq -c --slurpfile h "$2" '{id, response: .completion, answer: $h[.id - 1].answer}' "$3.gen" > "$3.verify_in"
    math_verify "$3.verify_in" "$3.verify_out"
    jq -s 'map(.reward) | add / length * 10000 | round / 10000' "$3.verify_out"
}

# ---- 1. a random model with the 512-piece SentencePiece vocabulary (digits are single pieces) -------
$T convert --from random --shape "$SHAPE" --seed "$SEED" --tokenizer "$TOK" --out "$OUT/init" > "$OUT/init.log" 2>&1 ||
    { cat "$OUT/init.log" >&2; exit 1; }
lap init

# ---- 2. SFT in chunks of SFT_CHUNK steps of one cosine schedule, until the greedy accuracy on 296
# training problems reaches SFT_TARGET (a partial accuracy, so that RL has room) ----------------------
# sft_until INIT DIR TARGET: SFT of INIT into DIR until that accuracy (or SFT_MAX steps); sets step
sft_until() {
    local args=(--data "${SFT_DATA:-$OUT/sft.jsonl}" --out "$2" --seq-len 64 --batch-size 64 --max-steps "$SFT_MAX"
                --lr "$SFT_LR" --warmup $((SFT_MAX > 40 ? 20 : SFT_MAX / 2)) --seed "$SEED" --log-every "$SFT_CHUNK" "${TH[@]}")
    local from=(--model "$1") val
    step=0
    while [ "$step" -lt "$SFT_MAX" ]; do
        step=$((step + SFT_CHUNK)); [ "$step" -gt "$SFT_MAX" ] && step=$SFT_MAX
        $T sft "${from[@]}" "${args[@]}" --stop-after "$step" > "$2_$step.log" 2>&1 || { cat "$2_$step.log" >&2; exit 1; }
        [ "$step" -gt "$SFT_CHUNK" ] && rm -rf "$2/checkpoint-$((step - SFT_CHUNK))"
        from=(--model "$1" --resume "$2/checkpoint-$step")
        val=$(score "$2/checkpoint-$step" "$OUT/val.jsonl" "$OUT/val")
        echo "sft step $step ($(basename "$2")): training-problem accuracy $val"
        awk -v v="$val" -v t="$3" 'BEGIN { exit !(v >= t) }' && break
    done
    return 0
}
sft_until "$OUT/init" "$OUT/sft" "$SFT_TARGET"
SFT=$OUT/sft/checkpoint-$step
lap sft
before=$(accuracy "$SFT" sft)
echo "held-out accuracy after SFT ($step steps): $before"
lap eval_before

# ---- 3. RL on the training prompts ---------------------------------------------------------------------
RL=(--prompts "$OUT/rl.jsonl" --out "$OUT/rl" --steps "$RL_STEPS" --rollout-batch-size "$RL_PROMPTS"
    --n-samples-per-prompt "$RL_G" --actor-lr "$RL_LR" --temperature "$RL_TEMP" --max-new-tokens 48
    --kl-coef 0 --seed "$SEED" --log-every 10 "${TH[@]}")
actor=$SFT
case $MODE in
grpo)    RL+=(--advantage grpo "${REWARD[@]}") ;;
drgrpo)  # DAPO's dynamic sampling with Dr. GRPO's loss: no std normalisation, a constant normaliser
         RL+=(--advantage grpo --no-std-norm --loss-agg seq-mean-token-sum-norm --dynamic-sampling "${REWARD[@]}") ;;
distill) # on-policy distillation into a fresh (random-initialised), smaller student whose every lesson is
         # the teacher's (the SFT model's): first off-policy, SFT on the teacher's own greedy answers to the
         # training prompts (right or wrong; the ground-truth responses are never shown to it) until
         # STUDENT_TARGET, then on-policy: the per-token reverse KL to the teacher on the student's own
         # samples as the advantage (no reward). On-policy alone from a random student does not learn the
         # task within minutes (reverse KL from a uniform policy collapses onto repeated tokens first).
         # before = the student after the off-policy stage (a fresh one scores 0)
         $T convert --from random --shape "$STUDENT_SHAPE" --seed "$((SEED + 1))" --tokenizer "$TOK" --out "$OUT/student_init" > /dev/null 2>&1
         jq -c '{id: input_line_number, prompt}' "$OUT/sft.jsonl" > "$OUT/teacher.in"
         $T generate --model "$SFT" --input "$OUT/teacher.in" --output "$OUT/teacher.gen" --temperature 0 \
             --max-new-tokens 48 "${TH[@]}" 2>"$OUT/teacher.log" || { cat "$OUT/teacher.log" >&2; exit 1; }
         jq -c '{prompt, response: .completion}' "$OUT/teacher.gen" > "$OUT/student_sft.jsonl"
         teacher_steps=$step
         SFT_DATA=$OUT/student_sft.jsonl sft_until "$OUT/student_init" "$OUT/student" "$STUDENT_TARGET"
         actor=$OUT/student/checkpoint-$step; step=$teacher_steps
         before=$(accuracy "$actor" student)
         echo "held-out accuracy of the student after the off-policy stage: $before"
         RL+=(--teacher "$SFT") ;;
esac
$T ppo --actor "$actor" "${RL[@]}" > "$OUT/rl.log" 2>&1 || { cat "$OUT/rl.log" >&2; exit 1; }
grep -E "^step|^ppo:" "$OUT/rl.log"
lap rl
after=$(accuracy "$OUT/rl/checkpoint-$RL_STEPS/actor" rl)
lap eval_after
echo "held-out accuracy: before $before, after $after"
n=$(wc -l < "$HELD")
echo "{\"mode\": \"$MODE\", \"seed\": $SEED, \"heldout_problems\": $n, \"sft_steps\": $step, \"heldout_accuracy_before\": $before, \"heldout_accuracy_after\": $after, \"seconds\": {$(IFS=,; echo "${times[*]}" | sed 's/,/, /g')}}"
