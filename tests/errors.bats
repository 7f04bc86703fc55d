#!/usr/bin/env bats
# Bad input is part of the interface: each case gives one clear "tandem: ..." line naming the file,
# key or flag, a non-zero exit, and (under mpirun) every rank exits: no hang.
load helpers

setup() {
    M="$BATS_TEST_TMPDIR/m"
    cp -r "$FIX/models/llama_gqa" "$M"
    REF="$FIX/refs/llama_gqa.jsonl"
}

# expect_error PATTERN: the last run failed and its tandem line matches PATTERN
expect_error() {
    echo "status=$status output=$output"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]  # not a timeout
    line=$(echo "$output" | grep '^tandem: ' | head -1)
    [[ "$line" == $1 ]]
    [ "$(echo "$output" | grep -c '^tandem: ')" -eq 1 ]
    [ "$output" = "$line" ]   # nothing else: no banner, no other rank's copy (mpirun -q, helpers.bash)
}

@test "errors: missing model directory" {
    run "$TANDEM" eval --model "$BATS_TEST_TMPDIR/nope" --reference "$REF"
    expect_error "*nope: model directory not found*"
}

@test "errors: missing config key" {
    sed -i '/"num_hidden_layers"/d' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*config.json: missing key \"num_hidden_layers\"*"
}

@test "errors: unsupported model_type and rope_scaling" {
    sed -i 's/"model_type": "llama"/"model_type": "gpt2"/' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*model_type \"gpt2\" is not supported*"
    cp "$FIX/models/llama_gqa/config.json" "$M/config.json"
    sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 2.0}/' "$M/config.json"
    grep -q yarn "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*rope_scaling type \"yarn\" is not supported*"
}

@test "errors: truncated safetensors" {
    size=$(stat -c %s "$M/model.safetensors")
    head -c $((size - 1000)) "$FIX/models/llama_gqa/model.safetensors" > "$M/model.safetensors"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*model.safetensors: tensor * ends past end of file (truncated download?)*"
    head -c 5 "$FIX/models/llama_gqa/model.safetensors" > "$M/model.safetensors"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*model.safetensors: file is 5 bytes*"
}

@test "errors: tensor shape mismatch with config.json" {
    sed -i -E 's/"intermediate_size": [0-9]+/"intermediate_size": 96/' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*tensor model.layers.0.mlp.gate_proj.weight has shape [[]64, 32[]], expected [[]96, 32[]] from config.json*"
}

@test "errors: config.json sizes beyond int, or a size the tensors do not have, before any allocation" {
    sed -i -E 's/"hidden_size": [0-9]+/"hidden_size": 1e30/' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*config.json: \"hidden_size\" must be an integer in [[]0, 2147483647[]]*"
    # hidden_size 10^8 implies a ~10^17-float arena, which malloc refuses: the shape check comes
    # first, so the message names the tensor, not an allocation failure
    cp "$FIX/models/llama_gqa/config.json" "$M/config.json"
    sed -i -E 's/"hidden_size": [0-9]+/"hidden_size": 100000000/' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*tensor model.embed_tokens.weight has shape [[]*, 32[]], expected [[]*, 100000000[]] from config.json*"
    cp "$FIX/models/llama_gqa/config.json" "$M/config.json"
    sed -i -E 's/"rope_theta": [0-9.e+]+/"rope_theta": -1/' "$M/config.json"
    grep -q '"rope_theta": -1' "$M/config.json"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*config.json: rope_theta must be > 0*"
}

@test "errors: unsupported dtype" {
    perl -0777 -pi -e 's/"F32"/"I32"/' "$M/model.safetensors"
    run "$TANDEM" eval --model "$M" --reference "$REF"
    expect_error "*model.safetensors: tensor * has dtype I32; supported: F32, BF16, F16*"
}

@test "errors: index names a missing file" {
    rm -rf "$M"; cp -r "$FIX/models/llama_sharded" "$M"
    f=$(ls "$M"/model-*.safetensors | head -2 | tail -1)
    rm "$f"
    run "$TANDEM" eval --model "$M" --reference "$FIX/refs/llama_sharded.jsonl"
    expect_error "*model.safetensors.index.json: names $(basename "$f"), which does not exist*"
}

