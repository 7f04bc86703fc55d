#!/usr/bin/env bats
# Tokenizers (tokenizer/): SentencePiece and HF byte-level BPE behind one API, streaming decode,
# chat templates with loss masks, `tandem tokenize`. Oracles: llama.cpp's test vectors,
# Debian's spm_encode, and transformers (fixtures written by tests/fixtures/tokenizer/gen_fixtures.py).
load helpers

TT="$ROOT/build/tests/test_tokenizer"
TOKFIX="$FIX/tokenizer"
TOKA="$ASSETS/tokenizers"
VEC="$ASSETS/tokenizers/testvectors"

# ---------------------------------------------------------------- exact ids

@test "tokenizer: llama-spm test vectors (46) with llama2 tokenizer.model, no BOS" {
    need_assets
    run "$TT" vectors "$TOKA/llama2/tokenizer.model" "$VEC/ggml-vocab-llama-spm.inp" "$VEC/ggml-vocab-llama-spm.out"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"46/46 vectors match"* ]]
}

@test "tokenizer: gpt-2 test vectors (46) with gpt2 tokenizer.json, no BOS" {
    need_assets
    run "$TT" vectors "$TOKA/gpt2/tokenizer.json" "$VEC/ggml-vocab-gpt-2.inp" "$VEC/ggml-vocab-gpt-2.out"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"46/46 vectors match"* ]]
}

@test "tokenizer: llama-3 style BPE (Split regex with \\p{N}{1,3}, ignore_merges) matches HF tokenizers on 448 strings" {
    run "$TT" vectors "$TOKFIX/llama3/tokenizer.json" "$TOKFIX/llama3_vectors.inp" "$TOKFIX/llama3_vectors.out"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"448/448 vectors match"* ]]
}

@test "tokenizer: minimind tokenizer.json matches HF tokenizers on 448 strings" {
    need_assets
    run "$TT" vectors "$TOKA/minimind/tokenizer.json" "$TOKFIX/minimind_vectors.inp" "$TOKFIX/minimind_vectors.out"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"448/448 vectors match"* ]]
}

@test "tokenizer: SentencePiece ids equal spm_encode --output_format=id on 2500 generated strings" {
    need_assets
    command -v spm_encode >/dev/null || skip "spm_encode not installed (Debian package sentencepiece)"
    "$TT" corpus 2500 > "$BATS_TEST_TMPDIR/corpus.txt"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/corpus.txt")" -eq 2500 ]
    grep -qx '' "$BATS_TEST_TMPDIR/corpus.txt"                        # empty strings are in it
    spm_encode --model="$TOKA/llama2/tokenizer.model" --output_format=id \
        < "$BATS_TEST_TMPDIR/corpus.txt" > "$BATS_TEST_TMPDIR/ref.txt"
    run "$TT" compare "$TOKA/llama2/tokenizer.model" "$BATS_TEST_TMPDIR/corpus.txt" "$BATS_TEST_TMPDIR/ref.txt"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"2500/2500 lines match"* ]]
}

# ---------------------------------------------------------------- decode, streaming, bad text

@test "tokenizer: decode(encode(s)) == s for 2500 strings (llama2 spm, gpt2, minimind, llama3 fixture)" {
    need_assets
    "$TT" corpus 2500 > "$BATS_TEST_TMPDIR/corpus.txt"
    for tok in "$TOKA/llama2/tokenizer.model" "$TOKA/gpt2/tokenizer.json" "$TOKA/minimind/tokenizer.json" \
               "$TOKFIX/llama3/tokenizer.json"; do
        run "$TT" roundtrip "$tok" "$BATS_TEST_TMPDIR/corpus.txt"
        echo "$tok: $output"
        [ "$status" -eq 0 ]
        [[ "$output" == *"2500/2500 lines round-trip"* ]]
    done
}

@test "tokenizer: streaming decode of every prefix is valid UTF-8 and equals the full decode's prefix" {
    need_assets
    "$TT" corpus 600 > "$BATS_TEST_TMPDIR/corpus.txt"
    for tok in "$TOKA/llama2/tokenizer.model" "$TOKA/gpt2/tokenizer.json" "$TOKA/minimind/tokenizer.json"; do
        run "$TT" stream "$tok" "$BATS_TEST_TMPDIR/corpus.txt"
        echo "$tok: $output"
        [ "$status" -eq 0 ]
        [[ "$output" == *", 0 failures"* ]]
    done
}

