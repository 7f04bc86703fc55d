#!/usr/bin/env bash
# Mixed precision (issue 28): Tandem --dtype bf16 against --dtype fp32, llama.cpp BF16 and PyTorch
# (fp32, and bf16 autocast) on random models of real shapes, every figure with its baseline from the
# same run: llama2.c's 110M shape and TinyLlama's 1.1B shape (dim 2048, 22 layers, 32 heads, 4 kv
# heads, ffn 5632, vocab 32000).
#   load      peak RSS right after loading against the weights held (`bench`'s "load" line)
#   decode    batch 1 against the read-bandwidth bound of its own round, batch 32, prefill
#             (`bench --generate`); llama.cpp: llama-bench tg 32 (batch 1), pp 256 (prefill) and
#             llama-batched-bench at 32 sequences
#   train     one AdamW step's tokens/s and peak RSS (`bench --train`; PyTorch: bench/train_pytorch.py)
# Usage: bench/bf16.sh [THREADS] [LLAMA_CPP_DIR] [PYTHON] [SHAPES]
#   LLAMA_CPP_DIR: a llama.cpp tree built OUTSIDE the project (build/bin/llama-bench, and its
#   convert_hf_to_gguf.py + gguf-py), e.g. vendor/llama.cpp of the sdist that
#   `pip download --no-deps --no-binary :all: llama-cpp-python` fetches, built with
#   `cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON && cmake --build build -j --target
#   llama-bench llama-batched-bench`. Without it the llama.cpp rows are skipped, and said so.
#   PYTHON: torch + transformers (default .venv/bin/python). SHAPES: default "110M 1.1B".
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; LL=${2:-}; PY=${3:-.venv/bin/python}; SHAPES=${4:-"110M 1.1B"}
TOK=../shared/assets/tokenizers/llama2/tokenizer.model   # llama.cpp's converter needs a real vocabulary
mkdir -p build/bench
shape_of() { [ "$1" = 1.1B ] && echo 2048,5632,22,32,4,32000,2048 || echo "$1"; }
field() { jq -r ".$2" <<<"$1"; }

for s in $SHAPES; do
    dir=build/bench/$s-tok
    [ -d $dir ] || bin/tandem convert --from random --shape "$(shape_of $s)" --tokenizer $TOK --out $dir >/dev/null 2>&1
    echo "== $s ($(jq -c '[.hidden_size, .intermediate_size, .num_hidden_layers, .num_attention_heads, .num_key_value_heads, .vocab_size]' $dir/config.json))"
    new=32; [ $s = 1.1B ] && new=16
    for d in fp32 bf16; do
        out=$(bin/tandem bench --generate --model $dir --dtype $d --seq 16 --new-tokens $new --threads "$TH" --iters 3 2>build/bench/err.txt | tail -1)
        load=$(grep '"bench": "load"' build/bench/err.txt)
        echo "tandem $d load:   weights $(field "$load" weights_mib) MiB, peak RSS $(field "$load" peak_rss_mib) MiB = $(field "$load" peak_over_weights)x"
        echo "tandem $d decode: batch 1 $(field "$out" decode_b1_tokens_per_s) tok/s = $(field "$out" fraction_of_bound) of its round's bound ($(field "$out" bound_tokens_per_s) tok/s at $(field "$out" read_gb_s) GB/s, $(field "$out" weight_mb_per_token) MB/token); batch 32 $(field "$out" decode_b32_tokens_per_s) tok/s; prefill $(field "$out" prefill_tokens_per_s) tok/s"
        eval "b1_$d=$(field "$out" decode_b1_tokens_per_s)"
    done
    awk -v a="$b1_bf16" -v b="$b1_fp32" 'BEGIN { printf "tandem decode batch 1: bf16 / fp32 = %.2fx\n", a / b }'
    if [ -n "$LL" ] && [ -x "$LL/build/bin/llama-bench" ]; then
        g=build/bench/$s-bf16.gguf
        # convert_hf_to_gguf.py under Debian's torch 1.13 needs the float8 dtypes it names to exist
        [ -f $g ] || PYTHONPATH="$LL/gguf-py" "$PY" -c 'import runpy, sys, torch
for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    hasattr(torch, n) or setattr(torch, n, torch.float32)
sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0]); runpy.run_path(sys.argv[0], run_name="__main__")' "$LL/convert_hf_to_gguf.py" $dir --outtype bf16 --no-lazy --outfile $g >/dev/null 2>&1
        tg=$("$LL/build/bin/llama-bench" -m $g -t "$TH" -p 0 -n $new -r 3 -o json 2>/dev/null | jq '.[0].avg_ts')
        pp=$("$LL/build/bin/llama-bench" -m $g -t "$TH" -p 256 -n 0 -r 2 -o json 2>/dev/null | jq '.[0].avg_ts')
        bb=$("$LL/build/bin/llama-batched-bench" -m $g -t "$TH" -c 4096 -b 512 -ub 512 -npp 16 -ntg $new -npl 32 --output-format jsonl 2>/dev/null | grep '^{' | tail -1 | jq '.speed_tg')
        echo "llama.cpp BF16:   batch 1 $tg tok/s; batch 32 $bb tok/s; prefill (256) $pp tok/s"
        awk -v a="$b1_bf16" -v b="$tg" 'BEGIN { printf "tandem bf16 / llama.cpp BF16, decode batch 1 = %.2fx\n", a / b }'
    else
        echo "llama.cpp: skipped (no LLAMA_CPP_DIR with build/bin/llama-bench given)"
    fi
    # training: 110M at 4 x 256; 1.1B at 1 x 128 (its fp32 optimizer state alone is 17.6 GB)
    A="--batch 4 --seq 256"; [ $s = 1.1B ] && A="--batch 1 --seq 128"
    for d in fp32 bf16; do
        t=$(bin/tandem bench --train --model $dir --dtype $d $A --iters 2 --threads "$TH" 2>/dev/null)
        echo "tandem $d train:  $(field "$t" tokens_per_s) tok/s, peak RSS $(field "$t" peak_rss_mib) MiB"
        eval "tr_$d=$(field "$t" tokens_per_s); rss_$d=$(field "$t" peak_rss_mib)"
    done
    awk -v a="$tr_bf16" -v b="$tr_fp32" -v c="$rss_bf16" -v d="$rss_fp32" 'BEGIN { printf "tandem train bf16 / fp32: speed %.2fx, peak RSS %.2fx\n", a / b, c / d }'
    # PyTorch at 110M only: at 1.1B its fp32 weights, gradients and AdamW state (17.6 GB) plus
    # autocast's bf16 weight copies do not fit this machine's 23 GB beside the system
    [ $s = 1.1B ] && { echo "pytorch: skipped at 1.1B (memory)"; continue; }
    for ac in "" --autocast; do
        # torch 1.13's CPU autocast has no fast bf16 GEMM on a CPU without AVX512_BF16: its step can
        # take minutes; 600 s bounds it, and a timeout is reported as such
        p=$(OMP_WAIT_POLICY=PASSIVE timeout 600 "$PY" bench/train_pytorch.py --model $dir $A --iters 2 --threads "$TH" $ac 2>/dev/null) ||
            { echo "pytorch ${ac:-fp32}: no result within 600 s (3 steps)"; continue; }
        echo "$(field "$p" impl) train: $(field "$p" tokens_per_s) tok/s, peak RSS $(field "$p" peak_rss_mib) MiB"
        awk -v a="$tr_bf16" -v b="$(field "$p" tokens_per_s)" -v n="$(field "$p" impl)" 'BEGIN { printf "tandem bf16 / %s = %.2fx\n", n, a / b }'
    done
done
