#!/usr/bin/env bash
# Mixed precision (issue 28): Tandem --dtype bf16 against --dtype fp32, llama.cpp BF16 and PyTorch
# (fp32, and bf16 autocast) on random models of real shapes, every figure with its baseline from the
# same run: llama2.c's 110M shape and TinyLlama's 1.1B shape (dim 2048, 22 layers, 32 heads, 4 kv
# heads, ffn 5632, vocab 32000).
#   load      peak RSS right after loading against the weights held (`bench`'s "load" line)
#   decode    batch 1 against the read-bandwidth bound of its own round, batch 32 after 16-token
#             prompts (`bench --generate`; its prefill figure is those 32 x 16 prompts); llama.cpp:
#             llama-bench tg (batch 1) and llama-batched-bench at 32 sequences
#   prefill   the same work on both sides: 8 prompts x 256 tokens to the last position's logits, through
#             `tandem generate` as a user runs it (--max-new-tokens 1; its "prefill ... tok/s") and
#             through `bench --batch 8 --seq 256` (one forward, every position's logits); llama.cpp:
#             llama-batched-bench -npp 256 -npl 8 -ntg 1 (its prompt-processing speed, the 8 prompts
#             in one batch). Without llama-batched-bench, llama-bench -p 256 (1 x 256) is printed
#             instead and labelled as other work.
#   train     one AdamW step's tokens/s and peak RSS (`bench --train`; PyTorch: bench/train_pytorch.py)
# Usage: bench/bf16.sh [THREADS] [LLAMA_CPP_DIR] [PYTHON] [SHAPES]
#   LLAMA_CPP_DIR: a llama.cpp tree built OUTSIDE the project (build/bin/llama-bench, and its
#   convert_hf_to_gguf.py + gguf-py), e.g. vendor/llama.cpp of the sdist that
#   `pip download --no-deps --no-binary :all: llama-cpp-python` fetches, built with
#   `cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON && cmake --build build -j --target
#   llama-bench llama-batched-bench`. Without it the llama.cpp rows are skipped, and said so.
#   A build/bin without llama-batched-bench: the batch-32 row is skipped and the prefill row falls back
#   to llama-bench's 1 x 256, said so.
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
    # prefill: 8 x 256 tokens to the last logits (ids 3.. of the vocabulary, fixed seed: no BOS, EOS or
    # special token; --ignore-eos so the one new token is always sampled)
    awk -v V="$(jq .vocab_size $dir/config.json)" 'BEGIN { srand(43); for (p = 0; p < 8; p++) { printf "{\"input_ids\": ["
        for (t = 0; t < 256; t++) printf "%s%d", t ? "," : "", 3 + int(rand() * (V - 3)); print "]}" } }' > build/bench/prefill8x256.jsonl
    for d in fp32 bf16; do
        gl=$(bin/tandem generate --model $dir --dtype $d --input build/bench/prefill8x256.jsonl --output build/bench/prefill.out \
            --max-new-tokens 1 --ignore-eos --max-batch 8 --max-batch-tokens 2048 --threads "$TH" 2>&1 | grep '^generated:')
        gp=$(sed -n 's/.*prefill steps [0-9]* tokens \([0-9.]*\) tok\/s.*/\1/p' <<<"$gl")
        bp=$(bin/tandem bench --model $dir --dtype $d --batch 8 --seq 256 --iters 3 --threads "$TH" 2>/dev/null | tail -1 | jq .tokens_per_s)
        echo "tandem $d prefill 8 x 256: generate $gp tok/s (to the last logits); bench $bp tok/s (every position's logits)"
        eval "pf_$d=$gp"
    done
    if [ -n "$LL" ] && [ -x "$LL/build/bin/llama-bench" ]; then
        g=build/bench/$s-bf16.gguf
        # convert_hf_to_gguf.py under Debian's torch 1.13 needs the float8 dtypes it names to exist
        [ -f $g ] || PYTHONPATH="$LL/gguf-py" "$PY" -c 'import runpy, sys, torch
for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    hasattr(torch, n) or setattr(torch, n, torch.float32)
sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0]); runpy.run_path(sys.argv[0], run_name="__main__")' "$LL/convert_hf_to_gguf.py" $dir --outtype bf16 --no-lazy --outfile $g >/dev/null 2>&1
        tg=$("$LL/build/bin/llama-bench" -m $g -t "$TH" -p 0 -n $new -r 3 -o json 2>/dev/null | jq '.[0].avg_ts')
        if [ -x "$LL/build/bin/llama-batched-bench" ]; then
            BB="$LL/build/bin/llama-batched-bench"
            bb=$("$BB" -m $g -t "$TH" -c 4096 -b 512 -ub 512 -npp 16 -ntg $new -npl 32 --output-format jsonl 2>/dev/null | grep '^{' | tail -1 | jq '.speed_tg')
            # 8 prompts of 256 in one batch (-b / -ub 2048: one ubatch, as tandem's one prefill step), 1 token each
            pp=$("$BB" -m $g -t "$TH" -c 2064 -b 2048 -ub 2048 -npp 256 -ntg 1 -npl 8 --output-format jsonl 2>/dev/null | grep '^{' | tail -1 | jq '.speed_pp')
            echo "llama.cpp BF16:   batch 1 $tg tok/s; batch 32 $bb tok/s; prefill 8 x 256 $pp tok/s"
            awk -v a="$pf_bf16" -v b="$pp" 'BEGIN { printf "tandem bf16 (generate) / llama.cpp BF16, prefill 8 x 256 = %.2fx\n", a / b }'
        else
            pp=$("$LL/build/bin/llama-bench" -m $g -t "$TH" -p 256 -n 0 -r 2 -o json 2>/dev/null | jq '.[0].avg_ts')
            echo "llama.cpp BF16:   batch 1 $tg tok/s; batch 32 skipped (no llama-batched-bench); prefill 1 x 256 $pp tok/s" \
                "(llama-bench: ONE 256-token prompt, not tandem's 8 x 256)"
        fi
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
