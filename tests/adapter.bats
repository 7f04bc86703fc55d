#!/usr/bin/env bats
# --adapter DIR (runtime/adapter.c): PEFT LoRA adapters merged into the base weights after loading.
# eval against PEFT's own logprobs (tests/fixtures/make_adapter.py: PeftModel on the base, unmerged)
# at 1x1 and under tp / pp, generate's greedy text, rm --score with a sequence-classification
# adapter, and one line per bad adapter.
load helpers

A="$FIX/adapters"
LORA="$A/llama_gqa_lora"          # all-linear, r 4, lora_alpha 8 on models/llama_gqa
RSLORA="$A/mistral_swa_rslora"    # q/v/down_proj, r 8, lora_alpha 16, use_rslora on models/mistral_swa

# Tolerance 1e-4 on |logprob|, eval.bats' for plain models against HF (fp32 both sides). Tandem
# merges, W + scale * (B A), then runs its usual forward; PEFT computes base(x) + B(A(x)) * scale
# unmerged. The two differ by fp32 rounding only: the merged weight is rounded once per element
# (~1 ulp of W), where PEFT rounds x W^T, A x and B(A x) separately, and the sums run in other orders,
# so the logprobs move by a few ulp more than the base model's own parity (measured max 6.7e-6 for
# llama_gqa_lora, 6.0e-6 for mistral_swa_rslora at every layout; 2.6e-6 and 5.7e-6 for the bases).
adapter_parity() { # MODEL ADAPTER REF [extra args]
    run "$TANDEM" eval --dtype fp32 --model "$1" --adapter "$2" --reference "$3" --max-logprob-diff 1e-4 --quiet "${@:4}"
    echo "$output"
    [ "$status" -eq 0 ]
    echo "$output" | tail -1 | jq -e '.greedy_mismatches == 0 and .greedy_tokens == 32 and .pass'
}

@test "adapter: eval --adapter matches PEFT's unmerged logprobs (<= 1e-4) and greedy; the base alone does not" {
    adapter_parity "$FIX/models/llama_gqa" "$LORA" "$FIX/refs/llama_gqa_lora.jsonl"
    adapter_parity "$FIX/models/mistral_swa" "$RSLORA" "$FIX/refs/mistral_swa_rslora.jsonl"
    # the merge reads and writes the weights through to_host / to_device only (a GPU's memory)
    adapter_parity "$FIX/models/llama_gqa" "$LORA" "$FIX/refs/llama_gqa_lora.jsonl" --device cpu-guarded
    # the adapters change the model: without them the same references fail by far
    run "$TANDEM" eval --dtype fp32 --model "$FIX/models/llama_gqa" --reference "$FIX/refs/llama_gqa_lora.jsonl" --quiet
    [ "$status" -eq 1 ]
    echo "$output" | grep '^{"records"' | jq -e '.max_abs_logprob_diff > 0.5'
}

@test "adapter: use_rslora scales by lora_alpha / sqrt(r): the same adapter read as plain LoRA fails" {
    cp -r "$RSLORA" "$BATS_TEST_TMPDIR/plain"
    jq '.use_rslora = false' "$RSLORA/adapter_config.json" > "$BATS_TEST_TMPDIR/plain/adapter_config.json"
    run "$TANDEM" eval --dtype fp32 --model "$FIX/models/mistral_swa" --adapter "$BATS_TEST_TMPDIR/plain" \
        --reference "$FIX/refs/mistral_swa_rslora.jsonl" --quiet
    echo "$output"
    [ "$status" -eq 1 ]
    echo "$output" | grep '^{"records"' | jq -e '.max_abs_logprob_diff > 0.01'
}

# Each layout merges the same bits (every element of B A is summed over the rank in one order,
# whichever rank holds it), so it reproduces the 1x1 run exactly (limit 0), as plain models do.
@test "adapter: tp 2, pp 2 and tp 2 x pp 2 match PEFT, and the 1x1 run exactly (fp32 and bf16)" {
    for pair in "llama_gqa $LORA llama_gqa_lora" "mistral_swa $RSLORA mistral_swa_rslora"; do
        set -- $pair
        m="$FIX/models/$1" ad="$2" ref="$FIX/refs/$3.jsonl"
        for dt in fp32 bf16; do
            one="$BATS_TEST_TMPDIR/$3.$dt.jsonl"
            "$TANDEM" eval --dtype $dt --model "$m" --adapter "$ad" --reference "$ref" --write-reference "$one" --quiet || true
            [ -s "$one" ]
            for l in "2 2 1" "2 1 2" "4 2 2"; do
                set -- $l
                if [ $dt = fp32 ]; then
                    run timeout 120 $MPIRUN $1 "$TANDEM" eval --dtype fp32 --model "$m" --adapter "$ad" --reference "$ref" \
                        --tp $2 --pp $3 --max-logprob-diff 1e-4 --quiet
                    echo "$m np=$1 tp=$2 pp=$3 vs PEFT: $output"
                    [ "$status" -eq 0 ]
                    echo "$output" | tail -1 | jq -e '.greedy_mismatches == 0 and .max_abs_logprob_diff < 1e-4'
                fi
                run timeout 120 $MPIRUN $1 "$TANDEM" eval --dtype $dt --model "$m" --adapter "$ad" --reference "$one" \
                    --tp $2 --pp $3 --max-logprob-diff 0 --quiet
                echo "$m $dt np=$1 tp=$2 pp=$3 vs 1x1: $output"
                echo "$output" | grep '^{"records"' | jq -e '.max_abs_logprob_diff == 0'
            done
        done
    done
}

