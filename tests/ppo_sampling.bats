#!/usr/bin/env bats
# ppo with --top-k / --top-p / --min-p trains the policy that sampled: the truncated, renormalised
# distribution. The rollout's logprob of a token is its logprob under the kept set it was drawn from
# (generate/engine.c with EngineConfig.truncated_lp), and the training forward recomputes the same kept
# set from the same logits (train/grad.c, LossHook.truncate), both by generate/sampler.c
# sampler_truncate. Checked: the kept set against transformers' warpers (test_sampler), rollout ==
# training bit for bit at every layout and after an optimizer step (test_exact), the training
# logprobs, entropy and every gradient against torch autograd of the truncated log-softmax
# (test_grad), and ppo itself: --top-k 1 makes every logprob exactly 0; with --actor-lr 0 the ratio is
# exactly 1 on every mini-batch of every epoch at tp 1 and tp 2; the rollout logprobs are transformers'
# truncated ones (check_truncated_logprobs.py); --resume stays bit for bit; bad options are one line.
# The rollout and training logprobs are read from --dump-rollouts FILE (rlhf/ppo_dump.h).
load helpers

TS="$ROOT/build/tests/test_sampler"
TE="$ROOT/build/tests/test_exact"
TG="$ROOT/build/tests/test_grad"
CHECK_TRUNC="$FIX/ppo/check_truncated_logprobs.py"

@test "sampler_truncate: transformers' kept set on every processor case without penalties, the raw logits' bits kept" {
    run "$TS" fixtures "$FIX/sampler/cases.json"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: sampler_truncate keeps transformers' kept set with the raw bits on 19 cases"* ]]
}

@test "truncated logprobs: generation == training bit for bit at 1x1, tp 3 (padded vocab), tp 2 x pp 2 (1F1B), also after an optimizer step; top-k 1 gives exactly 0" {
    d="$BATS_TEST_TMPDIR/rand12"
    "$TANDEM" convert --from random --shape 96,120,4,12,12,250,64 --out "$d" 2>/dev/null
    export TANDEM_TEST_TEMPERATURE=0.7
    for tr in 20,0.9,0.05 1,1,0; do
        export TANDEM_TEST_TRUNCATE=$tr
        run timeout 60 "$TE" "$d"
        echo "$output"
        [ "$status" -eq 0 ]
        [[ "$output" == *"ok: exact tp=1 pp=1 dp=1 T=0.7 truncated"* ]]
        for l in "3 3 1" "4 2 2"; do
            set -- $l
            run_ranks 120 "$1" -x TANDEM_TEST_TEMPERATURE -x TANDEM_TEST_TRUNCATE "$TE" "$d" "$2" "$3"
            echo "$output"
            [ "$status" -eq 0 ]
            [ "$(grep -c "ok: exact tp=$2 pp=$3 dp=1 T=0.7 truncated" <<<"$output")" -eq $(($1 / $3)) ]
        done
    done
    # the last runs were top-k 1: every logprob exactly 0; top-k 20 / top-p 0.9 / min-p 0.05 left none at 0
    [ "$(grep -c ': 80 of 80 logprobs exactly 0' <<<"$output")" -eq 2 ]
    run timeout 60 env TANDEM_TEST_TRUNCATE=20,0.9,0.05 "$TE" "$d"
    [[ "$output" == *": 0 of 80 logprobs exactly 0"* ]]
}

@test "truncated policy's training step vs torch autograd (REINFORCE + entropy bonus at T 0.7, top-k 20, top-p 0.8, min-p 0.2): logprobs, loss, every gradient, 1x1 and tp 2 x pp 2 1F1B; the full softmax fails it" {
    fx="$FIX/hook/llama_gqa_reinforce_truncated.json"
    run timeout 60 "$TG" "$FIX/models/llama_gqa" "$fx"
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q "logprobs at the temperature (25) vs torch" <<<"$output"
    [[ "$output" == *"ok: grad loss, 21 gradient tensors"* ]]
    run_ranks 120 4 "$TG" "$FIX/models/llama_gqa" "$fx" 2 2 1f1b
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '1f1b ok: grad' <<<"$output")" -eq 4 ]
    jq -c 'del(.truncate)' "$fx" > "$BATS_TEST_TMPDIR/full.json"
    run timeout 60 "$TG" "$FIX/models/llama_gqa" "$BATS_TEST_TMPDIR/full.json"
    [ "$status" -ne 0 ]
    grep -q "logprobs at the temperature (25) vs torch: .* FAIL" <<<"$output"
}

@test "ppo --top-k 1 at temperature 0.8: every rollout logprob is exactly 0, the training logprobs equal them on every token, the entropy is 0" {
    need_story
    out="$BATS_TEST_TMPDIR/k1"
    # one mini-batch: rollout_logprob_diff_max compares every token of the step
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" \
        --dump-rollouts "$out.dump" --out "$out" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 4 --max-new-tokens 16 --steps 2 \
        --kl-coef 0 --actor-lr 3e-4 --temperature 0.8 --top-k 1
    [ "$status" -eq 0 ]
    [ "$(jq -s 'length' "$out.dump")" -eq 32 ]
    [ "$(jq -s -c '[.[].behaviour_logprobs[]] | unique' "$out.dump")" = "[0]" ]
    [ "$(jq -s -c '[.[].training_logprobs[]] | unique' "$out.dump")" = "[0]" ]
    [ "$(jq -s -c '[.[].behaviour_logprobs | length] | add' "$out.dump")" -eq "$(jq -s -c '[.[] | .response_ids | length] | add' "$out.dump")" ]
    [ "$(jq -s -c 'map([.rollout_logprob_diff_max, .["actor/entropy"], .["actor/ppo_kl"]]) | flatten | unique' "$out/metrics.jsonl")" = "[0]" ]
}

