#!/usr/bin/env bash
# The whole RLHF pipeline on CPU in about a minute: SFT -> preference pairs from a rule over the SFT
# model's own samples -> reward model -> PPO with that reward model, then the rule's score on
# held-out prompts before and after (and the KL to the reference at the end).
#   bash examples/rlhf_pipeline.sh [OUT]        (default runs/pipeline; run from anywhere)
# The rule: a story completion that contains the word "happy" is better (tests/fixtures/ppo/happy_reward.py).
# Prompts: the first 3 words of TinyStories paragraphs; the PPO prompts and the held-out prompts are
# the story-pair fixtures' (tests/fixtures/ppo/story_prompts_train.jsonl, tests/fixtures/pref/story_prompts_val.jsonl),
# which the preference pairs here never use.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/pipeline}
T=bin/tandem
BASE=../shared/assets/models/stories260K-hf
TEXT=../shared/assets/data/pretrain/tinystories_train_head.txt
rm -rf "$OUT"; mkdir -p "$OUT"
rate() {   # the rule's mean over 4 samples of each held-out prompt
    jq -c 'range(0; 4) as $j | {prompt, seed: (70000 + $j)}' tests/fixtures/pref/story_prompts_val.jsonl > "$OUT/heldout.jsonl"
    $T generate --model "$1" --input "$OUT/heldout.jsonl" --output "$OUT/heldout.out" --max-new-tokens 48 \
        2>"$OUT/heldout.log" || { cat "$OUT/heldout.log" >&2; exit 1; }
    jq -s '[.[].completion | test("\\bhappy\\b"; "i")] | map(if . then 1 else 0 end) | add / length' "$OUT/heldout.out"
}

echo "== 1. SFT: TinyStories paragraphs (lines 1200-1700) as prompt (3 words) -> the rest"
sed -n 1200,1700p "$TEXT" | awk 'NF >= 8' | jq -Rc 'split(" ") | {prompt: (.[0:3] | join(" ")), response: (" " + (.[3:] | join(" ")))}' > "$OUT/sft.jsonl"
$T sft --model "$BASE" --data "$OUT/sft.jsonl" --out "$OUT/sft" --seq-len 128 --batch-size 8 --max-steps 30 --lr 1e-4 2>&1 | tail -1
SFT="$OUT/sft/checkpoint-30"

echo "== 2. preference pairs: 16 samples of 150 prompts from the SFT model, labelled by the rule"
# (no `head` here: under pipefail, the writer it cuts off dies of SIGPIPE and fails the script at random)
sed -n 1800,2500p "$TEXT" | awk 'NF >= 8 { k = $1 " " $2 " " $3; if (!seen[k]++ && n++ < 150) print k }' |
    jq -Rc --argjson k 16 '. as $p | range(0; $k) as $j | {prompt: $p, seed: (1000 * $j + 7)}' > "$OUT/samples_in.jsonl"
$T generate --model "$SFT" --input "$OUT/samples_in.jsonl" --output "$OUT/samples.jsonl" --max-new-tokens 48 2>"$OUT/samples.log" ||
    { cat "$OUT/samples.log" >&2; exit 1; }
jq -sc 'group_by(.prompt)[] | (map(select(.completion | test("\\bhappy\\b"; "i")))) as $c
        | (map(select(.completion | test("\\bhappy\\b"; "i") | not))) as $r
        | range(0; [($c | length), ($r | length)] | min) as $i
        | {prompt: $c[$i].prompt, chosen: $c[$i].completion, rejected: $r[$i].completion}' "$OUT/samples.jsonl" > "$OUT/pairs.jsonl"
echo "$(wc -l < "$OUT/pairs.jsonl") pairs"

echo "== 3. reward model from the SFT checkpoint"
$T rm --model "$SFT" --data "$OUT/pairs.jsonl" --out "$OUT/rm" --seq-len 64 --batch-size 8 --lr 3e-3 --epochs 3 2>&1 | grep -E "^eval|trained" || true
RM=$(ls -d "$OUT"/rm/checkpoint-* | sort -t- -k2 -n | tail -1)

echo "== 4. PPO: actor and reference = the SFT model, critic and reward = the reward model"
$T ppo --actor "$SFT" --critic "$RM" --reward "$RM" --prompts tests/fixtures/ppo/story_prompts_train.jsonl --out "$OUT/ppo" \
    --rollout-batch-size 16 --max-new-tokens 48 --steps 20 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --log-every 10 2>&1 |
    grep -E "^step|^ppo:"

before=$(rate "$SFT"); after=$(rate "$OUT/ppo/checkpoint-20/actor")
kl=$(jq -s '.[-1]["actor/kl"]' "$OUT/ppo/metrics.jsonl")
echo "held-out rule score: SFT $before -> PPO $after; KL to the reference at the end $kl"