@test "adapter: generate --adapter --greedy gives PEFT's greedy tokens (1x1 and tp 2 x pp 2)" {
    ref="$FIX/refs/llama_gqa_lora.jsonl"
    jq -c '{id, input_ids, max_new_tokens: (.greedy_ids | length)}' "$ref" > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --dtype fp32 --model "$FIX/models/llama_gqa" --adapter "$LORA" --input "$BATS_TEST_TMPDIR/p.jsonl" \
        --output "$BATS_TEST_TMPDIR/o1.jsonl" --greedy --ignore-eos 2>/dev/null
    diff <(jq -c '[.id, .greedy_ids]' "$ref") <(jq -c '[.id, .completion_ids]' "$BATS_TEST_TMPDIR/o1.jsonl")
    timeout 120 $MPIRUN 4 "$TANDEM" generate --dtype fp32 --model "$FIX/models/llama_gqa" --adapter "$LORA" --tp 2 --pp 2 \
        --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o4.jsonl" --greedy --ignore-eos 2>/dev/null
    diff <(jq -c '[.id, .greedy_ids]' "$ref") <(jq -c '[.id, .completion_ids]' "$BATS_TEST_TMPDIR/o4.jsonl")
}

@test "adapter: rm --score --adapter with a sequence-classification adapter gives the rewards of PEFT's merged model" {
    need_story
    need_hfpy
    # a causal-LM base: the adapter brings its score head (modules_to_save ["classifier", "score"])
    "$HFPY" "$FIX/make_adapter.py" --seq-cls "$STORIES" --out "$BATS_TEST_TMPDIR/cls" --merged "$BATS_TEST_TMPDIR/merged" 2>/dev/null
    jq -e '.task_type == "SEQ_CLS" and (.modules_to_save | index("score"))' "$BATS_TEST_TMPDIR/cls/adapter_config.json"
    printf '{"prompt": "Once upon a time", "response": " there was a cat."}\n{"text": "The dog ran to the park and played."}\n' \
        > "$BATS_TEST_TMPDIR/s.jsonl"
    for l in "1 1 1" "4 2 2"; do
        set -- $l
        timeout 120 $MPIRUN $1 "$TANDEM" rm --score --dtype fp32 --model "$STORIES" --adapter "$BATS_TEST_TMPDIR/cls" \
            --tp $2 --pp $3 --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/a$1.jsonl" 2>/dev/null
    done
    "$TANDEM" rm --score --dtype fp32 --model "$BATS_TEST_TMPDIR/merged" --input "$BATS_TEST_TMPDIR/s.jsonl" \
        --output "$BATS_TEST_TMPDIR/m.jsonl" 2>/dev/null
    # merged here and merged by PEFT round alike up to fp32 ulps; the rewards are O(1)
    paste -d' ' <(jq .reward "$BATS_TEST_TMPDIR/a1.jsonl") <(jq .reward "$BATS_TEST_TMPDIR/m.jsonl") \
        | awk '{ d = $1 - $2; if (d < 0) d = -d; print; if (d > 1e-4 || $1 == 0) bad = 1 } END { exit bad }'
    diff "$BATS_TEST_TMPDIR/a1.jsonl" "$BATS_TEST_TMPDIR/a4.jsonl"
    # the base alone is a causal LM: no reward model without the adapter's head
    run_one_line "a causal LM, not a reward model" "$TANDEM" rm --score --model "$STORIES" --input "$BATS_TEST_TMPDIR/s.jsonl" \
        --output "$BATS_TEST_TMPDIR/x.jsonl"
    # and such an adapter on an LM-head run names its score tensor
    run_one_line "tensor base_model.model.score.weight: a sequence-classification adapter's score head, but the base model is a causal LM" \
        "$TANDEM" eval --model "$STORIES" --adapter "$BATS_TEST_TMPDIR/cls" --reference "$FIX/refs/stories260K.jsonl"
}

