#!/usr/bin/env bats
# The training step's loss hook with losses other than cross-entropy, and the score head, against
# PyTorch autograd through HF transformers (fixtures by tests/fixtures/hook/make_hook_fixtures.py;
# checker tests/test_grad.c, tolerances explained there): a REINFORCE-style -w A logprob at
# temperature 0.7 on two causal LMs, and 0.5 w (value - R)^2 on score-head values (every position,
# and the last token only: a reward model's score, also against transformers' pooled
# *ForSequenceClassification output) for Llama, Qwen2 (q/k/v bias) and Mistral (sliding window).
# Then score models saved by Tandem load in transformers and score the same (check_hf_score.py).
# The preference losses (rlhf/pref_loss.c's hooks: Bradley–Terry on score models, DPO sigmoid / IPO
# on causal LMs, two pairs per batch) the same way (fixtures by make_pref_fixtures.py).
load helpers

TG="$ROOT/build/tests/test_grad"
TC="$ROOT/build/tests/test_checkpoint"

# hook_run FIXTURE MODEL NP [TP PP [1f1b]]: every rank prints its ok line
hook_run() {
    local fx=$1 model=$2 np=$3; shift 3
    if [ "$np" -eq 1 ]; then
        run timeout 60 "$TG" "$FIX/models/$model" "$FIX/hook/$fx.json"
    else
        run_ranks 120 "$np" "$TG" "$FIX/models/$model" "$FIX/hook/$fx.json" "$@"
    fi
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: grad' <<<"$output")" -eq "$np" ]
    ! grep -q FAIL <<<"$output"
}

@test "hook 1x1: REINFORCE-style loss at temperature 0.7 (llama_gqa, qwen2_bias): logprobs, loss, every gradient vs torch" {
    hook_run llama_gqa_reinforce llama_gqa 1
    grep -q "logprobs at the temperature (25) vs torch" <<<"$output"
    hook_run qwen2_bias_reinforce qwen2_bias 1
}

@test "entropy bonus (PPO's): -c w H through every logit at temperature 0.7, 1x1 and tp=2 x pp=2 1F1B, vs torch; without it the same fixture fails" {
    hook_run llama_gqa_reinforce_entropy llama_gqa 1
    hook_run llama_gqa_reinforce_entropy llama_gqa 4 2 2 1f1b
    jq -c '.entropy_coef = 0' "$FIX/hook/llama_gqa_reinforce_entropy.json" > "$BATS_TEST_TMPDIR/none.json"
    run timeout 60 "$TG" "$FIX/models/llama_gqa" "$BATS_TEST_TMPDIR/none.json"
    [ "$status" -ne 0 ]
}

@test "hook 1x1: squared error on score-head values at every position (a critic's loss)" {
    hook_run llama_score_values llama_score 1
    grep -q "values (25) vs torch" <<<"$output"
}

@test "score head 1x1: last-token scores equal transformers' pooled scores, head and backbone gradients equal torch's" {
    for m in llama_score qwen2_score mistral_score; do
        hook_run $m $m 1
        [ "$(grep -c "score at its last token" <<<"$output")" -eq 2 ]
        grep -q "score.weight" <<<"$output"
    done
}

@test "hook tp=2 x pp=2: REINFORCE and value losses, each rank's shards vs torch's slices; 1F1B micro-batches too" {
    hook_run llama_gqa_reinforce llama_gqa 4 2 2
    hook_run qwen2_bias_reinforce qwen2_bias 4 2 2 1f1b
    hook_run llama_score_values llama_score 4 2 2
    hook_run mistral_score mistral_score 4 2 2 1f1b
    hook_run qwen2_score qwen2_score 2 2 1
}

@test "preference losses alone: Bradley–Terry, DPO sigmoid with label smoothing and IPO equal torch float64 autograd, |x| up to 800" {
    run "$ROOT/build/tests/test_pref_loss" "$FIX/hook/pref_scalars.json"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: 12 preference-loss cases match torch"* ]]
}

@test "preference losses through the model 1x1: Bradley–Terry on score models (rewards, loss, every gradient), DPO sigmoid and IPO on causal LMs, vs torch" {
    hook_run llama_score_bt llama_score 1
    grep -q "rewards (42) vs torch" <<<"$output"
    hook_run qwen2_score_bt qwen2_score 1
    hook_run llama_gqa_dpo llama_gqa 1
    grep -q "response logprobs (42) vs torch" <<<"$output"
    hook_run qwen2_bias_ipo qwen2_bias 1
}

@test "preference losses through the model at tp=2 x pp=2: each rank's shards vs torch's slices; 1F1B with each pair its own micro-batch" {
    hook_run llama_score_bt llama_score 4 2 2
    hook_run qwen2_score_bt qwen2_score 4 2 2 1f1b
    hook_run llama_gqa_dpo llama_gqa 4 2 2
    hook_run llama_gqa_dpo llama_gqa 4 2 2 1f1b
    hook_run qwen2_bias_ipo qwen2_bias 4 2 2 1f1b
}

@test "score export: a score model saved at tp=2 x pp=2 loads in transformers as Qwen2ForSequenceClassification, same scores" {
    need_hfpy
    out="$BATS_TEST_TMPDIR/q2s"
    run timeout 60 $MPIRUN 4 "$TC" save-score "$FIX/models/qwen2_score" "$out" "$out.json" 2 2
    echo "$output"
    [ "$status" -eq 0 ]
    run timeout 120 "$HFPY" "$FIX/check_hf_score.py" "$out" "$out.json"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: hf score"* ]]
}

@test "score head on a causal LM: a new seeded head, exported as LlamaForSequenceClassification (no lm_head), same scores in transformers" {
    need_hfpy
    out="$BATS_TEST_TMPDIR/llama_new_score"
    run timeout 60 "$TC" save-score "$FIX/models/llama_gqa" "$out" "$out.json"
    echo "$output"
    [ "$status" -eq 0 ]
    run jq -r '.architectures[0], .num_labels, .pad_token_id, .tie_word_embeddings' "$out/config.json"
    [ "$output" = "$(printf 'LlamaForSequenceClassification\n1\n0\nfalse')" ]   # pad: 0, not EOS (transformers pools before the first pad)
    run timeout 120 "$HFPY" "$FIX/check_hf_score.py" "$out" "$out.json"
    echo "$output"
    [ "$status" -eq 0 ]
    # the same seed gives the same head
    run timeout 60 "$TC" save-score "$FIX/models/llama_gqa" "$out-again" "$out-again.json"
    cmp "$out.json" "$out-again.json"
}

@test "score head errors: num_labels other than 1 is one clear error naming the key" {
    d="$BATS_TEST_TMPDIR/two_labels"
    cp -r "$FIX/models/llama_score" "$d"
    jq '.num_labels = 2 | del(.id2label, .label2id)' "$FIX/models/llama_score/config.json" > "$d/config.json"
    run "$TC" save-score "$d" "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/out.json"
    echo "$output"
    [ "$status" -ne 0 ]
    [[ "$output" == "tandem: $d/config.json: num_labels 2: only 1 (a scalar reward or value head) is supported" ]]
    [ ! -e "$BATS_TEST_TMPDIR/out" ]
}
