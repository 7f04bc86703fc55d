#!/usr/bin/env bats
# SFT data (train/data.c): records -> ids + loss masks -> shuffled, packed batches with targets, and
# the resumable cursor. No model needed. Driver: tests/test_sft_data.c (its header lists the
# invariants `batches` checks). Oracles: `tandem tokenize` (the same tokenizer and chat templates,
# checked against transformers in tokenizer.bats) and the definitions in train/data.h.
load helpers

SD="$ROOT/build/tests/test_sft_data"
SFIX="$FIX/sft_data"
LLAMA="$ASSETS/tokenizers/llama2/tokenizer.model"   # SentencePiece, no chat template
MINI="$ASSETS/tokenizers/minimind"                  # byte-level BPE, ChatML (chatml-think) template
LF="$ASSETS/data/llama-factory"

need_sft_assets() {
    need_assets
    for f in "$LLAMA" "$MINI/tokenizer.json" "$LF/alpaca_en_demo.json" "$LF/identity.json"; do
        [ -e "$f" ] || skip "$f not present (../shared/assets tokenizers and data)"
    done
}

# sample N TOK FILE [opts]: {"input_ids","mask"} of the N-th sample (1-based) of a dump
sample() {
    local n="$1" out; shift
    out=$("$SD" dump "$@" 2>/dev/null) || return 1   # a failing dump must not read as an empty sample
    echo "$out" | sed -n "${n}p" | jq -e -c '{input_ids, mask}'
}

# ids TOK TEXT: `tandem tokenize` ids of TEXT without BOS, comma-separated
ids() {
    jq -cn --arg t "$2" '{text: $t}' | "$TANDEM" tokenize --tokenizer "$1" --jsonl --no-bos | jq -r '.input_ids | join(",")'
}

# ---------------------------------------------------------------- formats and masks

@test "sft data: prompt/response = [BOS] + encode(prompt) + encode(response) + [EOS], mask on response and EOS" {
    need_sft_assets
    run "$SD" dump "$LLAMA" "$SFIX/pr.jsonl"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"stats records=3 samples=3 bad=0 "* ]]
    # hand-checked ids for the first record ("Hello world" = 15043 3186 in tokenizer.bats)
    [ "$(sample 1 "$LLAMA" "$SFIX/pr.jsonl")" = '{"input_ids":[1,15043,3186,6324,727,29889,2],"mask":[0,0,0,1,1,1,1]}' ]
    # every record, token by token, against `tandem tokenize` of the two parts
    n=1
    while IFS= read -r rec; do
        [ -n "$rec" ] || continue
        p=$(ids "$LLAMA" "$(echo "$rec" | jq -r .prompt)")
        r=$(ids "$LLAMA" "$(echo "$rec" | jq -r .response)")
        np=$(echo "$p" | tr ',' '\n' | wc -l); nr=$(echo "$r" | tr ',' '\n' | wc -l)
        mask=$(jq -cn --argjson a "$np" --argjson b "$nr" '[range(0; $a + 1) | 0] + [range(0; $b + 1) | 1]')
        want="{\"input_ids\":[1,$p,$r,2],\"mask\":$mask}"
        got=$(sample $n "$LLAMA" "$SFIX/pr.jsonl")
        echo "want $want"; echo "got  $got"
        [ "$got" = "$want" ]
        n=$((n + 1))
    done < "$SFIX/pr.jsonl"
}