# ---- bad adapters: one line naming the file and the field or tensor, non-zero exit ----------------

# bad_config NAME JQ: a copy of LORA whose adapter_config.json is edited by JQ
bad_config() {
    cp -r "$LORA" "$BATS_TEST_TMPDIR/$1"
    jq "$2" "$LORA/adapter_config.json" > "$BATS_TEST_TMPDIR/$1/adapter_config.json"
}
lora_eval() { # ADAPTER [extra]
    "$TANDEM" eval --model "$FIX/models/llama_gqa" --adapter "$1" --reference "$FIX/refs/llama_gqa_lora.jsonl" "${@:2}"
}

@test "adapter errors: missing directory or files" {
    run_one_line "tandem: --adapter $BATS_TEST_TMPDIR/none: not a directory" lora_eval "$BATS_TEST_TMPDIR/none"
    mkdir "$BATS_TEST_TMPDIR/empty"
    run_one_line "$BATS_TEST_TMPDIR/empty/adapter_config.json: not found (--adapter takes a PEFT adapter directory" \
        lora_eval "$BATS_TEST_TMPDIR/empty"
    cp "$LORA/adapter_config.json" "$BATS_TEST_TMPDIR/empty/"
    touch "$BATS_TEST_TMPDIR/empty/adapter_model.bin"
    run_one_line "$BATS_TEST_TMPDIR/empty/adapter_model.safetensors: not found (adapter_model.bin is a pickle" \
        lora_eval "$BATS_TEST_TMPDIR/empty"
    echo '{"r": ' > "$BATS_TEST_TMPDIR/empty/adapter_config.json"
    run_one_line "adapter_config.json: not a JSON object" lora_eval "$BATS_TEST_TMPDIR/empty"
}

@test "adapter errors: unsupported adapter_config.json fields are refused by name" {
    c=adapter_config.json
    bad_config dora '.use_dora = true'
    run_one_line "dora/$c: field \"use_dora\" is true: DoRA adapters are not supported" lora_eval "$BATS_TEST_TMPDIR/dora"
    bad_config bias '.bias = "lora_only"'
    run_one_line "bias/$c: field \"bias\" is lora_only: only \"none\" is supported" lora_eval "$BATS_TEST_TMPDIR/bias"
    bad_config gpt2 '.target_modules = ["c_attn", "q_proj"]'
    run_one_line "gpt2/$c: field \"target_modules\" names c_attn: supported are the LLaMA-family projections" \
        lora_eval "$BATS_TEST_TMPDIR/gpt2"
    bad_config regex '.target_modules = ".*proj"'
    run_one_line "regex/$c: field \"target_modules\" is the pattern \".*proj\": patterns are not supported" \
        lora_eval "$BATS_TEST_TMPDIR/regex"
    bad_config save '.modules_to_save = ["lm_head"]'
    run_one_line "save/$c: field \"modules_to_save\" names lm_head" lora_eval "$BATS_TEST_TMPDIR/save"
    bad_config pattern '.rank_pattern = {"q_proj": 8}'
    run_one_line "pattern/$c: field \"rank_pattern\" is set: per-module ranks are not supported" lora_eval "$BATS_TEST_TMPDIR/pattern"
    bad_config fan '.fan_in_fan_out = true'
    run_one_line "fan/$c: field \"fan_in_fan_out\" is true" lora_eval "$BATS_TEST_TMPDIR/fan"
    bad_config ia3 '.peft_type = "IA3"'
    run_one_line "ia3/$c: field \"peft_type\" is IA3: only LORA adapters are supported" lora_eval "$BATS_TEST_TMPDIR/ia3"
    bad_config rank '.r = 8'
    run_one_line "rank/adapter_model.safetensors: tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight [4, 32]: rank 4, but adapter_config.json's field \"r\" is 8" \
        lora_eval "$BATS_TEST_TMPDIR/rank"
    # a lora_alpha past the range surfaced only as non-finite merged weights (or logits)
    bad_config alpha '.lora_alpha = 1e39'
    run_one_line "alpha/$c: field \"lora_alpha\" must be a number > 0 and <= 1e+06" lora_eval "$BATS_TEST_TMPDIR/alpha"
    bad_config fewer '.target_modules = ["q_proj", "k_proj"]'
    run_one_line "fewer/adapter_model.safetensors: tensor base_model.model.model.layers.0.mlp.down_proj.lora_A.weight: adapter_config.json's field \"target_modules\" does not name down_proj" \
        lora_eval "$BATS_TEST_TMPDIR/fewer"
}

