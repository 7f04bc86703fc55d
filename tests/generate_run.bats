#!/usr/bin/env bats
# tandem generate as a user runs it: output to pipes and full disks, killed runs, progress and the
# report, continuous batching, KV sharding, the README's main job, and the flags and fields that
# reach the engine (--input-key, penalties, config.json's EOS, --truncate).
load helpers

@test "generate: --output may be a pipe; a full disk is a write error naming the file" {
    need_assets
    printf '{"id": "a", "prompt": "Once"}\n{"id": "b", "prompt": "Lily"}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    # /dev/stdout into jq: both lines arrive and the run succeeds (truncating a pipe used to fail it)
    run bash -c "set -o pipefail; '$TANDEM' generate --model '$STORIES' --input '$BATS_TEST_TMPDIR/p.jsonl' --output /dev/stdout \
        --greedy --max-new-tokens 4 2>/dev/null | jq -c '[.id, .completion_tokens]'"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$output" = "$(printf '["a",4]\n["b",4]')" ]
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output /dev/full --greedy --max-new-tokens 4
    echo "$output"
    [ "$status" -eq 1 ]
    [[ "$output" == *"tandem: /dev/full: write failed: No space left on device"* ]]
    # an output path under a regular file, or naming a directory, cannot be opened
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/p.jsonl/o.jsonl"
    [ "$status" -eq 1 ]; [[ "$output" == *"p.jsonl/o.jsonl: cannot open for writing: Not a directory"* ]]
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR"
    [ "$status" -eq 1 ]; [[ "$output" == *"cannot open for writing: Is a directory"* ]]
}