@test "errors: malformed reference lines" {
    printf '{"input_ids": [1, 2, 3], "top_logprobs": [[], [], []]}\n{"input_ids": [1, 2\n' > "$BATS_TEST_TMPDIR/r.jsonl"
    run "$TANDEM" eval --model "$M" --reference "$BATS_TEST_TMPDIR/r.jsonl"
    expect_error "*r.jsonl:2: not a JSON object*"
    printf '{"top_logprobs": []}\n' > "$BATS_TEST_TMPDIR/r.jsonl"
    run "$TANDEM" eval --model "$M" --reference "$BATS_TEST_TMPDIR/r.jsonl"
    expect_error "*r.jsonl:1: field \"input_ids\" missing*"
    printf '{"input_ids": [1, 2, 3], "top_logprobs": [[]]}\n' > "$BATS_TEST_TMPDIR/r.jsonl"
    run "$TANDEM" eval --model "$M" --reference "$BATS_TEST_TMPDIR/r.jsonl"
    expect_error "*r.jsonl:1: field \"top_logprobs\" has 1 entries, expected 3*"
    printf '{"input_ids": [1, 999], "top_logprobs": [[], []]}\n' > "$BATS_TEST_TMPDIR/r.jsonl"
    run "$TANDEM" eval --model "$M" --reference "$BATS_TEST_TMPDIR/r.jsonl"
    expect_error "*r.jsonl:1: input_ids[[]1[]] = 999 is outside the vocabulary*"
}

@test "errors: bad flags" {
    run "$TANDEM" eval --model "$M" --reference "$REF" --tp x
    expect_error "*--tp: expected an integer*"
    run "$TANDEM" eval --model "$M" --reference "$REF" --bogus 1
    expect_error "*unknown option '--bogus'*"
    run "$TANDEM" eval --model "$M"
    expect_error "*give exactly one of --reference or --data*"
}

@test "errors: impossible layouts exit on every rank with one line" {
    # heads 4: tp 3 does not divide; layers 2: pp 4 is too many; world 3 not divisible by tp*pp 2
    run timeout 60 $MPIRUN 3 "$TANDEM" eval --model "$M" --reference "$REF" --tp 3
    expect_error "*--tp 3 does not divide num_attention_heads 4*"
    run timeout 60 $MPIRUN 4 "$TANDEM" eval --model "$M" --reference "$REF" --pp 4
    expect_error "*--pp 4 is larger than num_hidden_layers 2*"
    run timeout 60 $MPIRUN 3 "$TANDEM" eval --model "$M" --reference "$REF" --tp 2
    expect_error "*3 ranks are not divisible by tp*pp = 2*1*"
}

@test "errors: a bad tensor only the second stage reads is still reported, as one line" {
    # pp=2: layer 1 is on stage 2 only; its down_proj gets the transposed shape (same byte count,
    # so the file is otherwise valid). Rank 0 reports user errors, so it must check stage 2's
    # tensors too (before, the job aborted after 10 s with no message at all).
    perl -0777 -pi -e 's/("model\.layers\.1\.mlp\.down_proj\.weight":\{"dtype":"F32","shape":\[)32,64/${1}64,32/' "$M/model.safetensors"
    run timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$M" --reference "$REF" --pp 2
    expect_error "*tensor model.layers.1.mlp.down_proj.weight has shape [[]64, 32[]], expected [[]32, 64[]] from config.json*"
    # an untied lm_head that is not in the file: only the last stage reads it
    cp -r "$FIX/models/qwen2_bias" "$BATS_TEST_TMPDIR/q"
    sed -i 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$BATS_TEST_TMPDIR/q/config.json"
    run timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$BATS_TEST_TMPDIR/q" --reference "$FIX/refs/qwen2_bias.jsonl" --pp 2
    expect_error "*tensor lm_head.weight not found and config.json says tie_word_embeddings is false*"
}

@test "errors: a shard only some ranks read is truncated: the job still stops" {
    # pp=2: the second stage reads layer 1 and the head, which sit at the end of the file
    size=$(stat -c %s "$M/model.safetensors")
    head -c $((size - 100)) "$FIX/models/llama_gqa/model.safetensors" > "$M/model.safetensors"
    run timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$M" --reference "$REF" --pp 2
    echo "$output"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    echo "$output" | grep -q '^tandem: .*truncated download'
}