@test "sft data: Alpaca prompt = instruction, or instruction + \"\\n\\n\" + input; input missing/null/empty alike; .json array = .jsonl" {
    need_sft_assets
    run "$SD" dump "$LLAMA" "$SFIX/alpaca.jsonl"
    [ "$status" -eq 0 ]
    # record 2 has an input: prompt "Translate to French.\n\nGood morning", response "Bonjour"
    p=$(ids "$LLAMA" $'Translate to French.\n\nGood morning'); r=$(ids "$LLAMA" "Bonjour")
    np=$(echo "$p" | tr ',' '\n' | wc -l); nr=$(echo "$r" | tr ',' '\n' | wc -l)
    mask=$(jq -cn --argjson a "$np" --argjson b "$nr" '[range(0; $a + 1) | 0] + [range(0; $b + 1) | 1]')
    [ "$(sample 2 "$LLAMA" "$SFIX/alpaca.jsonl")" = "{\"input_ids\":[1,$p,$r,2],\"mask\":$mask}" ]
    # records 1, 3, 4: empty, missing and null input give the instruction alone
    [ "$(sample 1 "$LLAMA" "$SFIX/alpaca.jsonl" | jq -c .input_ids)" = "[1,$(ids "$LLAMA" "Give a synonym for happy."),$(ids "$LLAMA" "Joyful."),2]" ]
    [ "$(sample 3 "$LLAMA" "$SFIX/alpaca.jsonl" | jq -c .input_ids)" = "[1,$(ids "$LLAMA" "Say hi."),$(ids "$LLAMA" "Hi!"),2]" ]
    [ "$(sample 4 "$LLAMA" "$SFIX/alpaca.jsonl" | jq -c .input_ids)" = "[1,$(ids "$LLAMA" "Add the numbers."),$(ids "$LLAMA" "5"),2]" ]
    # the JSON array file holds the same records: same samples; lines are where each element starts
    a=$("$SD" dump "$LLAMA" "$SFIX/alpaca.json" 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}')
    [ "$(echo "$a" | wc -l)" -eq 4 ]
    [ "$a" = "$("$SD" dump "$LLAMA" "$SFIX/alpaca.jsonl" 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}')" ]
    [ "$("$SD" dump "$LLAMA" "$SFIX/alpaca.json" 2>/dev/null | grep '^{' | jq -r '.line' | paste -sd,)" = "2,7,12,13" ]
}

@test "sft data: chat messages = the ids and mask \`tandem tokenize\` renders (minimind ChatML, llama2 [INST])" {
    need_sft_assets
    run bash -c "'$SD' dump '$MINI' '$SFIX/chat.jsonl' 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}'"
    [ "$status" -eq 0 ]
    want=$("$TANDEM" tokenize --model "$MINI" --jsonl < "$SFIX/chat.jsonl")
    echo "got:  $output"; echo "want: $want"
    [ "$output" = "$want" ]
    [ "$(echo "$output" | head -1 | jq '.mask | add')" -gt 2 ]   # assistant tokens are marked
    # llama2 tokenizer has no template: named explicitly
    run bash -c "'$SD' dump '$LLAMA' '$SFIX/chat.jsonl' chat=llama2 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}'"
    want=$("$TANDEM" tokenize --tokenizer "$LLAMA" --jsonl --chat-template llama2 < "$SFIX/chat.jsonl")
    [ "$output" = "$want" ]
    # ... and without the name it is a configuration error, one line
    run "$SD" dump "$LLAMA" "$SFIX/chat.jsonl"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" == "tandem: $SFIX/chat.jsonl:1: chat record: "*"no chat_template"* ]]
}

@test "sft data: ShareGPT conversations (human/gpt/user/assistant, top-level system) = the same chat as messages" {
    need_sft_assets
    for tok in "$MINI" "$LLAMA"; do
        chat=chatml-think; [ "$tok" = "$LLAMA" ] && chat=llama2
        got=$("$SD" dump "$tok" "$SFIX/sharegpt.jsonl" chat=$chat 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}')
        want=$("$SD" dump "$tok" "$SFIX/chat.jsonl" chat=$chat 2>/dev/null | grep '^{' | jq -c '{input_ids, mask}')
        echo "$tok"; echo "got  $got"; echo "want $want"
        [ -n "$got" ]
        [ "$got" = "$want" ]
    done
}

@test "sft data: format detection precedence prompt > instruction > messages > conversations; remapped keys" {
    need_sft_assets
    pr1=$(sample 1 "$LLAMA" "$SFIX/pr.jsonl")
    al1=$(sample 1 "$LLAMA" "$SFIX/alpaca.jsonl")
    ch1=$(sample 1 "$LLAMA" "$SFIX/chat.jsonl" chat=llama2)
    [ "$(sample 1 "$LLAMA" "$SFIX/mixed.jsonl" chat=llama2)" = "$pr1" ]
    [ "$(sample 2 "$LLAMA" "$SFIX/mixed.jsonl" chat=llama2)" = "$al1" ]
    [ "$(sample 3 "$LLAMA" "$SFIX/mixed.jsonl" chat=llama2)" = "$ch1" ]
    [ "$(sample 4 "$LLAMA" "$SFIX/mixed.jsonl" chat=llama2)" = "$ch1" ]
    keys="prompt_key=question response_key=answer messages_key=dialog role_key=speaker content_key=text"
    [ "$(sample 1 "$LLAMA" "$SFIX/remap.jsonl" chat=llama2 $keys)" = "$pr1" ]
    [ "$(sample 2 "$LLAMA" "$SFIX/remap.jsonl" chat=llama2 $keys)" = "$ch1" ]
    # without the remap those records have no known fields
    run "$SD" dump "$LLAMA" "$SFIX/remap.jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: $SFIX/remap.jsonl:1: no SFT fields"* ]]
}