# ratio_one OPTS...: ppo at --actor-lr 0 (2 mini-batches x 2 epochs) at tp 1 and tp 2 with OPTS: the
# ratio is exactly 1 everywhere, the rollout logprobs have the same bits at both, and they are
# transformers' truncated ones
ratio_one() {
    local A=(--actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2
             --rollout-batch-size 4 --max-new-tokens 16 --steps 1 --kl-coef 0.01 --kl-loss-coef 0.01 --entropy-coef 0.01
             --actor-lr 0 --temperature 0.8 --mini-batch-size 4 --ppo-epochs 2 "$@")
    local o="$BATS_TEST_TMPDIR/r1" t="$BATS_TEST_TMPDIR/r2"
    rm -rf "$o" "$t" "$o.dump" "$t.dump"
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$o" --dump-rollouts "$o.dump"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --out "$t" --actor-tp 2 --dump-rollouts "$t.dump"
    [ "$status" -eq 0 ]
    for d in "$o" "$t"; do
        # pg_clipfrac and ppo_kl are over every mini-batch of both epochs: exactly 0 only if every ratio is 1
        [ "$(jq -s -c 'map([.rollout_logprob_diff_max, .["actor/ppo_kl"], .["actor/pg_clipfrac"], .["actor/pg_clipfrac_lower"]]) | flatten | unique' "$d/metrics.jsonl")" = "[0]" ]
        # the KL is the truncated actor's to the reference's full softmax: -log(kept mass) > 0 per token
        # at lr 0 (0 without truncation: the actor is the reference)
        jq -s -e 'map(.["actor/kl"] > 0 and .["actor/entropy"] > 0) | all' "$d/metrics.jsonl"
    done
    cmp "$o.dump" "$t.dump"
    need_hfpy
    local k=0 p=1 m=0
    while [ $# -gt 0 ]; do case $1 in --top-k) k=$2;; --top-p) p=$2;; --min-p) m=$2;; esac; shift 2; done
    run timeout 120 "$HFPY" "$CHECK_TRUNC" "$STORIES" "$o.dump" 0.8 "$k" "$p" "$m"
    echo "$output" >&3
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "ok: truncated logprobs match transformers' warpers" ]]
}

@test "ppo --top-k 20, --actor-lr 0: ratio exactly 1 everywhere at tp 1 and tp 2; rollout logprobs = transformers' truncated ones" {
    need_story
    ratio_one --top-k 20
}

@test "ppo --top-p 0.9, --actor-lr 0: ratio exactly 1 everywhere at tp 1 and tp 2; rollout logprobs = transformers' truncated ones" {
    need_story
    ratio_one --top-p 0.9
}

@test "ppo --min-p 0.1, --actor-lr 0: ratio exactly 1 everywhere at tp 1 and tp 2; rollout logprobs = transformers' truncated ones" {
    need_story
    ratio_one --min-p 0.1
}

@test "ppo with --top-k 20 --top-p 0.9 --min-p 0.05: 4 steps straight == 2 steps, stop, resume 2 more (metrics and weights bit for bit)" {
    need_story
    A=(--actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 4
       --max-new-tokens 16 --steps 4 --kl-coef 0.01 --actor-lr 3e-4 --temperature 0.8 --top-k 20 --top-p 0.9 --min-p 0.05
       --mini-batch-size 4)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/straight"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/straight/metrics.jsonl")" = "[0]" ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --resume "$BATS_TEST_TMPDIR/split/checkpoint-2"
    [ "$status" -eq 0 ]
    [ "$(jq -s length "$BATS_TEST_TMPDIR/split/metrics.jsonl")" -eq 4 ]
    diff <(numbers "$BATS_TEST_TMPDIR/straight/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/split/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/straight/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/split/checkpoint-4/actor/*.safetensors)
}

@test "ppo: --min-p outside [0, 1], a greedy temperature with truncation, bad --top-k / --top-p, a negative --actor-lr: one line each, nothing written" {
    need_story
    A=(--actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --steps 1 --out "$BATS_TEST_TMPDIR/x")
    run_one_line "tandem: --min-p 1.5: must be in [0, 1] (0 = off)" "$TANDEM" ppo "${A[@]}" --min-p 1.5
    run_one_line "tandem: --min-p -0.1: must be in [0, 1] (0 = off)" "$TANDEM" ppo "${A[@]}" --min-p -0.1
    run_one_line "tandem: --temperature 1e-06: below 1e-5 sampling is greedy (argmax), so --top-k / --top-p / --min-p define no truncated policy; raise it" \
        "$TANDEM" ppo "${A[@]}" --temperature 1e-6 --top-k 5
    run_one_line "tandem: ppo: top_k must be >= 0 (0 = off), got -1" "$TANDEM" ppo "${A[@]}" --top-k -1
    run_one_line "tandem: ppo: top_p must be in (0, 1], got 0" "$TANDEM" ppo "${A[@]}" --top-p 0
    run_one_line "tandem: ppo: --actor-lr must be >= 0 and --critic-lr > 0" "$TANDEM" ppo "${A[@]}" --actor-lr -1
    [ ! -e "$BATS_TEST_TMPDIR/x" ]
}