@test "tokenizer: streaming holds back a character split over byte-fallback tokens, drops the first ▁" {
    need_assets
    # 猫 = E7 8C AB: llama2 has no piece for it, so it becomes <0xE7> <0x8C> <0xAB>
    run bash -c "printf '猫 x\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --no-bos"
    [ "$status" -eq 0 ]
    ids="$output"
    [ "$(echo "$ids" | wc -w)" -ge 4 ]
    run bash -c "echo '$ids' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --decode"
    [ "$status" -eq 0 ]
    [ "$output" = "猫 x" ]                     # leading "▁" of the first token is not text
    run "$TT" stream "$TOKA/llama2/tokenizer.model" <(printf '猫猫 🐈‍⬛ é\n')
    [ "$status" -eq 0 ]
}

@test "tokenizer: invalid UTF-8 input encodes as U+FFFD (documented), decode never emits broken UTF-8" {
    need_assets
    for tok in "$TOKA/llama2/tokenizer.model" "$TOKA/gpt2/tokenizer.json"; do
        run "$TT" invalid "$tok"
        echo "$tok: $output"
        [ "$status" -eq 0 ]
        [[ "$output" == *"0 failures"* ]]
    done
    run bash -c "printf 'a\xffb\n' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' --decode"
    [ "$status" -eq 0 ]
    [ "$output" = "a�b" ]
}

# ---------------------------------------------------------------- special ids, configs

@test "tokenizer: special ids and defaults come from the model and its config files" {
    need_assets
    run "$TT" info "$TOKA/llama2/tokenizer.model"
    [ "$output" = "kind=spm vocab=32000 bos=1 eos=2 pad=-1 add_bos=1 chat=none" ]
    run "$TT" info "$TOKA/minimind"
    [ "$output" = "kind=bpe vocab=6400 bos=1 eos=2 pad=0 add_bos=0 chat=chatml-think" ]
    run "$TT" info "$TOKFIX/llama3"
    [ "$output" = "kind=bpe vocab=700 bos=0 eos=4 pad=-1 add_bos=1 chat=llama3" ]
    # config.json ids override the model's; generation_config.json is weaker than config.json
    d="$BATS_TEST_TMPDIR/m"; mkdir -p "$d"
    ln -s "$TOKA/llama2/tokenizer.model" "$d/tokenizer.model"
    echo '{"bos_token_id": 5, "eos_token_id": [7, 8], "pad_token_id": 0}' > "$d/config.json"
    echo '{"bos_token_id": 9, "eos_token_id": 9}' > "$d/generation_config.json"
    run "$TT" info "$d"
    [ "$output" = "kind=spm vocab=32000 bos=5 eos=7 pad=0 add_bos=1 chat=none" ]
    # tokenizer_config.json tokens win over both
    echo '{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": false}' > "$d/tokenizer_config.json"
    run "$TT" info "$d"
    [ "$output" = "kind=spm vocab=32000 bos=1 eos=2 pad=0 add_bos=0 chat=none" ]
}

# ---------------------------------------------------------------- tandem tokenize