@test "sft data: train_on_prompt masks every token but the first; pairs_as_chat renders prompt/response as a chat" {
    need_sft_assets
    [ "$(sample 1 "$LLAMA" "$SFIX/pr.jsonl" train_on_prompt=1 | jq -c .mask)" = "[0,1,1,1,1,1,1]" ]
    m=$(sample 2 "$MINI" "$SFIX/chat.jsonl" train_on_prompt=1 | jq -c .mask)
    n=$(sample 2 "$MINI" "$SFIX/chat.jsonl" | jq '.mask | length')
    [ "$m" = "$(jq -cn --argjson n "$n" '[0] + [range(1; $n) | 1]')" ]
    want=$(echo '{"messages":[{"role":"user","content":"Hello world"},{"role":"assistant","content":"Hi there."}]}' |
           "$TANDEM" tokenize --model "$MINI" --jsonl)
    [ "$(sample 1 "$MINI" "$SFIX/pr.jsonl" pairs_as_chat=1)" = "$want" ]
}

# ---------------------------------------------------------------- targets, packing, batches

@test "sft data: targets[t] = mask[t+1] ? ids[t+1] : -1 within each sample, -1 at its end" {
    need_sft_assets
    for spec in "$LLAMA pr.jsonl" "$LLAMA alpaca.json" "$MINI chat.jsonl" "$MINI sharegpt.jsonl"; do
        set -- $spec
        n=$("$SD" dump "$1" "$SFIX/$2" 2>/dev/null | grep -c '^{')
        for i in $(seq 1 "$n"); do
            want=$(sample "$i" "$1" "$SFIX/$2" | jq -r '.input_ids as $x | .mask as $m | ($x | length) as $n |
                   [range(0; $n) | if . + 1 < $n and $m[. + 1] == 1 then $x[. + 1] else -1 end] | join(",")')
            # one sample per batch, in file order: batch i-1 is sample i
            got=$("$SD" full "$1" "$SFIX/$2" pack=0 shuffle=0 batch_size=1 2>/dev/null | grep '^  targets ' | sed -n "${i}p")
            echo "$2 #$i want $want"; echo "$2 #$i got  $got"
            [ "$got" = "  targets $want" ]
        done
    done
}

@test "sft data: packing concatenates samples greedily into rows <= seq_len; seq_start marks each sample" {
    need_sft_assets
    # pr.jsonl samples have 7, 11 and 16 tokens: rows [7 11] [16] at seq_len 20
    run "$SD" full "$LLAMA" "$SFIX/pr.jsonl" seq_len=20 batch_size=2 pack=1 shuffle=0
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${lines[0]}" = "batch 0 epoch 0 rows 2 seqs 3 tokens 34 loss 18 samples 0,1,2" ]
    [ "${lines[1]}" = "  seq_start 0,7,18,34" ]
    all=$("$SD" dump "$LLAMA" "$SFIX/pr.jsonl" 2>/dev/null | grep '^{' | jq -r '.input_ids | join(",")' | paste -sd,)
    [ "${lines[2]}" = "  tokens $all" ]
    t=(${lines[3]#  targets }); t=(${t//,/ })
    [ "${t[6]}" = -1 ]   # no sample predicts the next one's BOS
    [ "${t[17]}" = -1 ]
    [ "${t[33]}" = -1 ]
    [[ "$output" == *"0 failures"* ]]
    # batch_size 1: one row per batch -> [7 11] then [16]
    run "$SD" batches "$LLAMA" "$SFIX/pr.jsonl" seq_len=20 batch_size=1 pack=1 shuffle=0
    [ "${lines[0]}" = "batch 0 epoch 0 rows 1 seqs 2 tokens 18 loss 7 samples 0,1" ]
    [ "${lines[1]}" = "batch 1 epoch 0 rows 1 seqs 1 tokens 16 loss 11 samples 2" ]
    # no packing: one sample per row
    run "$SD" batches "$LLAMA" "$SFIX/pr.jsonl" seq_len=20 batch_size=2 pack=0 shuffle=0
    [ "${lines[0]}" = "batch 0 epoch 0 rows 2 seqs 2 tokens 18 loss 7 samples 0,1" ]
    [ "${lines[1]}" = "batch 1 epoch 0 rows 1 seqs 1 tokens 16 loss 11 samples 2" ]
}

@test "sft data: every batch of real data keeps the invariants (packed/unpacked, shuffled, 2 epochs)" {
    need_sft_assets
    for opts in "pack=1 batch_size=4" "pack=0 batch_size=8" "pack=1 batch_size=1 seq_len=256"; do
        for tok in "$LLAMA" "$MINI"; do
            run "$SD" batches "$tok" "$LF/alpaca_en_demo.json" seq_len=512 epochs=2 $opts
            echo "$opts $tok: ${lines[-1]}"
            [ "$status" -eq 0 ]
            [[ "${lines[-1]}" == *", 2 epochs, "*", 0 failures" ]]
        done
    done
    # packing uses fewer, fuller batches than one sample per row
    np=$("$SD" batches "$MINI" "$LF/alpaca_en_demo.json" seq_len=512 batch_size=4 pack=1 | grep -c '^batch')
    nu=$("$SD" batches "$MINI" "$LF/alpaca_en_demo.json" seq_len=512 batch_size=4 pack=0 | grep -c '^batch')
    echo "packed $np, unpacked $nu"
    [ "$np" -lt "$nu" ]
}

@test "sft data: shuffle is deterministic by seed, differs by seed and by epoch, and is a permutation" {
    need_sft_assets
    a=$("$SD" order "$MINI" "$LF/identity.json" seed=7 2>/dev/null)
    b=$("$SD" order "$MINI" "$LF/identity.json" seed=7 2>/dev/null)
    c=$("$SD" order "$MINI" "$LF/identity.json" seed=8 2>/dev/null)
    [ "$a" = "$b" ]
    [ "$a" != "$c" ]
    e0=$(echo "$a" | sed -n 1p | cut -d' ' -f3); e1=$(echo "$a" | sed -n 2p | cut -d' ' -f3)
    [ "$e0" != "$e1" ]
    [ "$(echo "$e0" | tr ',' '\n' | sort -n | paste -sd,)" = "$(seq -s, 0 90)" ]
    [ "$e0" != "$(seq -s, 0 90)" ]
    # the batches follow: same seed -> same batches, other seed -> others
    x=$("$SD" full "$MINI" "$LF/identity.json" seed=7 seq_len=128)
    [ "$x" = "$("$SD" full "$MINI" "$LF/identity.json" seed=7 seq_len=128)" ]
    [ "$x" != "$("$SD" full "$MINI" "$LF/identity.json" seed=8 seq_len=128)" ]
    # shuffle=0 keeps file order (an eval split), and a second pass after rewind is identical
    run "$SD" eval "$MINI" "$LF/identity.json" seq_len=128 batch_size=3
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"91 samples in file order, second pass identical; 0 failures"* ]]
}

@test "sft data: cursor save -> reopen -> restore gives exactly the batches of an uninterrupted run" {
    need_sft_assets
    # mid-epoch, at an epoch boundary, in the second epoch, unpacked, and on the small fixture
    for args in "75 pack=1 batch_size=4" "150 pack=1 batch_size=4" "200 pack=1 batch_size=4" "100 pack=0 batch_size=4"; do
        set -- $args
        run "$SD" resume "$MINI" "$LF/alpaca_en_demo.json" "$@" seq_len=512 epochs=2
        echo "$args: $output"
        [ "$status" -eq 0 ]
        [[ "$output" == *"remaining batches, 0 differ"* ]]
        # the second case must really sit on the epoch boundary, or it tests nothing new
        [ "$1" != 150 ] || [[ "$output" == *"resume at epoch 1 position 0 after 150 batches"* ]]
        [[ "$output" == *"other seed refused: data cursor saved for 999 samples"* ]]
        [[ "$output" == *"bad magic refused"* ]]
    done
    run "$SD" resume "$LLAMA" "$SFIX/pr.jsonl" 4 seq_len=20 batch_size=1 epochs=3
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"after 4 batches: "*" remaining batches, 0 differ"* ]]
}

