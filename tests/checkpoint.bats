#!/usr/bin/env bats
# Saving a model as an HF directory (train/checkpoint.c), checked by tests/test_checkpoint.c:
# a fixture loaded at tp x pp, saved, then loaded at 1x1 must be bit-identical to the original's
# 1x1 load, parameter by parameter; the saved files hold F32 HF-shaped tensors equal to the
# original's (padded vocab rows stripped, a tied lm_head not written), the index names every
# tensor's file, and the saved tensors are the same bytes whatever the layout they were saved from.
# Writes are atomic: an existing directory is never replaced without overwrite, and no temp
# directory is left behind. check_hf_load.py runs with the project's .venv (torch + transformers, make pyenv).
load helpers

TC="$ROOT/build/tests/test_checkpoint"
HFCHECK="$FIX/check_hf_load.py"

# save_run SRC_DIR OUT_DIR TP PP [overwrite]: saves on NP ranks (default TP*PP; NP > TP*PP gives dp > 1);
# every rank must print its ok line
save_run() {
    local src=$1 out=$2 tp=$3 pp=$4 n=${NP:-$(($3 * $4))}
    if [ "$n" -eq 1 ]; then
        run timeout 60 "$TC" save "$src" "$out" "$tp" "$pp" ${5:-}
    else
        run_ranks 120 "$n" "$TC" save "$src" "$out" "$tp" "$pp" ${5:-}
    fi
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: saved' <<<"$output")" -eq "$n" ]
}

# compare ORIG SAVED [OTHER_SAVED...]: test_checkpoint compare passes
compare() {
    run timeout 60 "$TC" compare "$@"
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q '^ok: compare' <<<"$output"
}

# expect_files DIR PP: exactly config.json, the PP stage files and the index (and no temp dir beside it)
expect_files() {
    local want="config.json" s
    for s in $(seq 1 "$2"); do want+=" $(printf 'model-%05d-of-%05d.safetensors' "$s" "$2")"; done
    want+=" model.safetensors.index.json"
    [ "$(cd "$1" && LC_ALL=C ls | tr '\n' ' ')" = "$want " ]
    [ -z "$(ls -d "$1".tmp.* 2>/dev/null)" ]
}

# roundtrip MODEL [EXTRA_LAYOUT...]: saves at 1x1 2x1 1x2 2x2 (and the extras, TPxPP); each save
# reloads bit-identical and holds the same tensors as the 1x1 save
roundtrip() {
    local model=$1 src="$FIX/models/$1" d="$BATS_TEST_TMPDIR/$1" layout tp pp
    shift
    save_run "$src" "$d-1x1" 1 1
    compare "$src" "$d-1x1"
    expect_files "$d-1x1" 1
    for layout in 2x1 1x2 2x2 "$@"; do
        tp=${layout%x*} pp=${layout#*x}
        save_run "$src" "$d-$layout" "$tp" "$pp"
        compare "$src" "$d-$layout" "$d-1x1"
        expect_files "$d-$layout" "$pp"
    done
}

# expect_error PATTERN: the last run failed with exactly one "tandem: " line, matching PATTERN
expect_error() {
    echo "status=$status output=$output"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    [[ "$(grep '^tandem: ' <<<"$output")" == $1 ]]
}

# snapshot DIR: file names and checksums, to show a failed save changed nothing
snapshot() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs md5sum); }

@test "checkpoint llama_gqa: saved at 1x1, 2x1, 1x2, 2x2, reloads bit-identical; same tensors from every layout" {
    roundtrip llama_gqa
}

@test "checkpoint qwen2_bias: tied (no lm_head.weight, the last stage's copy not written), q/k/v biases, bf16 on disk -> F32 exact" {
    roundtrip qwen2_bias
    local d="$BATS_TEST_TMPDIR/qwen2_bias-2x2"
    run ! grep -q lm_head "$d/model.safetensors.index.json"
    # config.json: the source's text, only torch_dtype changed (bfloat16 -> float32: the stored dtype)
    grep -q '"torch_dtype": "bfloat16"' "$FIX/models/qwen2_bias/config.json"
    grep -q '"torch_dtype": "float32"' "$d/config.json"
    diff <(grep -v '"torch_dtype"' "$FIX/models/qwen2_bias/config.json") <(grep -v '"torch_dtype"' "$d/config.json")
}

@test "checkpoint llama_odd_vocab: vocab 97 padded to 98 / 100 on 2 / 4 tp ranks, padding stripped on save" {
    roundtrip llama_odd_vocab 4x1
}

@test "checkpoint llama_mqa: one kv head replicated on 2 and 4 tp ranks, saved once" {
    roundtrip llama_mqa 4x1
}

@test "checkpoint llama_sharded: 7 source files -> one file per stage" {
    roundtrip llama_sharded
}

@test "checkpoint dp > 1: only dp rank 0 writes; 1x1 on 2 ranks and 1x2 on 4 ranks save the same model" {
    local d="$BATS_TEST_TMPDIR/dp"
    NP=1 save_run "$FIX/models/llama_gqa" "$d-ref" 1 1
    NP=2 save_run "$FIX/models/llama_gqa" "$d-2" 1 1
    compare "$FIX/models/llama_gqa" "$d-2" "$d-ref"
    expect_files "$d-2" 1
    NP=4 save_run "$FIX/models/llama_gqa" "$d-4" 1 2
    compare "$FIX/models/llama_gqa" "$d-4" "$d-ref"
    expect_files "$d-4" 2
}

