#!/usr/bin/env bats
# --device: the inference path keeps the Backend's memory contract (kernels/kernels.h: every pointer
# a kernel takes is the backend's memory; the host reads and writes it only through to_host /
# to_device), checked without a GPU. --device cpu-guarded (kernels/cpu/guarded.c) runs the CPU
# kernels behind memory the host cannot touch and refuses host pointers, so a run that completes on
# it is a run that keeps the contract; here eval, generate and bench complete on it with --device
# cpu's bytes (training: tests/device_train.bats). The guard itself is tests/test_guarded.c;
# --device's errors are one line each.
# One thread unless said: the guard's mprotect calls cost far more beside a second spinning thread,
# and one or two threads give the same bits (README); the sliding-window case runs on two (calls
# inside the per-sequence parallel attention share allocations).
load helpers

G="--device cpu-guarded"

@test "device: cpu-guarded computes the CPU's bits and catches host pointers (int arrays and block tables too), host reads and writes, freed buffers, buffers too small" {
    ulimit -c 0
    run "$ROOT/build/tests/test_guarded" ok
    echo "$output"
    [ "$status" -eq 0 ] && [ "$output" = ok ]
    for c in "host-arg matmul: argument x" "host-ints embedding: argument ids" "host-table attention: argument kv->table" \
             "freed matmul: argument x" "short matmul: argument out"; do
        set -- $c
        run "$ROOT/build/tests/test_guarded" $1
        echo "$1: $output"
        [ "$status" -eq 134 ]   # abort
        [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
        grep -q "^tandem: internal error: --device cpu-guarded: ${*:2} (.*) is not the backend's memory" <<<"$output"
    done
    for c in host-read host-write; do
        run "$ROOT/build/tests/test_guarded" $c
        echo "$c: $output"
        [ "$status" -eq 139 ]   # SIGSEGV
        grep -q "^tandem: internal error: --device cpu-guarded: the host touched the backend's memory" <<<"$output"
    done
}

# eval_same MODEL DTYPE ARGS...: eval's output (timing and the settings tables removed), exit status
# and, with --reference, its --write-reference file: cpu-guarded against cpu, byte for byte
eval_same() {
    local m="$1" d="$2" w=(); shift 2
    for dev in cpu cpu-guarded; do
        [[ " $* " == *" --reference "* ]] && w=(--write-reference "$BATS_TEST_TMPDIR/w.$dev")
        run "$TANDEM" eval --model "$m" --dtype "$d" --device $dev --threads 1 --tie-gap 10 "$@" "${w[@]}"
        echo "$output" | grep -v '^[|+]' | sed -E 's/"seconds": [0-9.]+//' > "$BATS_TEST_TMPDIR/e.$dev"
        echo "$status" >> "$BATS_TEST_TMPDIR/e.$dev"
    done
    tail -2 "$BATS_TEST_TMPDIR/e.cpu-guarded"
    grep -q '^{"records"' "$BATS_TEST_TMPDIR/e.cpu"
    cmp "$BATS_TEST_TMPDIR/e.cpu" "$BATS_TEST_TMPDIR/e.cpu-guarded"
    [ ${#w[@]} -eq 0 ] || cmp "$BATS_TEST_TMPDIR/w.cpu" "$BATS_TEST_TMPDIR/w.cpu-guarded"
}

@test "device: eval on cpu-guarded equals cpu bit for bit (fixtures, fp32 and bf16; reference, greedy and --data)" {
    for f in llama_gqa mistral_swa qwen2_bias llama_odd_vocab llama_sharded; do
        for d in fp32 bf16; do
            echo "$f $d"
            eval_same "$FIX/models/$f" $d --reference "$FIX/refs/$f.jsonl" --max-logprob-diff 1 --quiet
        done
    done
    eval_same "$FIX/models/llama_gqa" fp32 --data "$FIX/refs/llama_gqa.data.jsonl"
    eval_same "$FIX/models/qwen2_bias" bf16 --data "$FIX/refs/qwen2_bias.data.jsonl"
}

@test "device: eval on cpu-guarded equals cpu bit for bit (real stories260K, fp32 and bf16)" {
    need_story
    for d in fp32 bf16; do
        eval_same "$STORIES" $d --reference "$FIX/refs/stories260K.jsonl" --max-logprob-diff 1
    done
}

@test "device: generate on cpu-guarded writes cpu's bytes (greedy, sampled + logprobs; batch 1, 3, 16; KV pressure, chunked prefill)" {
    need_story
    # sampled with logprobs (the sampler's rows and the logprobs come back through to_host), and plain
    # greedy (the argmax ids only)
    make_prompts "$BATS_TEST_TMPDIR/p.jsonl" ', "temperature": 0.9, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1, "logprobs": 2' 16
    jq -c '. + {temperature: 0, logprobs: 0, repetition_penalty: 1}' "$BATS_TEST_TMPDIR/p.jsonl" > "$BATS_TEST_TMPDIR/g.jsonl"
    gen() { "$TANDEM" generate --model "$STORIES" --seed 3 --threads 1 "$@" 2> "$BATS_TEST_TMPDIR/err"; }
    for in in p g; do
        for b in 1 3 16; do
            for dev in cpu cpu-guarded; do
                gen --input "$BATS_TEST_TMPDIR/$in.jsonl" --output "$BATS_TEST_TMPDIR/$in.$b.$dev" --max-batch $b --device $dev
            done
            cmp "$BATS_TEST_TMPDIR/$in.$b.cpu" "$BATS_TEST_TMPDIR/$in.$b.cpu-guarded"
        done
    done
    [ "$(wc -l < "$BATS_TEST_TMPDIR/p.1.cpu")" -eq 16 ]
    grep -q '| device               | cpu-guarded' "$BATS_TEST_TMPDIR/err"
    # 12 blocks of 8 tokens: sequences preempted and recomputed, blocks reused; a 40-token prompt in
    # steps of 24 tokens is fed in chunks
    for dev in cpu cpu-guarded; do
        gen --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/k.$dev" --max-batch 16 --block-size 8 \
            --kv-cache-mem 0.125 --max-batch-tokens 24 --device $dev
    done
    tail -1 "$BATS_TEST_TMPDIR/err"
    grep -q 'KV 12 blocks x 8 tokens' "$BATS_TEST_TMPDIR/err"
    run ! grep -q ' 0 preemptions' "$BATS_TEST_TMPDIR/err"
    cmp "$BATS_TEST_TMPDIR/k.cpu" "$BATS_TEST_TMPDIR/k.cpu-guarded"
    cmp "$BATS_TEST_TMPDIR/p.16.cpu" "$BATS_TEST_TMPDIR/k.cpu"
}

@test "device: generate on cpu-guarded under a sliding window larger than the pool (recomputed in chunks, blocks freed) equals cpu" {
    # tests/generate.bats' pool-of-3 case on mistral_swa (W = 4, blocks of 5 tokens)
    printf '%s\n' '{"input_ids": [82, 35], "max_new_tokens": 21}' \
        '{"input_ids": [97, 48, 104, 91, 123, 110, 97, 86, 121, 70], "max_new_tokens": 22}' \
        '{"input_ids": [6, 110, 62, 102, 123, 34, 86, 9, 118, 23, 17, 50, 63], "max_new_tokens": 20}' \
        '{"input_ids": [114], "max_new_tokens": 38}' > "$BATS_TEST_TMPDIR/p.jsonl"
    for dev in cpu cpu-guarded; do
        "$TANDEM" generate --model "$FIX/models/mistral_swa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.$dev" \
            --greedy --ignore-eos --logprobs 1 --block-size 5 --kv-cache-mem 0.008544921875 --threads 2 --device $dev 2> "$BATS_TEST_TMPDIR/e"
    done
    grep -q 'KV 3 blocks x 5 tokens' "$BATS_TEST_TMPDIR/e"
    run ! grep -q ' 0 preemptions' "$BATS_TEST_TMPDIR/e"
    cmp "$BATS_TEST_TMPDIR/o.cpu" "$BATS_TEST_TMPDIR/o.cpu-guarded"
}

@test "device: bench runs on cpu-guarded (prefill and --generate) and names the device" {
    need_story
    run "$TANDEM" bench --model "$STORIES" $G --threads 1 --batch 2 --seq 16 --iters 1
    echo "$output"
    [ "$status" -eq 0 ]
    echo "$output" | grep '^{"bench": "prefill"' | jq -e '.tokens_per_s > 0'
    [[ "$output" == *"| device               | cpu-guarded"* ]]
    run "$TANDEM" bench --model "$STORIES" $G --threads 1 --generate --seq 4 --new-tokens 4 --big-batch 2 --iters 1
    [ "$status" -eq 0 ]
    echo "$output" | grep '^{"bench": "generate"' | jq -e '.decode_b1_tokens_per_s > 0'
}

@test "device: --device cuda without the backend or a GPU, an unknown device: one line each" {
    P="$BATS_TEST_TMPDIR/p.jsonl"
    echo '{"input_ids": [1, 2]}' > "$P"
    M="$FIX/models/llama_gqa"
    if ! nm "$TANDEM" | grep -qE ' [DdRr] cuda_backend$'; then   # (a weak undefined "w" when not linked)
        run_one_line "--device cuda: this build has no CUDA backend (nvcc was not found when it was built)" \
            "$TANDEM" generate --model "$M" --input "$P" --output "$BATS_TEST_TMPDIR/o.jsonl" --device cuda
    else   # built with CUDA: without a GPU, open's reason
        nvidia-smi -L >/dev/null 2>&1 && skip "a GPU is present: --device cuda runs"
        run_one_line "--device cuda: " "$TANDEM" generate --model "$M" --input "$P" --output "$BATS_TEST_TMPDIR/o.jsonl" --device cuda
    fi
    run_one_line "--device bogus: expected cpu or cuda" "$TANDEM" eval --model "$M" --reference "$FIX/refs/llama_gqa.jsonl" --device bogus
}

@test "device: tp, pp and dp on cpu-guarded (buffers staged through host memory) equal cpu: eval tp 2, generate tp 2 x pp 2 and dp 3" {
    need_story
    M="$FIX/models/llama_gqa"
    for dev in cpu cpu-guarded; do
        timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$M" --reference "$FIX/refs/llama_gqa.jsonl" --dtype fp32 --tp 2 \
            --max-logprob-diff 1e-4 --device $dev --threads 1 --quiet > "$BATS_TEST_TMPDIR/eval.$dev"
        jq -c 'del(.seconds)' "$BATS_TEST_TMPDIR/eval.$dev" > "$BATS_TEST_TMPDIR/e.$dev"
        for L in "4 --tp 2 --pp 2" "3"; do
            set -- $L
            timeout 60 $MPIRUN $1 "$TANDEM" generate --model "$STORIES" --input "$TRAIN" --output "$BATS_TEST_TMPDIR/g$1.$dev" \
                ${@:2} --max-new-tokens 12 --temperature 0.8 --seed 3 --logprobs 2 --threads 1 --device $dev 2>/dev/null
        done
    done
    cmp "$BATS_TEST_TMPDIR/e.cpu" "$BATS_TEST_TMPDIR/e.cpu-guarded"
    cmp "$BATS_TEST_TMPDIR/g4.cpu" "$BATS_TEST_TMPDIR/g4.cpu-guarded"
    cmp "$BATS_TEST_TMPDIR/g3.cpu" "$BATS_TEST_TMPDIR/g3.cpu-guarded"
    cmp "$BATS_TEST_TMPDIR/g4.cpu" "$BATS_TEST_TMPDIR/g3.cpu"   # and the layouts agree
}