@test "tokenize: text lines -> ids (BOS by default for llama2, --no-bos), --decode reverses" {
    need_assets
    run bash -c "printf 'Hello world\n\n  Hello world\n' | '$TANDEM' tokenize --model '$ASSETS/models/stories260K-hf'"
    [ "$status" -eq 0 ]
    # ids as Debian's spm_encode gives them for tok512 (its normaliser drops the extra spaces), + BOS
    [ "${lines[0]}" = "1 346 306 414 263 304 341" ]
    [ "${lines[1]}" = "1" ]
    [ "${lines[2]}" = "1 346 306 414 263 304 341" ]
    [ "$(printf 'Hello world\n' | "$TANDEM" tokenize --tokenizer "$ASSETS/models/stories260K-hf/tokenizer.model")" = "${lines[0]}" ]
    run bash -c "printf 'Hello world\n\n Hello world\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model'"
    [ "$status" -eq 0 ]
    [ "${lines[0]}" = "1 15043 3186" ]
    [ "${lines[1]}" = "1" ]
    [ "${lines[2]}" = "1 29871 15043 3186" ]
    run bash -c "printf 'Hello world\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --no-bos --add-eos"
    [ "$output" = "15043 3186 2" ]
    run bash -c "printf '1 15043 3186 2\n29871 15043\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --decode --skip-special-tokens"
    [ "$status" -eq 0 ]
    [ "${lines[0]}" = "Hello world" ]
    [ "${lines[1]}" = " Hello" ]
    run bash -c "printf '15496 995\n' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' --decode"
    [ "$output" = "Hello world" ]
}

@test "tokenize: --jsonl {text} -> {input_ids} and {input_ids} -> {text}" {
    need_assets
    run bash -c "echo '{\"text\": \"Hello world\"}' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' --jsonl"
    [ "$status" -eq 0 ]
    [ "$output" = '{"input_ids":[15496,995]}' ]
    run bash -c "echo '{\"input_ids\": [15496, 995, 50256]}' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' --jsonl --decode"
    [ "$status" -eq 0 ]
    [ "$output" = '{"text":"Hello world<|endoftext|>"}' ]
    # special tokens written in text are matched before BPE, as HF does
    run bash -c "echo '{\"text\": \"<|im_start|>user\"}' | '$TANDEM' tokenize --model '$TOKA/minimind' --jsonl"
    [ "$output" = "{\"input_ids\":[1,$(printf 'user\n' | "$TANDEM" tokenize --model "$TOKA/minimind" | tr ' ' ,)]}" ]
}

# ---------------------------------------------------------------- chat templates vs transformers

# check_chat NAME DIR: rendered ids and masks equal transformers' for NAME's conversations, with and
# without the generation prompt.
check_chat() {
    local name="$1" dir="$2"
    run bash -c "'$TANDEM' tokenize --model '$dir' --jsonl < '$TOKFIX/chat/$name.in.jsonl'"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$output" = "$(cat "$TOKFIX/chat/$name.out.jsonl")" ]
    run bash -c "'$TANDEM' tokenize --model '$dir' --jsonl --add-generation-prompt < '$TOKFIX/chat/$name-gen.in.jsonl'"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$output" = "$(cat "$TOKFIX/chat/$name-gen.out.jsonl")" ]
    grep -q '"mask":\[[0-9,]*1' "$TOKFIX/chat/$name.out.jsonl"   # the fixture does mark assistant tokens
}

# stage NAME TOKENIZER_FILE: a model dir with a real tokenizer and our tokenizer_config.json
stage() {
    local d="$BATS_TEST_TMPDIR/$1"
    mkdir -p "$d"
    ln -sf "$2" "$d/$(basename "$2")"
    cp "$TOKFIX/$1/tokenizer_config.json" "$d/"
    echo "$d"
}

@test "chat: llama-2 [INST] <<SYS>> template (llama2 tokenizer) matches transformers ids and masks" {
    need_assets
    check_chat llama2 "$(stage llama2 "$TOKA/llama2/tokenizer.model")"
}

@test "chat: mistral [INST] template matches transformers ids and masks" {
    need_assets
    check_chat mistral "$(stage mistral "$TOKA/llama2/tokenizer.model")"
}

@test "chat: ChatML (Qwen2 template, default system turn; minimind tokenizer) matches transformers" {
    need_assets
    check_chat chatml-qwen2 "$(stage chatml-qwen2 "$TOKA/minimind/tokenizer.json")"
}

@test "chat: minimind's own ChatML template (with <think> blocks) matches transformers" {
    need_assets
    check_chat minimind "$TOKA/minimind"
}

