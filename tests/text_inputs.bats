#!/usr/bin/env bats
# The rules every text input obeys (runtime/jsonl.h): sft / rm / dpo data (train/records.c),
# generate's --input and ppo's --prompts (runtime/jsonl.c) are UTF-8, and a record (a line) is at
# most 64 bytes per position (--seq-len, or the model's max_position_embeddings), at least 1 MiB.
# A record that breaks one stops the command with one line naming FILE:LINE, or, with
# --skip-bad-lines (sft / rm / dpo), is counted as bad and skipped. The 100 MB record's timeouts are
# the test, not hang guards (`command timeout`: not scaled, helpers.bash): such a line used to be
# tokenized for 70-90 s before it was dropped or truncated.
load helpers

# one_line PATTERN: the command run last failed with exit 1, exactly one "tandem:" line, and it matches the glob
one_line() {
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    [[ "$output" == *"$1"* ]]
}

# huge FILE FIRST: FIRST (a good record) on line 1, then a record whose "prompt" is 100 MB of text
huge() {
    { echo "$2"; printf '{"response": " x", "chosen": " a", "rejected": " b", "prompt": "'
      yes 'Once upon a time there was a cat. ' | tr -d '\n' | head -c 100000000; printf '"}\n'; } > "$1"
}

@test "text inputs: invalid UTF-8 is one line naming FILE:LINE in sft, rm, dpo, generate and ppo data; --skip-bad-lines counts it" {
    need_story
    d="$BATS_TEST_TMPDIR"
    printf '%s\n' '{"prompt": "Once", "response": " upon"}' > "$d/sft.jsonl"
    printf '{"prompt": "a \xff", "response": " b"}\n' >> "$d/sft.jsonl"
    run timeout 60 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o1"
    one_line "sft.jsonl:2: not valid UTF-8 (byte 15)"
    [ ! -e "$d/o1" ]
    # a JSON array names the line of the byte and the byte in that line
    printf '[\n {"prompt": "Once", "response": " upon"},\n {"prompt": "a",\n  "response": " \xc3(b"}\n]\n' > "$d/sft.json"
    run timeout 60 "$TANDEM" sft --model "$STORIES" --data "$d/sft.json" --out "$d/o1"
    one_line "sft.json:4: not valid UTF-8 (byte 17)"

    printf '%s\n' '{"prompt": "Once", "chosen": " happy", "rejected": " sad"}' > "$d/pref.jsonl"
    printf '{"prompt": "Once", "chosen": " happy", "rejected": " \xed\xa0\x80"}\n' >> "$d/pref.jsonl"   # a surrogate
    run timeout 60 "$TANDEM" rm --model "$STORIES" --data "$d/pref.jsonl" --out "$d/o2"
    one_line "pref.jsonl:2: not valid UTF-8 (byte 54)"
    run timeout 60 "$TANDEM" dpo --model "$STORIES" --data "$d/pref.jsonl" --out "$d/o2"
    one_line "pref.jsonl:2: not valid UTF-8 (byte 54)"
    [ ! -e "$d/o2" ]

    printf '{"prompt": "Once"}\n{"prompt": "a \xff b"}\n' > "$d/p.jsonl"
    run timeout 60 "$TANDEM" generate --model "$STORIES" --input "$d/p.jsonl" --output "$d/o.jsonl"
    one_line "p.jsonl:2: not valid UTF-8 (byte 15)"
    run timeout 60 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$d/p.jsonl" --advantage grpo --n-samples-per-prompt 2 \
        --rollout-batch-size 1 --out "$d/o3"
    one_line "p.jsonl:2: not valid UTF-8 (byte 15)"

    # --skip-bad-lines: counted as bad and skipped, the rest trains
    run timeout 120 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o4" --skip-bad-lines --max-steps 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"warning: $d/sft.jsonl:2: not valid UTF-8 (byte 15) (record skipped)"* ]]
    [[ "$output" == *"1 bad records skipped"* ]]
    run timeout 120 "$TANDEM" rm --model "$STORIES" --data "$d/pref.jsonl" --out "$d/o5" --skip-bad-lines --max-steps 1 --batch-size 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"1 bad records skipped"* ]]
}