@test "generate: a run killed mid-way leaves whole lines only, and --resume completes it to the same file" {
    need_assets
    # 12 prompts of 300 tokens (was 40): a line takes a few tenths of a second, so the kill after the
    # second line still lands with most of the run to go
    for i in $(seq 1 12); do echo "{\"id\": \"k$i\", \"prompt\": \"Once upon a time $i\", \"max_new_tokens\": 300}"; done > "$BATS_TEST_TMPDIR/p.jsonl"
    gen() { "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --greedy --ignore-eos --max-batch 1 "$@"; }
    gen --output "$BATS_TEST_TMPDIR/full.jsonl" 2>/dev/null
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --greedy --ignore-eos --max-batch 1 \
        --output "$BATS_TEST_TMPDIR/o.jsonl" 2>/dev/null &   # not through gen(): $! must be tandem itself
    pid=$!
    for _ in $(seq 1 $(scaled 600)); do   # up to 30 s (scaled) for the first two lines
        [ -f "$BATS_TEST_TMPDIR/o.jsonl" ] && [ "$(wc -l < "$BATS_TEST_TMPDIR/o.jsonl")" -ge 2 ] && break
        sleep 0.05
    done
    kill -9 $pid
    wait $pid || true
    n=$(wc -l < "$BATS_TEST_TMPDIR/o.jsonl")
    echo "killed after $n lines"
    [ "$n" -ge 2 ] && [ "$n" -lt 12 ]                        # the kill landed mid-run
    [ "$(tail -c 1 "$BATS_TEST_TMPDIR/o.jsonl" | od -An -c | tr -d ' ')" = '\n' ]   # no partial line
    jq -e . "$BATS_TEST_TMPDIR/o.jsonl" > /dev/null          # every line whole JSON
    cmp "$BATS_TEST_TMPDIR/o.jsonl" <(head -n "$n" "$BATS_TEST_TMPDIR/full.jsonl")
    gen --output "$BATS_TEST_TMPDIR/o.jsonl" --resume 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/full.jsonl" "$BATS_TEST_TMPDIR/o.jsonl"
}

@test "generate: lines finished behind a long first prompt survive a kill (OUTPUT.pending) and --resume writes them in order" {
    # 2 layers, dim 288, vocab 32000, 1024 positions: the first prompt's 900 tokens take a second or
    # two at batch 2 while 150 two-token prompts finish beside it, ahead of their turn in the output
    "$TANDEM" convert --from random --shape 288,768,2,6,6,32000,1024 --out "$BATS_TEST_TMPDIR/m" 2>/dev/null
    P="$BATS_TEST_TMPDIR/p.jsonl" O="$BATS_TEST_TMPDIR/o.jsonl"
    (echo '{"id": "long", "input_ids": [1, 5, 6], "max_new_tokens": 900}'
     for i in $(seq 1 150); do echo "{\"id\": \"s$i\", \"input_ids\": [1, $i], \"max_new_tokens\": 2}"; done) > "$P"
    gen() { "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input "$P" --greedy --ignore-eos --max-batch 2 "$@"; }
    gen --output "$BATS_TEST_TMPDIR/full.jsonl" 2>/dev/null
    [ ! -e "$BATS_TEST_TMPDIR/full.jsonl.pending" ]           # removed when the run ends
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input "$P" --greedy --ignore-eos --max-batch 2 --output "$O" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 $(scaled 600)); do
        [ -f "$O.pending" ] && [ "$(wc -l < "$O.pending")" -ge 10 ] && break
        sleep 0.02
    done
    kill -9 $pid
    wait $pid || true
    echo "output $(wc -l < "$O") lines, pending $(wc -l < "$O.pending")"
    [ "$(wc -l < "$O")" -eq 0 ]                               # "long" was still running
    [ "$(wc -l < "$O.pending")" -ge 10 ]
    jq -e . "$O.pending" > /dev/null
    run gen --output "$O" --resume
    [ "$status" -eq 0 ]
    [[ "$output" == *"resume: 0 of 151 prompts already in $O, "*" more in $O.pending"* ]]
    cmp "$BATS_TEST_TMPDIR/full.jsonl" "$O"
    [ ! -e "$O.pending" ]
    # a fresh run (no --resume) over a stale side file removes it
    echo '{"id": "stale"}' > "$O.pending"
    gen --output "$O" 2>/dev/null
    [ ! -e "$O.pending" ]
}

@test "generate: progress line on a terminal or with --progress, quiet otherwise; the report's fields" {
    need_assets
    printf '{"prompt": "Once"}\n{"prompt": "Lily"}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    g="'$TANDEM' generate --model '$STORIES' --input '$BATS_TEST_TMPDIR/p.jsonl' --output '$BATS_TEST_TMPDIR/o.jsonl' --max-new-tokens 5"
    bash -c "$g" 2> "$BATS_TEST_TMPDIR/quiet"
    run ! grep -q 'prompts\]' "$BATS_TEST_TMPDIR/quiet"
    bash -c "$g --progress" 2> "$BATS_TEST_TMPDIR/prog"
    grep -qE '\[2/2 prompts\] [0-9.]+ tokens/s, ETA [0-9]+ s' "$BATS_TEST_TMPDIR/prog"
    # stderr a terminal (script(1) gives the run a pty): the line appears without the flag
    script -qec "$g" /dev/null > "$BATS_TEST_TMPDIR/tty"
    grep -qE '\[2/2 prompts\]' "$BATS_TEST_TMPDIR/tty"
    # data parallel: the rate counts every group's tokens. The last progress line and the summary are
    # drawn a moment apart from the same start, so they agree closely; counting rank 0's group alone
    # gave half (the bound of 25% leaves room for that moment on a loaded machine)
    for i in $(seq 1 16); do echo "{\"prompt\": \"Once upon a time $i\", \"max_new_tokens\": 300}"; done > "$BATS_TEST_TMPDIR/p16.jsonl"
    timeout 120 $MPIRUN 2 "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p16.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --ignore-eos --progress 2> "$BATS_TEST_TMPDIR/dp"
    prog=$(tr '\r' '\n' < "$BATS_TEST_TMPDIR/dp" | grep -oE '^\[16/16 prompts\] [0-9.]+' | tail -1 | cut -d' ' -f3)
    summ=$(grep -oE '^generated: 16 prompts, 4800 tokens in [0-9.]+ s' "$BATS_TEST_TMPDIR/dp" | awk '{print 4800 / $7}')
    echo "progress $prog tokens/s, summary $summ"
    awk -v p="$prog" -v s="$summ" 'BEGIN { exit !(p > 0.75 * s && p < 1.33 * s) }'
    # the summary: prompts, generated tokens, prefill and decode tokens/s, peak memory
    grep -qE '^generated: 2 prompts, 10 tokens in [0-9.]+ s \| prefill steps [0-9]+ tokens [0-9.]+ tok/s \| decode steps 8 tokens [0-9.]+ tok/s \|.* peak RSS [0-9.]+ MiB/rank$' \
        "$BATS_TEST_TMPDIR/quiet"
}

@test "generate: continuous batching refills a finished sequence's slot at once" {
    # max-batch 2, sequences of 2, 6 and 2 new tokens: the third joins when the first ends (step 3),
    # so 6 steps in all; waiting for the whole batch to finish would take 6 + 2 = 8
    printf '%s\n' '{"input_ids": [1, 5], "max_new_tokens": 2}' '{"input_ids": [1, 6], "max_new_tokens": 6}' \
        '{"input_ids": [1, 7], "max_new_tokens": 2}' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --greedy --ignore-eos --max-batch 2 2> "$BATS_TEST_TMPDIR/e"
    tail -1 "$BATS_TEST_TMPDIR/e"
    grep -q '| 6 steps, 0 preemptions' "$BATS_TEST_TMPDIR/e"
    [ "$(jq -s 'map(.completion_tokens)' -c "$BATS_TEST_TMPDIR/o.jsonl")" = '[2,6,2]' ]
}

@test "generate: the KV cache is sharded by kv heads over tp and by layers over pp" {
    # llama_gqa: 2 layers x k,v x 2 kv heads x 8 x 4 B x 4 tokens = 1 KiB a block on one rank: 10 KiB
    # holds 10 blocks; tp=2 (1 kv head a rank) and pp=2 (1 layer a rank) halve a block: 20
    echo '{"input_ids": [1, 5, 6], "max_new_tokens": 3}' > "$BATS_TEST_TMPDIR/p.jsonl"
    g=("$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$BATS_TEST_TMPDIR/p.jsonl" --greedy --block-size 4 --kv-cache-mem 0.009765625)
    "${g[@]}" --output "$BATS_TEST_TMPDIR/a.jsonl" 2> "$BATS_TEST_TMPDIR/e"
    grep -q 'KV 10 blocks x 4 tokens' "$BATS_TEST_TMPDIR/e"
    for l in "--tp 2" "--pp 2"; do
        timeout 60 $MPIRUN 2 "${g[@]}" --output "$BATS_TEST_TMPDIR/b.jsonl" $l 2> "$BATS_TEST_TMPDIR/e"
        echo "$l: $(tail -1 "$BATS_TEST_TMPDIR/e")"
        grep -q 'KV 20 blocks x 4 tokens' "$BATS_TEST_TMPDIR/e"
        cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/b.jsonl"
    done
}

@test "generate: the README's main job runs on the default model and prints every completion" {
    need_assets
    cd "$ROOT"
    run env TANDEM_OUTPUT="$BATS_TEST_TMPDIR/c.jsonl" bash examples/run_default.sh
    echo "$output" | tail -5
    [ "$status" -eq 0 ]
    [ "$(wc -l < "$BATS_TEST_TMPDIR/c.jsonl")" -eq "$(grep -c . examples/prompts.jsonl)" ]
    for id in $(jq -r .id "$BATS_TEST_TMPDIR/c.jsonl"); do [[ "$output" == *"[$id] "* ]]; done
}

@test "generate: a stop string that spans four tokens is found and cut" {
    need_assets
    # " little girl" is four stories260K tokens (376 298 315 421)
    [ "$(echo ' little girl' | "$TANDEM" tokenize --model "$STORIES" --no-bos | wc -w)" -eq 4 ]
    printf '{"id": "all", "prompt": "Once upon a time", "max_new_tokens": 30}\n{"id": "cut", "prompt": "Once upon a time", "stop": "little girl"}\n' \
        > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy 2>/dev/null
    q() { jq -r "select(.id == \"$1\") | $2" "$BATS_TEST_TMPDIR/o.jsonl"; }
    [[ "$(q all .completion)" == *"little girl"* ]]
    [ "$(q cut .finish_reason)" = stop ]
    [ "$(q cut .completion)" = "$(q all '.completion | split("little girl")[0]')" ]
    # generation ran up to the token completing the match, no further
    n=$(q cut .completion_tokens)
    [ "$(q cut '.completion_ids | tojson')" = "$(q all ".completion_ids[:$n] | tojson")" ]
    [ "$(q cut '.completion_ids[-1]')" = 421 ]
}

@test "generate: --input-key, a config.json EOS (integer form), --truncate keeps the last tokens" {
    need_assets
    P="$BATS_TEST_TMPDIR/p.jsonl"
    echo '{"id": "t", "prompt": "Once upon a time", "max_new_tokens": 12}' > "$P"
    "$TANDEM" generate --model "$STORIES" --input "$P" --output "$BATS_TEST_TMPDIR/a.jsonl" --greedy 2>/dev/null
    echo '{"id": "t", "text": "Once upon a time", "max_new_tokens": 12}' > "$BATS_TEST_TMPDIR/k.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/k.jsonl" --output "$BATS_TEST_TMPDIR/k.out" --greedy --input-key text 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/k.out"
    # config.json's eos_token_id alone (no generation_config.json) ends a sequence at that id: here the
    # 6th greedy token
    eos=$(jq '.completion_ids[5]' "$BATS_TEST_TMPDIR/a.jsonl")
    cp -r "$STORIES" "$BATS_TEST_TMPDIR/m"
    rm -f "$BATS_TEST_TMPDIR/m/generation_config.json"
    jq ".eos_token_id = $eos" "$STORIES/config.json" > "$BATS_TEST_TMPDIR/m/config.json"
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input "$P" --output "$BATS_TEST_TMPDIR/e.jsonl" --greedy 2>/dev/null
    [ "$(jq -r .finish_reason "$BATS_TEST_TMPDIR/e.jsonl")" = stop ]
    [ "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/e.jsonl")" = "$(jq -c '.completion_ids[:6]' "$BATS_TEST_TMPDIR/a.jsonl")" ]
    # --truncate: the same completion as the prompt's last 512 - 20 token ids given directly
    long=$(printf 'Once upon a time there was a cat %.0s' $(seq 1 80))
    echo "{\"prompt\": \"$long\", \"max_new_tokens\": 20}" > "$P"
    "$TANDEM" generate --model "$STORIES" --input "$P" --output "$BATS_TEST_TMPDIR/t.jsonl" --greedy --truncate 2>/dev/null
    echo "{\"text\": \"$long\"}" | "$TANDEM" tokenize --model "$STORIES" --jsonl | jq -c '{input_ids: .input_ids[-492:], max_new_tokens: 20}' > "$BATS_TEST_TMPDIR/i.jsonl"
    [ "$(jq '.input_ids | length' "$BATS_TEST_TMPDIR/i.jsonl")" -eq 492 ]
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/i.jsonl" --output "$BATS_TEST_TMPDIR/i.out" --greedy 2>/dev/null
    [ "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/t.jsonl")" = "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/i.out")" ]
    [ "$(jq .prompt_tokens "$BATS_TEST_TMPDIR/t.jsonl")" -eq 492 ]
}

