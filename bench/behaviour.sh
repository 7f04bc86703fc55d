#!/usr/bin/env bash
# Behaviour check for a refactor (issue 26): the same fixed set of commands with two tandem binaries,
# each in its own directory, compared byte for byte: generated jsonl, eval's report, metrics.jsonl
# (time and memory fields removed), every file of every checkpoint, and stdout (times masked).
# Exit codes must match too; stderr is not compared (progress, timings, rank tables).
#
# Usage: bench/behaviour.sh [--allow-diff CASE[,CASE...]] BEFORE_BIN AFTER_BIN [WORKDIR]
#        ALLOW_DIFF="ppo-eos" bench/behaviour.sh BEFORE_BIN AFTER_BIN
# A case named in --allow-diff / ALLOW_DIFF may differ (reported, not a failure). Prints one line per
# case (`same   CASE` or `DIFF   CASE: FILE`) and a summary; exit 1 on any difference not allowed,
# or when a case exits non-zero with both binaries (a broken case checks nothing).
#
# Cases (stories260K-hf from ../shared/assets, tests/fixtures data; 1 thread per rank):
#   gen-1x1, gen-tp2pp2   generate: greedy, sampled (top-k/p, min-p, repetition penalty, per-line
#                         seeds), input_ids + logprobs; at 1x1 and under mpirun -np 4 at tp 2 x pp 2
#   gen-eos               generate with a model whose config.json EOS list is [2, 426 (".")]
#   eval-ref, eval-data   eval against tests/fixtures/refs/stories260K.jsonl (+ --write-reference),
#                         and loss/perplexity of --data
#   sft, sft-resume       4 steps, --eval-data, checkpoints at 2 and 4; 2 steps + --resume to 4
#   sft-tp2pp2            sft under mpirun -np 4, tp 2 x pp 2, 2 micro-batches
#   rm, dpo               4 steps on the story preference pairs, --eval-data, checkpoints at 2 and 4
#   rm-score              rm --score of held-out pairs with a fixed reward model (trained once, below)
#   ppo-roles             ppo (gae) under mpirun -np 4: actor, critic, reference, reward on separate
#                         ranks (--actor-ranks 1 --critic-ranks 1 --ref-ranks 1 --reward-ranks 1)
#   ppo-eos               grpo with a --reward-cmd rule (words / 10), the actor the gen-eos model:
#                         rollouts stop at the tokenizer's EOS only, while generate stops at the
#                         config's list too (REDESIGN.md "a behaviour difference that is probably a
#                         bug"): the case the EOS fix is expected to change (ALLOW_DIFF=ppo-eos)
#   bench-train           bench --train and --train --score: last_loss and shapes (speed dropped)
# The fixed reward model (rm-score, ppo-roles) is trained by BEFORE_BIN once into WORKDIR/in, so
# those cases test scoring and PPO alone, not the rm command again.
set -euo pipefail

ALLOW=${ALLOW_DIFF:-}
if [ "${1:-}" = --allow-diff ]; then ALLOW="$ALLOW,$2"; shift 2; fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    sed -n '7,8p' "$0" | sed 's/^# //' >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BEFORE="$(realpath "$1")" AFTER="$(realpath "$2")"
WORK="${3:-$(mktemp -d /tmp/behaviour.XXXXXX)}"
mkdir -p "$WORK"; WORK="$(realpath "$WORK")"
ASSETS="${TANDEM_ASSETS:-$ROOT/../shared/assets}"
STORIES="$ASSETS/models/stories260K-hf"
FIX="$ROOT/tests/fixtures"
for f in "$BEFORE" "$AFTER"; do [ -x "$f" ] || { echo "behaviour: $f: not an executable" >&2; exit 2; }; done
[ -e "$STORIES/config.json" ] || { echo "behaviour: $STORIES missing (../shared/assets)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun -q --oversubscribe -np)
IN="$WORK/in"
t0=$(date +%s)
rm -rf "$IN" "$WORK/before" "$WORK/after" "$WORK/norm"
mkdir -p "$IN" "$WORK/before" "$WORK/after"

# ---- inputs, the same for both binaries --------------------------------------------------------
# SFT records: TinyStories, first sentence -> the rest (as tests/fixtures/sft/make_data.sh)
jq -Rsc '[split("\n\n") | map(select(length > 80)) | .[] | (split(". ")) as $s | select(($s | length) > 2)
          | {prompt: ($s[0] + "."), response: (" " + ($s[1:] | join(". ")))}] | .[:48][]' \
    "$ASSETS/data/pretrain/tinystories_train_head.txt" > "$IN/stories.jsonl"