@test "chat: Qwen3's hybrid template (think blocks only after the last user query, tool turns, enable_thinking unset and false) matches transformers" {
    need_assets
    d=$(stage qwen3 "$TOKA/minimind/tokenizer.json")   # fixtures: tests/fixtures/tokenizer/gen_qwen3_chat.py
    check_chat qwen3 "$d"
    run bash -c "'$TANDEM' tokenize --model '$d' --jsonl --add-generation-prompt --chat-template qwen3-nothink < '$TOKFIX/chat/qwen3-nothink-gen.in.jsonl'"
    [ "$status" -eq 0 ]
    [ "$output" = "$(cat "$TOKFIX/chat/qwen3-nothink-gen.out.jsonl")" ]
    # the two prompts differ by the empty think block only
    ! cmp -s "$TOKFIX/chat/qwen3-gen.out.jsonl" "$TOKFIX/chat/qwen3-nothink-gen.out.jsonl"
    run "$TT" info "$d"
    [ "$output" = "kind=bpe vocab=6400 bos=-1 eos=2 pad=0 add_bos=0 chat=qwen3" ]
    # a role the template has no branch for is refused
    run bash -c "echo '{\"messages\":[{\"role\":\"critic\",\"content\":\"x\"}]}' | '$TANDEM' tokenize --model '$d' --jsonl"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: stdin:1: messages[0]: role \"critic\" is not supported by the qwen3 template" ]
}

@test "chat: llama-3 header-token template matches transformers ids and masks" {
    check_chat llama3 "$TOKFIX/llama3"
}

@test "chat: name override, detection and errors" {
    need_assets
    msgs='{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}'
    # chatml override on minimind renders without the <think> block
    run bash -c "echo '$msgs' | '$TANDEM' tokenize --model '$TOKA/minimind' --jsonl --chat-template chatml"
    [ "$status" -eq 0 ]
    think=$(echo '{"text":"<think>"}' | "$TANDEM" tokenize --model "$TOKA/minimind" --jsonl | jq -c '.input_ids[0]')
    [ "$(echo "$output" | jq -c ".input_ids | index($think)")" = "null" ]
    [ "$(echo "$output" | jq -c '.mask | add')" -ge 2 ]
    run bash -c "echo '$msgs' | '$TANDEM' tokenize --model '$TOKA/minimind' --jsonl"
    [ "$status" -eq 0 ]
    [[ "$think" =~ ^[0-9]+$ ]]
    [ "$(echo "$output" | jq -c ".input_ids | index($think)")" != "null" ]
    # unknown name
    run bash -c "echo '$msgs' | '$TANDEM' tokenize --model '$TOKA/minimind' --jsonl --chat-template vicuna"
    [ "$status" -eq 1 ]
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" == "tandem: "*"unknown chat template \"vicuna\""* ]]
    # no template in the tokenizer and none named
    run bash -c "echo '$msgs' | '$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' --jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: "*"no chat_template"*"--chat-template"* ]]
    # unrecognised template text
    d="$BATS_TEST_TMPDIR/odd"; mkdir -p "$d"; ln -s "$TOKA/gpt2/tokenizer.json" "$d/tokenizer.json"
    echo '{"chat_template": "{% for m in messages %}### {{ m.content }}{% endfor %}"}' > "$d/tokenizer_config.json"
    run bash -c "echo '$msgs' | '$TANDEM' tokenize --model '$d' --jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: tokenizer_config.json: chat_template is not a known format"* ]]
    # roles out of order for llama2
    run bash -c "echo '{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\"}]}' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --jsonl --chat-template llama2"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: stdin:1: messages[0]: conversation roles must alternate user/assistant/user/assistant/..." ]
}