@test "adapter errors: tensors: shape against the base, rank of A and B, unknown or missing module; every rank exits" {
    need_hfpy
    # copies of LORA with one tensor changed each (safetensors' own writer)
    for d in rank unknown layer missing; do cp -r "$LORA" "$BATS_TEST_TMPDIR/$d"; done
    "$HFPY" - "$BATS_TEST_TMPDIR" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
root, P = sys.argv[1], "base_model.model.model.layers."
def edit(d, f):
    p = f"{root}/{d}/adapter_model.safetensors"
    t = load_file(p)
    f(t)
    save_file(t, p, metadata={"format": "pt"})
edit("rank", lambda t: t.update({P + "1.self_attn.v_proj.lora_B.weight": t[P + "1.self_attn.v_proj.lora_B.weight"][:, :3].contiguous()}))
edit("unknown", lambda t: t.update({"base_model.model.lm_head.lora_A.weight": t[P + "0.self_attn.q_proj.lora_A.weight"].clone()}))
edit("layer", lambda t: t.update({P + "2.self_attn.q_proj.lora_A.weight": t[P + "0.self_attn.q_proj.lora_A.weight"].clone()}))
edit("missing", lambda t: t.pop(P + "1.mlp.up_proj.lora_B.weight"))
EOF
    st=adapter_model.safetensors P=base_model.model.model.layers.
    run_one_line "rank/$st: tensors ${P}1.self_attn.v_proj.lora_A.weight [4, 32] and ${P}1.self_attn.v_proj.lora_B.weight [16, 3]: ranks differ" \
        lora_eval "$BATS_TEST_TMPDIR/rank"
    run_one_line "unknown/$st: tensor base_model.model.lm_head.lora_A.weight: not a LoRA weight of a LLaMA-family projection" \
        lora_eval "$BATS_TEST_TMPDIR/unknown"
    run_one_line "layer/$st: tensor ${P}2.self_attn.q_proj.lora_A.weight: layer 2, but the base model has 2 layers" \
        lora_eval "$BATS_TEST_TMPDIR/layer"
    run_one_line "missing/$st: tensor ${P}1.mlp.up_proj.lora_B.weight missing (target_modules names up_proj)" \
        lora_eval "$BATS_TEST_TMPDIR/missing"
    # an adapter made for another base (mistral_swa: D 48, q_proj 64 x 48) on llama_gqa (D 32)
    run_one_line "mistral_swa_rslora/$st: tensor ${P}0.self_attn.q_proj.lora_A.weight has shape [8, 48], expected [8, 32]: the base model's q_proj.weight is [32, 32]" \
        lora_eval "$RSLORA"
    # several ranks: a bad tensor of the last stage's layer 1 is reported once, by rank 0, and every rank
    # exits (timeout: none is left waiting); the same for generate and rm --score
    run_one_line "rank/$st: tensors ${P}1.self_attn.v_proj.lora_A.weight [4, 32] and ${P}1.self_attn.v_proj.lora_B.weight [16, 3]: ranks differ" \
        timeout 60 $MPIRUN 4 "$TANDEM" eval --model "$FIX/models/llama_gqa" --adapter "$BATS_TEST_TMPDIR/rank" \
        --reference "$FIX/refs/llama_gqa_lora.jsonl" --tp 2 --pp 2
    echo '{"input_ids": [1, 5, 9]}' > "$BATS_TEST_TMPDIR/p.jsonl"
    run_one_line "missing/$st: tensor ${P}1.mlp.up_proj.lora_B.weight missing" \
        timeout 60 $MPIRUN 2 "$TANDEM" generate --model "$FIX/models/llama_gqa" --adapter "$BATS_TEST_TMPDIR/missing" --pp 2 \
        --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl"
    [ ! -e "$BATS_TEST_TMPDIR/o.jsonl" ]
    run_one_line "layer/$st: tensor ${P}2.self_attn.q_proj.lora_A.weight: layer 2" \
        timeout 60 $MPIRUN 2 "$TANDEM" rm --score --model "$FIX/models/llama_score" --adapter "$BATS_TEST_TMPDIR/layer" --tp 2 \
        --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/r.jsonl"
    # training commands do not take adapters (yet)
    run_one_line "--adapter: an inference option here (rm --score)" "$TANDEM" rm --model "$FIX/models/llama_gqa" --adapter "$LORA" \
        --data "$BATS_TEST_TMPDIR/p.jsonl" --out "$BATS_TEST_TMPDIR/rm"
}
