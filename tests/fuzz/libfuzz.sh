#!/usr/bin/env bash
# In-process fuzzing of the input parsers with libFuzzer under ASan/UBSan (clang): one harness per
# input kind, tests/fuzz/fuzz_*.c (each says what it feeds where and which invariants it checks):
#   records  SFT records and preference pairs through data_open (train/records.c, train/data.c)
#   prompts  prompt lines: generate's requests_open / requests_next and ppo's experience_read_prompts
#   reward   a reward program's reply lines (rlhf/reward_cmd.c) and a reward server's answer (reward_http.c)
#   hub      the Hub API's file-list answer (runtime/hub.c)
# Builds libtandem and the harnesses with clang in a scratch copy of the tree (the Makefile's rules,
# CC=clang, -fsanitize=fuzzer,address,undefined, UBSan fatal), seeds each from tests/fixtures and a
# few hand-written inputs, runs each for RUNS executions with a fixed seed (one process, -jobs=1),
# and prints the executions per target and in all. A user_error is a rejected input, not a crash
# (harness.h); a sanitizer report, a CHECK, an exit or a broken invariant is. Problems are kept in
# fuzz-problems/libfuzz/ (reproduce: the harness binary with the file as its argument; KEEP=1 keeps
# the build in fuzz-problems/libfuzz/bin). The exit status is non-zero if there were any.
# Usage: bash tests/fuzz/libfuzz.sh [RUNS per target, default 25000] [SEED, default 1] [TARGET ...]
# Minutes, not seconds: a developer tool, not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-25000} seed=${2:-1}
shift $(($# < 2 ? $# : 2))
targets=${*:-records prompts reward hub}
root=$PWD
export TANDEM_FUZZ_ASSETS=${TANDEM_FUZZ_ASSETS:-$(cd "$root/.." && pwd)/shared/assets}
out=$root/fuzz-problems/libfuzz
mkdir -p "$out"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar --exclude=./build --exclude=./bin --exclude=./.git --exclude=./.venv --exclude=./fuzz-problems -cf - . |
    tar -xf - -C "$src"
# vptr: its C++ runtime would need clang++ to link; the C++ here is only a SentencePiece wrapper
san="-fsanitize=fuzzer,address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
bins=""
for t in $targets; do
    cp "tests/fuzz/fuzz_$t.c" "$src/tests/fuzz_$t.c"   # the Makefile's build/tests/% rule links it
    bins="$bins build/tests/fuzz_$t"
done
# KERNEL_FLAGS: clang has no --param avoid-fma-max-bits (the kernels' numerics do not matter here)
make -C "$src" --no-print-directory -j"$(nproc)" CC=clang CXX=clang++ OPT="-O1 -g $san" \
    KERNEL_FLAGS=-ffp-contract=fast $bins >"$src/build.log" 2>&1 || { tail -30 "$src/build.log"; exit 1; }

# seeds: fixtures behind the harness's settings bytes (see each fuzz_*.c), and hand-written ones
seeds=$src/seeds
seed_file() { mkdir -p "$seeds/$1"; { printf "$3"; head -c 3000 "$4"; } >"$seeds/$1/$2"; }
seed_text() { mkdir -p "$seeds/$1"; printf '%s' "$3" >"$seeds/$1/$2"; }
for f in tests/fixtures/sft_data/*; do
    seed_file records "sft-$(basename "$f")" '\000\100' "$f"
    seed_file records "sft-skip-$(basename "$f")" '\042\020' "$f"
done
seed_file records pref-text '\001\100' tests/fixtures/pref/story_train.jsonl
seed_file records pref-text-bpe '\041\010' tests/fixtures/pref/story_val.jsonl
seed_text records pref-chat $'\101\100{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}], "rejected": [{"role": "assistant", "content": "go"}], "margin": 0.5}\n{"chosen": "Human: a\\n\\nAssistant: yes", "rejected": "Human: a\\n\\nAssistant: no"}\n'
seed_text records pref-sharegpt $'\201\100[{"conversations": [{"from": "human", "value": "hi"}], "chosen": {"from": "gpt", "value": "hello"}, "rejected": {"from": "gpt", "value": "bye"}, "system": "be kind"}]'
seed_file prompts generate '\000' examples/prompts.jsonl
seed_file prompts ppo '\001' tests/fixtures/ppo/story_prompts_train.jsonl
seed_file prompts ppo-bpe '\003' tests/fixtures/pref/story_prompts_val.jsonl
seed_text prompts fields $'\022{"id": 7, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.1, "presence_penalty": 0.1, "frequency_penalty": 0.2, "seed": -1, "max_new_tokens": 8, "min_new_tokens": 2, "logprobs": 2, "stop": ["\\n", "x"], "stop_token_ids": [1, 2]}\n{"input_ids": [1, 5, 9], "id": "s", "label": {"answer": 4}}\n'
seed_text prompts truncate $'\005{"prompt": "Once upon a time there was a little girl who liked to play in the park with her friends every day and night", "max_new_tokens": 40}\n'
seed_text reward one $'\000{"reward": 1}\n'
seed_text reward index $'\003{"reward": 0.5, "index": 0}\n{"reward": -1e6, "index": 1}\n{"reward": 0, "extra": [1]}\n{"reward": 2}'
seed_text reward server $'\201{"rewards": [1, -0.5], "extra_logs": {}}'
seed_text hub default $'\000{"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [{"rfilename": "config.json", "blobId": "89abcdef0123456789abcdef0123456789abcdef", "size": 535}, {"rfilename": "model.safetensors", "blobId": "fedcba9876543210fedcba9876543210fedcba98", "size": 1044984, "lfs": {"sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "size": 1044984, "pointerSize": 134}}, {"rfilename": "sub/tokenizer.json", "blobId": "0000000000000000000000000000000000000000", "size": 0}]}'
seed_text hub huge-size $'\000{"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [{"rfilename": "model.safetensors", "blobId": "89abcdef0123456789abcdef0123456789abcdef", "size": 1e300}]}'
seed_text hub include $'\002{"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [{"rfilename": "tokenizer.model", "blobId": "89abcdef0123456789abcdef0123456789abcdef", "size": 7522}, {"rfilename": "a.json", "blobId": "89abcdef0123456789abcdef0123456789abcdef", "size": 2}]}'

status=0 total=0
for t in $targets; do
    leaks=0   # a user_error leaves what the parser held (tandem exits there): see harness.h
    [ "$t" = reward ] && leaks=1
    mkdir -p "$src/corpus/$t"
    log=$out/$t.log
    set +e
    (cd "$src" && ASAN_OPTIONS=detect_leaks=$leaks "$src/build/tests/fuzz_$t" -runs="$runs" -seed="$seed" -max_len=4096 -timeout=20 -rss_limit_mb=2048 \
        -detect_leaks=$leaks -print_final_stats=1 -artifact_prefix="$out/$t-" "corpus/$t" "seeds/$t") >"$log" 2>&1
    rc=$?
    set -e
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    total=$((total + ${n:-0}))
    if [ $rc -ne 0 ]; then
        status=1
        echo "fuzz_$t: FAILED after ${n:-?} executions (exit $rc): $(grep -m1 -E 'ERROR|runtime error|invariant|deadly' "$log" || true)"
        echo "  log: $log; input: $(ls -t "$out/$t-"* 2>/dev/null | head -1)"
    else
        echo "fuzz_$t: $n executions, $(ls "$src/corpus/$t" | wc -l) new corpus inputs, no problem"
    fi
done
echo "libfuzz: $total executions in all (seed $seed)"
if [ -n "${KEEP:-}" ]; then mkdir -p "$out/bin" && cp "$src"/build/tests/fuzz_* "$out/bin/"; fi
exit $status