head -40 "$IN/stories.jsonl" > "$IN/sft_train.jsonl"
tail -8 "$IN/stories.jsonl" > "$IN/sft_val.jsonl"
jq -c '{text: (.prompt + .response)}' "$IN/sft_val.jsonl" > "$IN/eval_text.jsonl"
# prompts: 6 greedy, 8 sampled with their own seeds, one of ids with logprobs
{
    jq -c '{prompt, max_new_tokens: 40, temperature: 0}' "$FIX/pref/story_prompts_val.jsonl" | sed -n 1,6p
    jq -c '{prompt, max_new_tokens: 40, temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.02,
            repetition_penalty: 1.1, seed: (input_line_number + 7)}' "$FIX/pref/story_prompts_val.jsonl" | sed -n 7,14p
    echo '{"id": "ids", "input_ids": [1, 400, 30], "max_new_tokens": 20, "logprobs": 3}'
} > "$IN/prompts.jsonl"
jq -c '{prompt, response: .chosen}, {prompt, response: .rejected}' "$FIX/pref/story_val.jsonl" | sed -n 1,24p > "$IN/score.jsonl"
# a model whose config.json lists "." (426) as a second EOS: generate stops there, ppo rollouts do not
mkdir -p "$IN/eosm"
ln -s "$STORIES/model.safetensors" "$STORIES/tokenizer.model" "$IN/eosm/"
jq '.eos_token_id = [2, 426]' "$STORIES/config.json" > "$IN/eosm/config.json"
# ppo-eos's rule: reward = words in the response / 10 (varied rewards, so grpo updates the actor)
printf '%s\n' 'import json, sys' 'for line in sys.stdin:' \
    '    print(json.dumps({"reward": len(json.loads(line)["response"].split()) / 10}), flush=True)' > "$IN/words_reward.py"
# the fixed reward model (critic and reward of ppo-roles, the model of rm-score)
(cd "$IN" && "$BEFORE" rm --model "$STORIES" --data "$FIX/pref/story_train.jsonl" --out rm --seq-len 64 --batch-size 4 \
    --max-steps 4 --lr 1e-3 --threads 1 > rm.log 2>&1) || { echo "behaviour: training the fixture reward model failed:" >&2; cat "$IN/rm.log" >&2; exit 2; }
RM="$IN/rm/checkpoint-4"

# ---- the cases: each runs in the binary's directory, writing under ./CASE ----------------------
CASES="gen-1x1 gen-tp2pp2 gen-eos eval-ref eval-data sft sft-resume sft-tp2pp2 rm dpo rm-score ppo-roles ppo-eos bench-train"
SFT=(--data "$IN/sft_train.jsonl" --eval-data "$IN/sft_val.jsonl" --seq-len 64 --batch-size 4 --max-steps 4 --eval-every 2
     --lr 2e-3 --warmup 1 --threads 1)
PREF=(--model "$STORIES" --data "$FIX/pref/story_train.jsonl" --eval-data "$FIX/pref/story_val.jsonl" --seq-len 64 --batch-size 4
      --max-steps 4 --save-every 2 --eval-every 2 --lr 1e-3 --threads 1)
