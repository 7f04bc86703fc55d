#!/usr/bin/env bats
# The differentiable forward and the full-model backward (train/grad.c) against PyTorch autograd
# through HF transformers (fixtures by tests/fixtures/grad/make_grad_fixtures.py): a packed batch of
# two sequences with a masked prompt, loss = sum of weight * CE(next token). Each run checks, on
# every rank: train_forward's logits bit-identical to model_forward's (last stage), the loss, every
# gradient shard the rank owns against the same slice of torch's gradient (within 1e-5 of
# max(1, max|ref|), see tests/test_grad.c), zero gradient on padded vocab rows, and replicated
# gradients (norms; k/v of a kv head shared by several tp ranks) bit-identical across their ranks.
load helpers

TG="$ROOT/build/tests/test_grad"

# grad_run MODEL TP PP: runs test_grad on TP*PP ranks; every rank must print its ok line
grad_run() {
    local model=$1 tp=$2 pp=$3 n=$(($2 * $3))
    if [ "$n" -eq 1 ]; then
        run timeout 60 "$TG" "$FIX/models/$model" "$FIX/grad/$model.json"
    else
        run_ranks 120 "$n" "$TG" "$FIX/models/$model" "$FIX/grad/$model.json" "$tp" "$pp"
    fi
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: grad' <<<"$output")" -eq "$n" ]
    [ "$(grep -c 'bit-identical to model_forward' <<<"$output")" -eq "$tp" ]
}

@test "grad 1x1 llama_gqa: loss and every gradient match torch autograd (GQA), logits bit-identical to model_forward" {
    grad_run llama_gqa 1 1
}

@test "grad 1x1 qwen2_bias: q/k/v bias gradients, tied embedding gets both uses, bf16 weights" {
    grad_run qwen2_bias 1 1
}

@test "grad 1x1 mistral_swa: sliding-window attention backward, head_dim != hidden / heads" {
    grad_run mistral_swa 1 1
}

@test "grad 1x1 llama_mqa: one kv head shared by every query head" {
    grad_run llama_mqa 1 1
}

@test "grad 1x1 llama_odd_vocab: vocab 97" {
    grad_run llama_odd_vocab 1 1
}

@test "grad 1x1 qwen2_swa: a window on some layers only (max_window_layers), q/k/v bias" {
    grad_run qwen2_swa 1 1
}

@test "grad qwen3_tiny (transformers 4.51's Qwen3ForCausalLM): q_norm / k_norm per head before RoPE, head_dim 32 != 64 / 4, tied, at 1x1, tp 2 x pp 2 and tp 4 (a kv head on two ranks)" {
    grad_run qwen3_tiny 1 1
    grad_run qwen3_tiny 2 2
    grad_run qwen3_tiny 4 1
}

@test "grad 1x1 llama3_rope and llama_linear_rope: scaled RoPE frequencies in the backward" {
    grad_run llama3_rope 1 1
    grad_run llama_linear_rope 1 1
}

@test "grad tp=2 x pp=2: qwen2_swa, llama3_rope, llama_linear_rope" {
    for m in qwen2_swa llama3_rope llama_linear_rope; do grad_run $m 2 2; done
}

@test "grad tp=2: every fixture, each rank's shards match torch's slices (conjugate copy/reduce all-reduces)" {
    for m in llama_gqa qwen2_bias mistral_swa llama_mqa llama_odd_vocab; do grad_run $m 2 1; done
}

@test "grad tp=4 llama_mqa: one kv head replicated on 4 ranks, k/v gradients summed over the replicas and identical" {
    grad_run llama_mqa 4 1
}

@test "grad tp=4 llama_odd_vocab and qwen2_bias: padded vocab rows (97 -> 100) get zero gradient; tied vocab shards" {
    grad_run llama_odd_vocab 4 1
    grad_run qwen2_bias 4 1
}

@test "grad pp=2: d(x) sent back between stages; tied embedding summed across the first and last stage" {
    grad_run llama_gqa 1 2
    grad_run qwen2_bias 1 2
}

@test "grad tp=2 x pp=2: mistral_swa and llama_mqa" {
    grad_run mistral_swa 2 2
    grad_run llama_mqa 2 2
}

@test "grad: fixture generators are present and the fixtures are small (< 2.5 MB together)" {
    [ -f "$FIX/grad/make_grad_fixtures.py" ] && [ -f "$FIX/qwen3/make_qwen3_refs.py" ]   # qwen3_tiny.json: the latter
    [ "$(cat "$FIX"/grad/*.json | wc -c)" -lt 2500000 ]   # nine models, 2.0 MB (qwen3_tiny's hidden 64: 0.5 MB)
}

# 1F1B: the same batch as one micro-batch per sequence through train/schedule.c's 1F1B order;
# gradients accumulate per micro-batch, so only summation order differs (same 1e-5 tolerance).
grad_1f1b() {
    local model=$1 tp=$2 pp=$3 n=$(($2 * $3))
    run_ranks 120 "$n" "$TG" "$FIX/models/$model" "$FIX/grad/$model.json" "$tp" "$pp" 1f1b
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '1f1b ok: grad' <<<"$output")" -eq "$n" ]
}

@test "grad 1F1B: micro-batches through the pipeline schedule match torch (pp=2, tp=2 x pp=2, tied)" {
    grad_1f1b llama_gqa 1 2
    grad_1f1b qwen2_bias 1 2
    grad_1f1b mistral_swa 2 2
    run "$TG" "$FIX/models/llama_mqa" "$FIX/grad/llama_mqa.json" 1 1 1f1b
    [ "$status" -eq 0 ]
}

@test "grad --recompute full: only layer inputs kept, backward re-runs each layer: gradients bit-identical at 1x1 and tp2 x pp2; with 1F1B within 1e-5 of torch" {
    export TANDEM_TEST_RECOMPUTE=1
    grad_run llama_gqa 1 1
    [ "$(grep -c 'recompute: gradients and loss bit-identical' <<<"$output")" -eq 1 ]
    grad_run mistral_swa 2 2
    [ "$(grep -c 'recompute: gradients and loss bit-identical' <<<"$output")" -eq 4 ]
    grad_1f1b qwen2_bias 1 2
}