@test "text inputs: a 100 MB record is refused from its length (sft, rm, generate, ppo) in seconds, or skipped with --skip-bad-lines" {
    need_story
    d="$BATS_TEST_TMPDIR"
    huge "$d/sft.jsonl" '{"prompt": "Once", "response": " upon"}'
    run command timeout 60 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o1"
    one_line "sft.jsonl:2: a record of 100000066 bytes, over the limit of 1048576 bytes for seq_len 512 (64 bytes per token, at least 1 MiB)"
    run command timeout 60 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o1" --seq-len 256 --drop-long
    one_line "sft.jsonl:2: a record of 100000066 bytes, over the limit of 1048576 bytes for seq_len 256"
    run command timeout 120 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o1" --skip-bad-lines --max-steps 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"1 bad records skipped"* ]]

    huge "$d/pref.jsonl" '{"prompt": "Once", "chosen": " happy", "rejected": " sad"}'
    run command timeout 60 "$TANDEM" dpo --model "$STORIES" --data "$d/pref.jsonl" --out "$d/o2"
    one_line "pref.jsonl:2: a record of 100000066 bytes, over the limit of"
    run command timeout 120 "$TANDEM" rm --model "$STORIES" --data "$d/pref.jsonl" --out "$d/o2" --skip-bad-lines --max-steps 1 --batch-size 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"1 bad records skipped"* ]]

    # stories260K has 512 positions: the 1 MiB floor
    huge "$d/p.jsonl" '{"prompt": "Once"}'
    for t in "" --truncate; do
        run command timeout 60 "$TANDEM" generate --model "$STORIES" --input "$d/p.jsonl" --output "$d/o.jsonl" $t
        one_line "p.jsonl:2: a line of 100000066 bytes, over the limit of 1048576 bytes for 512 positions"
    done
    run command timeout 60 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$d/p.jsonl" --advantage grpo --n-samples-per-prompt 2 \
        --rollout-batch-size 1 --out "$d/o3" --truncate
    one_line "p.jsonl:2: a line of 100000066 bytes, over the limit of 1048576 bytes for 512 positions"
}

@test "text inputs: a record just under the limit is read as before (truncated to seq_len)" {
    need_story
    d="$BATS_TEST_TMPDIR"
    # 1 MiB exactly: {"prompt": "Once", "response": " " + filler + "}
    n=$((1048576 - 35))
    { printf '{"prompt": "Once", "response": " '; head -c $n /dev/zero | tr '\0' 'a'; printf '"}\n'; } > "$d/sft.jsonl"
    [ "$(head -1 "$d/sft.jsonl" | tr -d '\n' | wc -c)" -eq 1048576 ]
    run timeout 120 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o1" --seq-len 64 --max-steps 1 --batch-size 1
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"1 records -> 1 samples, 64 tokens"*"1 truncated to 64 tokens"* ]]
    sed -i '1s/"}$/a"}/' "$d/sft.jsonl"
    run timeout 60 "$TANDEM" sft --model "$STORIES" --data "$d/sft.jsonl" --out "$d/o2" --seq-len 64
    one_line "sft.jsonl:1: a record of 1048577 bytes, over the limit of 1048576 bytes for seq_len 64"
    # past 16384 positions the limit is 64 bytes per position: 1048640 for 16385 (the data driver: no model)
    run bash -c "timeout 60 '$ROOT/build/tests/test_sft_data' dump '$ASSETS/tokenizers/llama2/tokenizer.model' '$d/sft.jsonl' seq_len=16385 2>/dev/null | tail -1"
    [ "$status" -eq 0 ]
    [[ "$output" == "stats records=1 samples=1 bad=0 truncated=1 "* ]]
}