# ---------------------------------------------------------------- over-long and bad records

@test "sft data: over-long samples: truncate keeps seq_len tokens (dropped when no loss token is left), or drop" {
    need_sft_assets
    # long.jsonl at seq_len 8: 7 tokens (kept), 15 with the response past 8 (no loss left), 14, 8 exactly
    run "$SD" dump "$LLAMA" "$SFIX/long.jsonl" seq_len=8
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = "stats records=4 samples=3 bad=0 truncated=2 dropped_long=0 dropped_no_loss=1 tokens=23 loss=14" ]
    full=$(sample 3 "$LLAMA" "$SFIX/long.jsonl")
    [ "$(sample 2 "$LLAMA" "$SFIX/long.jsonl" seq_len=8)" = \
      "$(echo "$full" | jq -c '{input_ids: .input_ids[:8], mask: .mask[:8]}')" ]
    run "$SD" dump "$LLAMA" "$SFIX/long.jsonl" seq_len=8 overlong=drop
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = "stats records=4 samples=2 bad=0 truncated=0 dropped_long=2 dropped_no_loss=0 tokens=15 loss=9" ]
    # the counts are reported
    run bash -c "'$SD' dump '$LLAMA' '$SFIX/long.jsonl' seq_len=8 2>&1 >/dev/null"
    [[ "$output" == *"2 truncated to 8 tokens (1 of them dropped: no loss token left); 0 over-long dropped"* ]]
}