@test "generate: presence and frequency penalties reach the sampler (OpenAI definition, checked per step)" {
    need_assets
    echo '{"prompt": "Once upon a time", "max_new_tokens": 40, "presence_penalty": 0.5, "frequency_penalty": 1.5}' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --ignore-eos \
        --logprobs 20 2>/dev/null
    # logprobs are the raw distribution's, so at each step the greedy choice must be the argmax over the
    # top 20 of logprob - 0.5 [count > 0] - 1.5 count, counts over the tokens generated before it
    jq -e '.completion_ids as $ids | [range(0; $ids | length) as $i | .logprobs[$i].top
             | map(. as [$t, $lp] | ([$ids[:$i][] | select(. == $t)] | length) as $c
                   | [$t, $lp - (if $c > 0 then 0.5 else 0 end) - 1.5 * $c])
             | max_by(.[1])[0] == $ids[$i]] | all' "$BATS_TEST_TMPDIR/o.jsonl"
    # and they matter here: plain greedy repeats itself and differs
    "$TANDEM" generate --model "$STORIES" --input <(echo '{"prompt": "Once upon a time", "max_new_tokens": 40}') \
        --output "$BATS_TEST_TMPDIR/g.jsonl" --greedy --ignore-eos 2>/dev/null
    [ "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/o.jsonl")" != "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/g.jsonl")" ]
    # the flags do the same as the fields
    "$TANDEM" generate --model "$STORIES" --input <(echo '{"prompt": "Once upon a time", "max_new_tokens": 40}') \
        --output "$BATS_TEST_TMPDIR/f.jsonl" --greedy --ignore-eos --presence-penalty 0.5 --frequency-penalty 1.5 2>/dev/null
    [ "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/o.jsonl")" = "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/f.jsonl")" ]
}