@test "chat: tokenize, generate and sft data read \"messages\" with one parser: one line per fault, null content is \"\"" {
    need_assets
    t="$BATS_TEST_TMPDIR"
    M="$t/chat"
    "$TANDEM" convert --from random --shape 64,128,2,4,2,6400,256 --out "$M" 2>/dev/null
    cp "$TOKA/minimind/tokenizer.json" "$TOKA/minimind/tokenizer_config.json" "$M/"
    faults=('[{"role": "user", "content": "hi"}, 7]'
            '[{"content": "hi"}]'
            '[{"role": "user", "content": 5}]'
            '[{"role": "user", "content": "hi"}, {"role": null, "content": "x"}]')
    want=('messages[1] is not an object'
          'messages[0]: field "role" missing'
          'messages[0]: field "content" is not a string'
          'messages[1]: field "role" is not a string')
    for i in "${!faults[@]}"; do
        echo "{\"messages\": ${faults[$i]}}" > "$t/m.jsonl"
        run bash -c "'$TANDEM' tokenize --model '$M' --jsonl < '$t/m.jsonl'"
        echo "tokenize $i: $output"
        [ "$status" -eq 1 ]; [ "$output" = "tandem: stdin:1: ${want[$i]}" ]
        run bash -c "'$TANDEM' generate --model '$M' --input '$t/m.jsonl' --output '$t/o.jsonl' 2>&1 >/dev/null | grep '^tandem:'"
        echo "generate $i: $output"
        [ "$output" = "tandem: $t/m.jsonl:1: ${want[$i]}" ]
        run "$ROOT/build/tests/test_sft_data" dump "$M/tokenizer.json" "$t/m.jsonl"
        echo "sft data $i: $output"
        [ "$status" -eq 1 ]; [ "$output" = "tandem: $t/m.jsonl:1: ${want[$i]}" ]
    done
    # a null content is an empty one in every command (generate refused it before)
    msgs='[{"role": "system", "content": null}, {"role": "user", "content": "Hi there"}]'
    echo "{\"messages\": $msgs, \"max_new_tokens\": 2}" > "$t/m.jsonl"
    n=$(echo "{\"messages\": $msgs}" | "$TANDEM" tokenize --model "$M" --jsonl --add-generation-prompt | jq '.input_ids | length')
    e=$(echo '{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi there"}]}' |
        "$TANDEM" tokenize --model "$M" --jsonl --add-generation-prompt | jq '.input_ids | length')
    [ "$n" -gt 5 ]; [ "$n" -eq "$e" ]
    "$TANDEM" generate --model "$M" --input "$t/m.jsonl" --output "$t/o.jsonl" --greedy 2>/dev/null
    [ "$(jq .prompt_tokens "$t/o.jsonl")" -eq "$n" ]
}

# ---------------------------------------------------------------- bad inputs

@test "tokenize: bad inputs give one clear line and exit 1" {
    need_assets
    t="$BATS_TEST_TMPDIR"
    run "$TANDEM" tokenize --tokenizer "$t/nope.model"
    [ "$status" -eq 1 ]; [ "${#lines[@]}" -eq 1 ]
    [ "$output" = "tandem: $t/nope.model: no such file or directory" ]
    run "$TANDEM" tokenize --model "$t"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $t: no tokenizer.model or tokenizer.json in this directory" ]
    head -c 3000 /dev/urandom > "$t/bad.model"
    run "$TANDEM" tokenize --tokenizer "$t/bad.model"
    [ "$status" -eq 1 ]; [ "${#lines[@]}" -eq 1 ]
    [[ "$output" == "tandem: $t/bad.model: not a valid SentencePiece model"* ]]
    head -c 5000 "$TOKA/gpt2/tokenizer.json" > "$t/trunc.json"
    run "$TANDEM" tokenize --tokenizer "$t/trunc.json"
    [ "$status" -eq 1 ]; [ "${#lines[@]}" -eq 1 ]
    [[ "$output" == "tandem: $t/trunc.json: not valid JSON"* ]]
    jq -c '.model.type = "WordPiece"' "$TOKA/minimind/tokenizer.json" > "$t/wp.json"
    run "$TANDEM" tokenize --tokenizer "$t/wp.json"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $t/wp.json: tokenizer model type \"WordPiece\" is not supported (supported: BPE)" ]
    jq -c '.pre_tokenizer = {"type": "Metaspace", "replacement": "▁"}' "$TOKA/minimind/tokenizer.json" > "$t/ms.json"
    run "$TANDEM" tokenize --tokenizer "$t/ms.json"
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: $t/ms.json: pre_tokenizer type \"Metaspace\" is not supported"* ]]
    jq -c '.normalizer = {"type": "Lowercase"}' "$TOKA/minimind/tokenizer.json" > "$t/lc.json"
    run "$TANDEM" tokenize --tokenizer "$t/lc.json"
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: $t/lc.json: normalizer type \"Lowercase\" is not supported"* ]]
    run bash -c "printf '1 2\n3 x 4\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --decode"
    [ "$status" -eq 1 ]
    [[ "$output" == *'tandem: stdin:2: "x" is not a token id'* ]]
    run bash -c "printf '99999\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --decode"
    [ "$status" -eq 1 ]
    [ "$output" = 'tandem: stdin:1: token id 99999 out of range (vocab size 32000)' ]
    run bash -c "printf '{\"txt\": 1}\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --jsonl"
    [ "$status" -eq 1 ]
    [ "$output" = 'tandem: stdin:1: expected a field "text" (string) or "messages" (array)' ]
    run bash -c "printf '{\"text\": \"a\"}\n{oops\n' | '$TANDEM' tokenize --tokenizer '$TOKA/llama2/tokenizer.model' --jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == *'tandem: stdin:2: not a JSON object'* ]]
    run "$TANDEM" tokenize --tokenizer "$TOKA/llama2/tokenizer.model" --frobnicate
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: unknown option '--frobnicate' (see --help)"* ]]
    run "$TANDEM" tokenize
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: tokenize: give exactly one of --model DIR or --tokenizer FILE" ]
    run "$TANDEM" tokenize --tokenizer
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: --tokenizer needs a value" ]
}