@test "checkpoint: tokenizer and generation files copied byte for byte, other files not; parents created" {
    local src="$BATS_TEST_TMPDIR/src" out="$BATS_TEST_TMPDIR/a/b/out" f
    cp -r "$FIX/models/llama_gqa" "$src"
    for f in tokenizer.model tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
        echo "{\"file\": \"$f\", \"n\": $RANDOM}" > "$src/$f"
    done
    echo notes > "$src/README.md"
    save_run "$src" "$out" 2 2
    for f in config.json tokenizer.model tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
        cmp "$src/$f" "$out/$f"
    done
    [ ! -e "$out/README.md" ]
    [ "$(ls "$out" | wc -l)" -eq 9 ]
    compare "$FIX/models/llama_gqa" "$out"
}

@test "checkpoint errors: an existing directory without overwrite is one clear error, nothing written" {
    local out="$BATS_TEST_TMPDIR/out"
    save_run "$FIX/models/llama_gqa" "$out" 1 1
    touch "$out/marker"
    local before=$(snapshot "$out")
    run timeout 60 "$TC" save "$FIX/models/llama_gqa" "$out" 1 1
    expect_error "tandem: $out: already exists; not replacing it (ask for overwrite)"
    [ "$(snapshot "$out")" = "$before" ]
    [ -z "$(ls -d "$out".tmp.* 2>/dev/null)" ]
    run timeout 120 $MPIRUN 4 "$TC" save "$FIX/models/llama_gqa" "$out" 2 2
    expect_error "tandem: $out: already exists; not replacing it (ask for overwrite)"
    [ "$(snapshot "$out")" = "$before" ]
    [ -z "$(ls -d "$out".tmp.* 2>/dev/null)" ]
    # a file, or a directory that is not a model, is never replaced, even with overwrite
    mkdir "$BATS_TEST_TMPDIR/notmodel" && echo keep > "$BATS_TEST_TMPDIR/notmodel/data"
    run timeout 60 "$TC" save "$FIX/models/llama_gqa" "$BATS_TEST_TMPDIR/notmodel" 1 1 overwrite
    expect_error "*notmodel: exists and is not a model directory (no config.json); not replacing it"
    [ "$(cat "$BATS_TEST_TMPDIR/notmodel/data")" = keep ]
    [ "$(ls "$BATS_TEST_TMPDIR/notmodel")" = data ]
}

@test "checkpoint overwrite: replaces an older save (old files gone), also in place over the source directory" {
    local out="$BATS_TEST_TMPDIR/out" src="$BATS_TEST_TMPDIR/src"
    save_run "$FIX/models/llama_gqa" "$out" 1 1
    touch "$out/marker"
    save_run "$FIX/models/llama_gqa" "$out" 2 2 overwrite
    [ ! -e "$out/marker" ]
    expect_files "$out" 2
    compare "$FIX/models/llama_gqa" "$out"
    # the source itself: bf16 files become F32, same values
    cp -r "$FIX/models/qwen2_bias" "$src"
    save_run "$src" "$src" 2 2 overwrite
    expect_files "$src" 2
    compare "$FIX/models/qwen2_bias" "$src"
    [ -z "$(ls "$BATS_TEST_TMPDIR" | grep -E '\.(tmp|old)\.')" ]
}

@test "checkpoint: HF transformers loads the saved directories; logits equal the original's (.venv)" {
    need_hfpy
    local d="$BATS_TEST_TMPDIR" m layout
    for m in llama_gqa:2x2 qwen2_bias:2x2 qwen2_bias:1x2 llama_odd_vocab:4x1 llama_mqa:4x1 llama_sharded:1x2; do
        layout=${m#*:} m=${m%:*}
        save_run "$FIX/models/$m" "$d/$m-$layout" "${layout%x*}" "${layout#*x}"
        run timeout 120 "$HFPY" "$HFCHECK" "$d/$m-$layout" "$FIX/models/$m"
        echo "$output"
        [ "$status" -eq 0 ]
        grep -q "^ok: hf load" <<<"$output"
    done
}

@test "checkpoint stories260K (5 layers over 2 stages, tied, tokenizer.model): round trip, and HF load where present" {
    need_assets
    local src="$ASSETS/models/stories260K-hf" out="$BATS_TEST_TMPDIR/stories"
    save_run "$src" "$out" 2 2
    compare "$src" "$out"
    cmp "$src/tokenizer.model" "$out/tokenizer.model"
    need_hfpy
    run timeout 120 "$HFPY" "$HFCHECK" "$out" "$src"
    echo "$output"
    [ "$status" -eq 0 ]
}

@test "checkpoint: a failed write (the last stage's file hits a size limit) returns -1 on every rank, leaves nothing; the next save works" {
    local out="$BATS_TEST_TMPDIR/failed"
    run timeout 60 "$TC" save "$FIX/models/llama_gqa" "$out-1" 1 1 fail-last-stage
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q "^tandem: .*model-00001-of-00001.safetensors: cannot write: File too large" <<<"$output"
    [ "$(grep -c '^ok: failed save returned -1' <<<"$output")" -eq 1 ]
    compare "$FIX/models/llama_gqa" "$out-1"
    run_ranks 120 4 "$TC" save "$FIX/models/llama_gqa" "$out-4" 2 2 fail-last-stage
    echo "$output"
    [ "$status" -eq 0 ]
    grep -q "^tandem: \[rank 2\] .*model-00002-of-00002.safetensors: cannot write: File too large" <<<"$output"
    [ "$(grep -c '^ok: failed save returned -1' <<<"$output")" -eq 4 ]
    [ "$(grep -c '^ok: saved' <<<"$output")" -eq 4 ]
    compare "$FIX/models/llama_gqa" "$out-4"
    expect_files "$out-4" 2
}