@test "generate streams its input: the first line is written while the input is still open (a fifo), the bytes those of a file" {
    need_assets
    # 400 lines; --max-batch 2 keeps 256 (READ_AHEAD_MIN) in flight, so the first lines finish long
    # before the 400th is read; the writer holds the fifo open until the output has a line
    for i in $(seq 1 400); do echo "{\"id\": $i, \"prompt\": \"Once upon a time $i\"}"; done > "$BATS_TEST_TMPDIR/p.jsonl"
    gen() { "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 "$@"; }
    gen --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/file.jsonl" 2>/dev/null
    mkfifo "$BATS_TEST_TMPDIR/in"
    timeout 120 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 \
        --input "$BATS_TEST_TMPDIR/in" --output "$BATS_TEST_TMPDIR/fifo.jsonl" 2>/dev/null &
    job=$!
    exec 5>"$BATS_TEST_TMPDIR/in"
    head -n 300 "$BATS_TEST_TMPDIR/p.jsonl" >&5
    for _ in $(seq 600); do [ -s "$BATS_TEST_TMPDIR/fifo.jsonl" ] && break; sleep 0.1; done
    written=$(wc -l < "$BATS_TEST_TMPDIR/fifo.jsonl" 2>/dev/null || echo 0)
    tail -n +301 "$BATS_TEST_TMPDIR/p.jsonl" >&5
    exec 5>&-
    wait $job
    echo "lines written before the input's end: $written"
    [ "$written" -ge 1 ]
    cmp "$BATS_TEST_TMPDIR/file.jsonl" "$BATS_TEST_TMPDIR/fifo.jsonl"
}

@test "generate streams its input: 20000 lines of 1 KiB peak at the memory of 2000 (what is in flight, not the file)" {
    need_assets
    # a 1 KiB id per line (echoed in the output, held with its line), a short prompt, one token each
    mk() { awk -v n="$1" 'BEGIN { pad = sprintf("%1000s", ""); gsub(/ /, "x", pad)
        for (i = 1; i <= n; i++) printf "{\"id\": \"%s%d\", \"prompt\": \"Once\"}\n", pad, i }' > "$2"; }
    mk 2000 "$BATS_TEST_TMPDIR/small.jsonl"
    mk 20000 "$BATS_TEST_TMPDIR/big.jsonl"
    # peak FILE: the run's peak RSS in $rss (called directly, not in $(...), where a failed check
    # would not stop the test)
    peak() {
        run timeout 300 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 1 --input "$1" --output "$BATS_TEST_TMPDIR/o.jsonl"
        [ "$status" -eq 0 ]
        [ "$(wc -l < "$BATS_TEST_TMPDIR/o.jsonl")" -eq "$(wc -l < "$1")" ]
        rss=$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' <<<"$output")
        [[ "$rss" =~ ^[0-9.]+$ ]]
    }
    peak "$BATS_TEST_TMPDIR/small.jsonl"; small=$rss
    peak "$BATS_TEST_TMPDIR/big.jsonl"; big=$rss
    echo "peak RSS: $small MiB for 2000 lines, $big MiB for 20000 (the input is $(( $(wc -c < "$BATS_TEST_TMPDIR/big.jsonl") >> 20 )) MiB)"
    # read whole, the 18000 more lines hold 18+ MiB more
    awk -v a="$small" -v b="$big" 'BEGIN { exit !(b - a < 6) }'
}

@test "generate: an error leaves no empty output behind; whole lines written before it stay for --resume (a bad line read late, a write error); --resume's file stays" {
    need_assets
    for i in $(seq 1 400); do echo "{\"id\": $i, \"prompt\": \"Once upon a time $i\"}"; done > "$BATS_TEST_TMPDIR/good.jsonl"
    cp "$BATS_TEST_TMPDIR/good.jsonl" "$BATS_TEST_TMPDIR/p.jsonl"
    echo '{"id": 401, "promt": "Once"}' >> "$BATS_TEST_TMPDIR/p.jsonl"
    O="$BATS_TEST_TMPDIR/o.jsonl"
    # line 401 is read once the first lines are written (--max-batch 2: 256 in flight)
    run timeout 120 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$O"
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "tandem: $BATS_TEST_TMPDIR/p.jsonl:401: field \"prompt\" missing (or give \"messages\" or \"input_ids\")" ]
    [ "$(wc -l < "$O")" -ge 1 ]; [ "$(tail -c 1 "$O" | od -An -c | tr -d ' ')" = '\n' ]; jq -e . "$O" > /dev/null
    # ... and --resume over the fixed input completes them to the straight run's bytes
    run timeout 120 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 --input "$BATS_TEST_TMPDIR/good.jsonl" --output "$O" --resume
    [ "$status" -eq 0 ]
    timeout 120 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 --input "$BATS_TEST_TMPDIR/good.jsonl" --output "$BATS_TEST_TMPDIR/straight.jsonl" 2>/dev/null
    cmp "$O" "$BATS_TEST_TMPDIR/straight.jsonl"
    rm -f "$O"
    # an error before any line is written (the first write fails): nothing is left, not an empty file
    run bash -c "trap '' XFSZ; ulimit -f 0; exec '$TANDEM' generate --model '$STORIES' --greedy --max-new-tokens 2 \
        --input '$BATS_TEST_TMPDIR/good.jsonl' --output '$O'"
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "tandem: $O: write failed: File too large" ]
    [ ! -e "$O" ]
    [ ! -e "$O.pending" ]
    # an error in the middle of generating, after lines were written: the file size limit (a full disk)
    run bash -c "trap '' XFSZ; ulimit -f 1; exec '$TANDEM' generate --model '$STORIES' --greedy --max-new-tokens 4 \
        --input '$BATS_TEST_TMPDIR/good.jsonl' --output '$O'"
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "tandem: $O: write failed: File too large" ]
    [ "$(tail -c 1 "$O" | od -An -c | tr -d ' ')" = '\n' ]; jq -e . "$O" > /dev/null   # whole lines only
    rm -f "$O" "$O.pending"
    # with --resume the output holds an earlier run's lines: it stays
    head -n 3 "$BATS_TEST_TMPDIR/p.jsonl" > "$BATS_TEST_TMPDIR/p3.jsonl"
    "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --input "$BATS_TEST_TMPDIR/p3.jsonl" --output "$O" 2>/dev/null
    cp "$O" "$BATS_TEST_TMPDIR/before.jsonl"
    run timeout 120 "$TANDEM" generate --model "$STORIES" --greedy --max-new-tokens 2 --max-batch 2 --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$O" --resume
    [ "$status" -eq 1 ]
    [ -e "$O" ]
    cmp "$BATS_TEST_TMPDIR/before.jsonl" <(head -n 3 "$O")
}