GEN=(--input "$IN/prompts.jsonl" --seed 11 --threads 1)
case_run() {   # CASE BIN: the case's commands; its stdout is the case's stdout, its status the case's status
    local c=$1 T=$2
    case $c in
        gen-1x1)    mkdir "$c"; "$T" generate --model "$STORIES" "${GEN[@]}" --output "$c/out.jsonl" ;;
        gen-tp2pp2) mkdir "$c"; "${MPIRUN[@]}" 4 "$T" generate --model "$STORIES" "${GEN[@]}" --output "$c/out.jsonl" --tp 2 --pp 2 ;;
        gen-eos)    mkdir "$c"; "$T" generate --model "$IN/eosm" "${GEN[@]}" --output "$c/out.jsonl" ;;
        eval-ref)   mkdir "$c"; "$T" eval --model "$STORIES" --reference "$FIX/refs/stories260K.jsonl" --write-reference "$c/ref.jsonl" --threads 1 ;;
        eval-data)  "$T" eval --model "$STORIES" --data "$IN/eval_text.jsonl" --threads 1 ;;
        sft)        "$T" sft --model "$STORIES" "${SFT[@]}" --save-every 2 --out "$c" ;;
        sft-resume) "$T" sft --model "$STORIES" "${SFT[@]}" --save-every 2 --stop-after 2 --out "$c" &&
                    "$T" sft --model "$STORIES" "${SFT[@]}" --save-every 2 --out "$c" --resume "$c/checkpoint-2" ;;
        sft-tp2pp2) "${MPIRUN[@]}" 4 "$T" sft --model "$STORIES" "${SFT[@]}" --batch-size 2 --micro-batches 2 --tp 2 --pp 2 --out "$c" ;;
        rm)         "$T" rm "${PREF[@]}" --out "$c" ;;
        dpo)        "$T" dpo "${PREF[@]}" --out "$c" ;;
        rm-score)   mkdir "$c"; "$T" rm --score --model "$RM" --input "$IN/score.jsonl" --output "$c/scores.jsonl" --threads 1 ;;
        ppo-roles)  "${MPIRUN[@]}" 4 "$T" ppo --actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$FIX/ppo/story_prompts_train.jsonl" \
                        --n-samples-per-prompt 2 --rollout-batch-size 4 --max-new-tokens 16 --steps 3 --save-every 2 --kl-coef 0.01 \
                        --actor-lr 3e-4 --critic-lr 1e-3 --threads 1 --out "$c" \
                        --actor-ranks 1 --critic-ranks 1 --ref-ranks 1 --reward-ranks 1 ;;
        ppo-eos)    "$T" ppo --actor "$IN/eosm" --reward-cmd "python3 -u $IN/words_reward.py" --prompts "$FIX/ppo/story_prompts_train.jsonl" \
                        --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 2 --max-new-tokens 24 --steps 3 --save-every 2 \
                        --kl-coef 0 --kl-loss-coef 0.001 --actor-lr 3e-4 --threads 1 --out "$c" ;;
        bench-train) "$T" bench --train --model "$FIX/models/llama_gqa" --batch 2 --seq 16 --iters 2 --threads 1 &&
                     "$T" bench --train --score --model "$FIX/models/llama_gqa" --batch 4 --seq 16 --iters 2 --threads 1 ;;
    esac
}