@test "tokenizer: encode benchmark reports a positive MB/s" {
    need_assets
    run "$TT" bench "$TOKA/llama2/tokenizer.model" "$ASSETS/data/pretrain/tinyshakespeare.txt" 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" =~ ^[0-9]+\.[0-9]+\ MB/s$ ]]
    [[ "$output" != "0.00 MB/s" ]]
}

@test "tokenizer: a 1 MB word without spaces encodes in linear-ish time (heap BPE, no quadratic blow-up)" {
    need_assets
    head -c 1000000 /dev/zero | tr '\0' 'a' > "$BATS_TEST_TMPDIR/long.txt"
    echo >> "$BATS_TEST_TMPDIR/long.txt"
    run command timeout 20 bash -c "'$TANDEM' tokenize --tokenizer '$TOKA/gpt2/tokenizer.json' < '$BATS_TEST_TMPDIR/long.txt' | wc -w"   # the limit is the assertion: not scaled
    [ "$status" -eq 0 ]
    [ "$output" -eq 250000 ]     # "aaaa" is GPT-2's longest all-"a" token
}

@test "tokenizer.json with an NFC normalizer (Qwen2): composed before BPE, ids equal HF tokenizers'" {
    need_assets
    # minimind's tokenizer with Qwen2's normalizer; expected ids from HF tokenizers (fixture)
    jq '.normalizer = {"type": "NFC"}' "$ASSETS/tokenizers/minimind/tokenizer.json" > "$BATS_TEST_TMPDIR/tokenizer.json"
    jq -c '{text}' "$ROOT/tests/fixtures/tokenizer/nfc_cases.jsonl" |
        "$TANDEM" tokenize --tokenizer "$BATS_TEST_TMPDIR/tokenizer.json" --jsonl --no-bos > "$BATS_TEST_TMPDIR/got.jsonl"
    diff <(jq -c .input_ids "$ROOT/tests/fixtures/tokenizer/nfc_cases.jsonl") <(jq -c .input_ids "$BATS_TEST_TMPDIR/got.jsonl")
    # the decomposed and composed spellings give the same ids
    [ "$(sed -n 1p "$BATS_TEST_TMPDIR/got.jsonl")" = "$(sed -n 2p "$BATS_TEST_TMPDIR/got.jsonl")" ]
    # other normalizers stay a clear error
    jq '.normalizer = {"type": "NFKC"}' "$ASSETS/tokenizers/minimind/tokenizer.json" > "$BATS_TEST_TMPDIR/t2.json"
    run "$TANDEM" tokenize --tokenizer "$BATS_TEST_TMPDIR/t2.json" <<< "x"
    [ "$status" -ne 0 ]; [[ "$output" == *'normalizer type "NFKC" is not supported (supported: none, NFC)'* ]]
}