# bad.jsonl: line 1 and 18 are good, lines 2-17 each hold one kind of bad record
BAD_MSGS=(
    [2]='invalid JSON'
    [3]='not a JSON object'
    [4]='field "response" missing'
    [5]='field "response" is not a string'
    [6]='field "response" is empty'
    [7]='field "input" is not a string'
    [8]='field "output" is empty'
    [9]='messages[1]: unknown role "bot" (expected system, user or assistant)'
    [10]='messages[1]: field "role" missing'
    [11]='field "messages" is not an array'
    [12]='field "messages": no assistant turn (nothing to train on)'
    [13]='messages[1]: assistant field "content" is empty'
    [14]='conversations[1]: unknown "from" value "bot" (expected human, user, gpt, assistant or system)'
    [15]='conversations[0]: field "value" is not a string'
    [16]='no SFT fields: expected "prompt"/"response", "instruction"/"output", "messages" or "conversations"'
    [17]='messages[2]: conversation roles must alternate user/assistant/user/assistant/...'
)

@test "sft data: each bad record stops with one line naming file:line and the field, exit 1" {
    need_sft_assets
    f="$BATS_TEST_TMPDIR/one.jsonl"
    for n in $(seq 2 17); do
        { sed -n 1p "$SFIX/bad.jsonl"; echo; sed -n "${n}p" "$SFIX/bad.jsonl"; } > "$f"   # the bad record is on line 3
        run "$SD" dump "$LLAMA" "$f" chat=llama2
        echo "line $n: $output"
        [ "$status" -eq 1 ]
        [ "${#lines[@]}" -eq 1 ]
        [ "$output" = "tandem: $f:3: ${BAD_MSGS[$n]}" ]
    done
    # the whole file stops at its first bad line
    run "$SD" dump "$LLAMA" "$SFIX/bad.jsonl" chat=llama2
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $SFIX/bad.jsonl:2: invalid JSON" ]
    # JSON arrays: the line where the element starts; an unclosed array names where it breaks
    run "$SD" dump "$LLAMA" "$SFIX/bad_array.json"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $SFIX/bad_array.json:6: field \"output\" missing" ]
    run "$SD" dump "$LLAMA" "$SFIX/truncated_array.json" skip_bad=1
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $SFIX/truncated_array.json:3: this array element never closes (truncated file?)" ]
}