# ---- normalisation: what is time or memory, removed; everything else kept byte for byte -------
# JSON keys dropped with their number: timings, rates, memory peaks. The text is edited (perl), not
# reprinted by jq (jq 1.6 would rewrite 1.000000 as 1 and round long numbers: a changed printf would
# go unseen); jq then checks that every JSON line still parses and that no such key is left.
export TIMEKEY='timing_s/[^"]*|[^"]*_per_s|seconds|step_s|[^"]*_time[^"]*|elapsed[^"]*|[^"]*rss[^"]*'
strip_json() {   # FILE: metrics.jsonl, or stdout whose JSON lines get the same treatment
    perl -pe 'BEGIN { $k = $ENV{TIMEKEY} } s{,\s*"(?:$k)"\s*:\s*-?[0-9.eE+-]+}{}g; s{(\{\s*)"(?:$k)"\s*:\s*-?[0-9.eE+-]+\s*,?\s*}{$1}g' "$1"
}
strip_stdout() {   # FILE: progress lines with rates, durations, ETA, memory masked
    strip_json "$1" | perl -pe 's{[0-9.]+ tok/s}{# tok/s}g; s{ETA [0-9.]+ ?[smh]?}{ETA #}g; s{\b[0-9]+(\.[0-9]+)? ?(s|ms)\b}{# $2}g;
        s{\((?:gen|[a-z]+) [0-9.]+(?:, [a-z_]+ [0-9.]+)*\)}{(times)}g; s{[0-9.]+ (MiB|GiB|MB|GB)\b}{# $1}g; s{[0-9.]+ samples/s}{# samples/s}g'
}
check_stripped() {   # FILE (stripped): JSON lines parse and hold no time key
    { grep '^{' "$1" || true; } | jq --arg k "^($TIMEKEY)\$" 'select(keys | map(test($k)) | any) | halt_error(1)' > /dev/null ||
        { echo "behaviour: $1: a time field survived normalisation, or a JSON line no longer parses" >&2; exit 2; }
}
same_after() {   # KIND B A: normalise both (KIND json | stdout), then compare byte for byte
    local n="$WORK/norm" x
    mkdir -p "$n"; x="$n/$(echo "$2" | md5sum | cut -c1-12)"
    "strip_$1" "$2" > "$x.b" || { echo "behaviour: normalising $2 failed" >&2; exit 2; }
    "strip_$1" "$3" > "$x.a" || { echo "behaviour: normalising $3 failed" >&2; exit 2; }
    check_stripped "$x.b"; check_stripped "$x.a"
    cmp -s "$x.b" "$x.a"
}

run_all() {   # BIN DIR
    local bin=$1 dir=$2 c rc
    for c in $CASES; do
        rc=0
        (cd "$dir" && case_run "$c" "$bin") > "$dir/$c.stdout" 2> "$dir/$c.stderr" || rc=$?
        echo "$rc" > "$dir/$c.rc"
    done
}

allowed() { [[ ",${ALLOW// /,}," == *",$1,"* ]]; }
for a in ${ALLOW//,/ }; do [[ " $CASES " == *" $a "* ]] || echo "behaviour: warning: --allow-diff/ALLOW_DIFF names no case: $a" >&2; done

echo "behaviour: before $BEFORE, after $AFTER, in $WORK"
run_all "$BEFORE" "$WORK/before"
run_all "$AFTER" "$WORK/after"

n_same=0 n_diff=0 n_allowed=0 n_broken=0 bad_cases=""
for c in $CASES; do
    B="$WORK/before" A="$WORK/after"
    rb=$(cat "$B/$c.rc") ra=$(cat "$A/$c.rc")
    diffs=()
    [ "$rb" = "$ra" ] || diffs+=("exit code $rb vs $ra")
    same_after stdout "$B/$c.stdout" "$A/$c.stdout" || diffs+=("stdout")
    if [ -d "$B/$c" ] || [ -d "$A/$c" ]; then
        while read -r f; do
            if [ ! -e "$B/$c/$f" ]; then diffs+=("$c/$f (only after)"); continue; fi
            if [ ! -e "$A/$c/$f" ]; then diffs+=("$c/$f (only before)"); continue; fi
            case $f in
                *metrics.jsonl) same_after json "$B/$c/$f" "$A/$c/$f" || diffs+=("$c/$f") ;;
                *) cmp -s "$B/$c/$f" "$A/$c/$f" || diffs+=("$c/$f") ;;
            esac
        done < <(for d in "$B/$c" "$A/$c"; do if [ -d "$d" ]; then (cd "$d" && find . -type f -printf '%P\n'); fi; done | sort -u)
    fi
    if [ ${#diffs[@]} -eq 0 ] && [ "$rb" != 0 ]; then
        printf 'BROKEN %s: exit %s with both binaries (see %s.stderr)\n' "$c" "$rb" "$B/$c"; n_broken=$((n_broken + 1)); bad_cases="$bad_cases $c"
    elif [ ${#diffs[@]} -eq 0 ]; then
        printf 'same   %-12s [exit %s/%s]\n' "$c" "$rb" "$ra"; n_same=$((n_same + 1))
    elif allowed "$c"; then
        for d in "${diffs[@]}"; do printf 'DIFF   %s: %s (allowed)\n' "$c" "$d"; done; n_allowed=$((n_allowed + 1))
    else
        for d in "${diffs[@]}"; do printf 'DIFF   %s: %s\n' "$c" "$d"; done; n_diff=$((n_diff + 1)); bad_cases="$bad_cases $c"
    fi
done
n=$(wc -w <<< "$CASES")
echo "behaviour: $n cases: $n_same same, $n_diff differ, $n_allowed differ as allowed${ALLOW:+ (${ALLOW#,})}, $n_broken broken;" \
     "$(( $(date +%s) - t0 )) s; outputs in $WORK${bad_cases:+; failing:$bad_cases}"
[ "$n_diff" -eq 0 ] && [ "$n_broken" -eq 0 ]