@test "generate streams its input: a line longer than every one before it, read late, drains and resizes the engine; the same bytes at 1x1 and dp 2 (where one group holds it: both remake their engines), and as the whole input read first" {
    need_assets
    # line 561: after the 2 x 256 lines the dp groups read first, so only its group holds it
    for i in $(seq 1 560); do echo "{\"id\": $i, \"prompt\": \"Once upon a time $i\", \"max_new_tokens\": $((1 + i % 3))}"; done > "$BATS_TEST_TMPDIR/p.jsonl"
    echo "{\"id\": \"long\", \"prompt\": \"$(printf 'Lily and Tom went to the park. %.0s' $(seq 1 20))\", \"max_new_tokens\": 40}" >> "$BATS_TEST_TMPDIR/p.jsonl"
    for i in $(seq 561 580); do echo "{\"id\": $i, \"prompt\": \"Once upon a time $i\"}"; done >> "$BATS_TEST_TMPDIR/p.jsonl"
    A=(generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --max-new-tokens 3 --max-batch 2 --temperature 0.8 --seed 3 --logprobs 1)
    timeout 300 "$TANDEM" "${A[@]}" --output "$BATS_TEST_TMPDIR/one.jsonl" 2>/dev/null
    timeout 300 $MPIRUN 2 "$TANDEM" "${A[@]}" --output "$BATS_TEST_TMPDIR/dp.jsonl" 2>/dev/null
    [ "$(wc -l < "$BATS_TEST_TMPDIR/one.jsonl")" -eq 581 ]
    [ "$(jq -r 'select(.id == "long") | .completion_tokens' "$BATS_TEST_TMPDIR/one.jsonl")" -eq 40 ]
    cmp "$BATS_TEST_TMPDIR/one.jsonl" "$BATS_TEST_TMPDIR/dp.jsonl"
    # --max-batch 300: 600 lines in flight, the whole input read first and the engine sized for the
    # long line from the start (tokens do not depend on the batch): the same bytes
    timeout 300 "$TANDEM" "${A[@]}" --max-batch 300 --output "$BATS_TEST_TMPDIR/wide.jsonl" 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/one.jsonl" "$BATS_TEST_TMPDIR/wide.jsonl"
}