@test "sft data: skip_bad skips and counts bad records (first 5 as warnings) and reports the count" {
    need_sft_assets
    run bash -c "'$SD' dump '$LLAMA' '$SFIX/bad.jsonl' chat=llama2 skip_bad=1 2>'$BATS_TEST_TMPDIR/err'"
    echo "$output"; cat "$BATS_TEST_TMPDIR/err"
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = "stats records=18 samples=2 bad=16 truncated=0 dropped_long=0 dropped_no_loss=0 tokens=16 loss=5" ]
    [ "$(echo "$output" | grep '^{' | jq -r '.line' | paste -sd,)" = "1,18" ]
    [ "$(grep -c '^tandem: warning: .*bad.jsonl:[0-9]*: .*(record skipped)$' "$BATS_TEST_TMPDIR/err")" -eq 5 ]
    grep -q "16 bad records skipped" "$BATS_TEST_TMPDIR/err"
    run bash -c "'$SD' dump '$LLAMA' '$SFIX/bad_array.json' skip_bad=1 2>/dev/null"
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = "stats records=3 samples=2 bad=1 truncated=0 dropped_long=0 dropped_no_loss=0 tokens=14 loss=6" ]
    # nothing left is an error, not an empty run
    run "$SD" dump "$LLAMA" <(sed -n 2,17p "$SFIX/bad.jsonl") chat=llama2 skip_bad=1
    [ "$status" -eq 1 ]
    [[ "${lines[-1]}" == "tandem: "*": no samples left (16 records, 16 bad, "* ]]
}

# ---------------------------------------------------------------- real data files

@test "sft data: LLaMA-Factory alpaca_en_demo.json and identity.json load without error (both tokenizers)" {
    need_sft_assets
    for f in alpaca_en_demo identity; do
        for tok in "$LLAMA" "$MINI"; do
            run bash -c "'$SD' dump '$tok' '$LF/$f.json' seq_len=1024 2>/dev/null | tail -1"
            echo "$f $tok: $output"
            [ "$status" -eq 0 ]
            want=$(jq length "$LF/$f.json")
            [[ "$output" == "stats records=$want samples=$want bad=0 "* ]]
        done
    done
    # a DPO file is not SFT data: refused at its first record, clearly
    run "$SD" dump "$LLAMA" "$LF/dpo_en_demo.json"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $LF/dpo_en_demo.json:2: field \"conversations\": no assistant turn (nothing to train on)" ]
    # Stanford Alpaca's first 2000 hold 4 empty outputs: an error by default (documented), skipped with skip_bad
    a="$ASSETS/data/alpaca/alpaca_data_first2000.json"
    [ -e "$a" ] || skip "$a not present"
    run "$SD" dump "$LLAMA" "$a"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $a:1422: field \"output\" is empty" ]
    run bash -c "'$SD' dump '$LLAMA' '$a' skip_bad=1 2>/dev/null | tail -1"
    [[ "$output" == "stats records=2000 samples=1996 bad=4 "* ]]
}

@test "sft data: a line holding more than one JSON object is a bad record, not a silently dropped one" {
    need_sft_assets
    f="$BATS_TEST_TMPDIR/two.jsonl"
    printf '{"prompt": "Hi", "response": "Hello"} {"prompt": "lost", "response": "record"}\n' > "$f"
    run "$SD" dump "$LLAMA" "$f"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $f:1: text after the JSON object (one record per line)" ]
    printf '{"prompt": "Hi", "response": "Hello"}  \n{"prompt": "a", "response": "b"} junk\n' > "$f"
    run "$SD" dump "$LLAMA" "$f" skip_bad=1
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "stats records=2 samples=1 bad=1 "* ]]
}

@test "sft data: a stray '}' between array elements is one bad element (it hung skip_bad: found by tests/fuzz/libfuzz.sh)" {
    need_sft_assets
    f="$BATS_TEST_TMPDIR/stray.json"
    printf '[{"prompt": "Hi", "response": "Hello"}}, {"prompt": "a", "response": "b"}, }\n]\n' > "$f"
    run timeout 20 "$SD" dump "$LLAMA" "$f" skip_bad=1
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "stats records=4 samples=2 bad=2 "* ]]
    run timeout 20 "$SD" dump "$LLAMA" "$f"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $f:1: invalid JSON" ]
}

@test "sft data: a quoted value with a newline or control byte still makes one error line (found by tests/fuzz/libfuzz.sh)" {
    need_sft_assets
    f="$BATS_TEST_TMPDIR/role.jsonl"
    printf '{"messages": [{"role": "us\\ner\\u0006", "content": "x"}]}\n' > "$f"
    run "$SD" dump "$LLAMA" "$f"
    [ "$status" -eq 1 ]
    [ "${#lines[@]}" -eq 1 ]
    [ "$output" = "tandem: $f:1: messages[0]: unknown role \"us er \" (expected system, user or assistant)" ]
}
