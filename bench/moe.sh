#!/usr/bin/env bash
# Mixture-of-Experts (issue 42, item 7): Tandem against llama.cpp BF16 on the same random models of
# real shapes (bench/moe_model.py), every ratio from the same run, the engines alternating round by
# round (this VM's 2 cores are shared: medians over ROUNDS, and each round's own ratio):
#   qwen3_moe  Qwen3-30B-A3B's widths (hidden 2048, 128 experts of 768, top 8, 32 heads / 4 kv heads
#              of 128, vocab 151936, untied), 4 of its 48 layers: 6.2 GB in bf16
#   mixtral    Mixtral-8x7B's (hidden 4096, 8 experts of 14336, top 2, 32 / 8 heads, vocab 32000),
#              2 of its 32 layers: 6.3 GB in bf16
#   decode     bf16, batch 1 and 32 sequences (prompts of P = 32 tokens, then T = 8 new tokens each):
#              `bench --generate` against llama-bench tg T (batch 1) and llama-batched-bench -npl 32.
#              Tandem runs twice per round: with OpenMP's default wait policy and with
#              OMP_WAIT_POLICY=PASSIVE (bench/zero.sh's setting): a MoE layer is hundreds of small
#              parallel regions (per expert), and on this shared VM threads spinning at their ends
#              hold the cores that the other thread needs
#   prefill    32 prompts of P tokens (`bench --generate`'s prefill, the engine's) against
#              llama-batched-bench's at -npl 32 -npp P; without llama-batched-bench, llama-bench pp
#              of one prompt of 32 P tokens (said so)
#   peak RSS   bench's own (Tandem), /usr/bin/time -v (llama.cpp; the GGUF is mmapped: its pages count)
#   train      one AdamW step (`bench --train`, bf16 weights as the checkpoint, fp32 master and
#              moments) on the Qwen3 widths with 1 layer and the embedding and head cut to 8192 rows
#              (at 151936 they alone are 622M parameters, 11 GB of optimizer state: the machine has
#              23 GB), at ep 1 and, when `tandem bench --help` lists --ep, ep 2 (two ranks); else
#              "skipped". Mixtral's widths do not train here: one layer's experts are 1.41B
#              parameters, 25 GB with AdamW. Tokens/s, peak RSS (the largest rank's), MiB each rank
#              sends per step, and the expert GEMMs: the backend's matmul calls per layer of a step
#              (bench --train's moe_gemms line), against the step's N k (token, choice) pairs.
# Models are made, converted, measured and deleted one at a time (the HF directory and the GGUF of
# one model together: ~12.5 GB of disk; memory: one engine at a time, <= ~7 GB).
# Usage: bench/moe.sh [THREADS] [LLAMA_CPP] [ROUNDS] [MODELS]
#   LLAMA_CPP (or $LLAMA_CPP_DIR): a llama.cpp tree built outside the project (build/bin/llama-bench,
#   llama-batched-bench; convert_hf_to_gguf.py + gguf-py beside it; see bench/bf16.sh), or its
#   build/bin. Without it the llama.cpp rows are skipped, and said so. ROUNDS: 3. MODELS:
#   "qwen3_moe mixtral". PYTHON: torch + safetensors (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; LL=${2:-${LLAMA_CPP_DIR:-}}; R=${3:-3}; MODELS=${4:-"qwen3_moe mixtral"}
PY=${PYTHON:-.venv/bin/python}
W=build/bench/moe
mkdir -p $W
BIN= SRC=
if [ -n "$LL" ]; then
    if [ -x "$LL/llama-bench" ]; then BIN=$(cd "$LL" && pwd); SRC=$(cd "$LL/../.." && pwd)
    elif [ -x "$LL/build/bin/llama-bench" ]; then BIN=$(cd "$LL/build/bin" && pwd); SRC=$(cd "$LL" && pwd)
    else echo "llama.cpp: no llama-bench in $LL or $LL/build/bin: its rows are skipped"; fi
fi
[ -n "$BIN" ] && [ ! -f "$SRC/convert_hf_to_gguf.py" ] && { echo "llama.cpp: no convert_hf_to_gguf.py in $SRC: its rows are skipped"; BIN=; }
med() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "–"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.2fx", a / b; else print "-" }'; }
rss_kib() { awk '/Maximum resident set size/ { print $NF }' "$1"; }

# convert_hf_to_gguf.py under Debian's torch 1.13: the dtypes it names and 1.13 lacks exist as
# distinct placeholders (one shared stand-in would collide in its dtype tables)
to_gguf() { # HF_DIR GGUF
    PYTHONPATH="$SRC/gguf-py:$SRC" "$PY" -c 'import runpy, sys, torch
for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "uint16", "uint32", "uint64"):
    hasattr(torch, n) or setattr(torch, n, type(n, (), {})())
sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' "$SRC/convert_hf_to_gguf.py" "$1" --outtype bf16 --outfile "$2" >$W/convert.log 2>&1
}

# llama.cpp's converter needs a real vocabulary of at most vocab_size pieces: GPT-2's byte-level BPE
# (50257) for the Qwen shape, Llama 2's SentencePiece (32000) for Mixtral's; the models' speed does
# not depend on it, and Tandem's bench reads no tokenizer
add_tokenizer() { # KIND DIR
    if [ $1 = qwen3_moe ]; then
        cp ../shared/assets/tokenizers/gpt2/tokenizer.json "$2/"
        echo '{"tokenizer_class": "GPT2TokenizerFast", "model_max_length": 32768}' > "$2/tokenizer_config.json"
    else
        cp ../shared/assets/tokenizers/llama2/tokenizer.model "$2/"
    fi
}

declare -A ROW   # "model|what" -> the summary table's cells
for kind in $MODELS; do
    if [ $kind = qwen3_moe ]; then L=4; else L=2; fi
    P=32 T=8
    L=${MOE_LAYERS:-$L}   # (a quicker run of the script itself)
    dir=$W/$kind-$L
    [ -f $dir/config.json ] || "$PY" bench/moe_model.py $kind $L $dir
    echo "== $kind, $L layers: $(jq -c '[.hidden_size, (.num_experts // .num_local_experts), .num_experts_per_tok, (.moe_intermediate_size // .intermediate_size), .num_attention_heads, .num_key_value_heads, .vocab_size]' $dir/config.json) (hidden, experts, top k, expert width, heads, kv heads, vocab); $(du -sh $dir | cut -f1)"
    g=
    if [ -n "$BIN" ]; then
        add_tokenizer $kind $dir
        g=$W/$kind-$L.gguf
        [ -f $g ] || to_gguf $dir $g || { echo "llama.cpp: the conversion failed ($W/convert.log): its rows are skipped"; g=; }
    fi
    declare -a t1=() t32=() tpf=() trss=() q1=() q32=() qpf=() l1=() l32=() lpf=() lrss=() r1=() r32=() rpf=() s1=() s32=() spf=()
    lpf_what="llama-batched-bench -npl 32 -npp $P"
    for r in $(seq 1 $R); do
        for pol in "" PASSIVE; do   # OpenMP's default wait policy (threads spin at a region's end), then passive
            out=$(env ${pol:+OMP_WAIT_POLICY=$pol} bin/tandem bench --generate --model $dir --dtype bf16 --seq $P --new-tokens $T \
                  --big-batch 32 --iters 1 --threads "$TH" 2>$W/err.txt | tail -1)
            if [ -z "$pol" ]; then
                t1+=($(jq .decode_b1_tokens_per_s <<<"$out")); t32+=($(jq .decode_b32_tokens_per_s <<<"$out"))
                tpf+=($(jq .prefill_tokens_per_s <<<"$out")); trss+=($(jq .peak_rss_mib <<<"$out"))
            else
                q1+=($(jq .decode_b1_tokens_per_s <<<"$out")); q32+=($(jq .decode_b32_tokens_per_s <<<"$out"))
                qpf+=($(jq .prefill_tokens_per_s <<<"$out"))
            fi
        done
        line="round $r: tandem b1 ${t1[-1]} b32 ${t32[-1]} prefill ${tpf[-1]} tok/s, peak RSS ${trss[-1]} MiB; OMP_WAIT_POLICY=PASSIVE: ${q1[-1]} ${q32[-1]} ${qpf[-1]}"
        if [ -n "$g" ]; then
            a=$(/usr/bin/time -v "$BIN/llama-bench" -m $g -t "$TH" -p 0 -n $T -r 1 -o json 2>$W/time.txt | jq '.[0].avg_ts')
            rs=$(rss_kib $W/time.txt)
            if [ -x "$BIN/llama-batched-bench" ]; then
                bb=$(/usr/bin/time -v "$BIN/llama-batched-bench" -m $g -t "$TH" -c 4096 -b 512 -ub 512 -npp $P -ntg $T -npl 32 \
                     --output-format jsonl 2>$W/time.txt | grep '^{' | tail -1)
                b=$(jq .speed_tg <<<"$bb"); p=$(jq .speed_pp <<<"$bb")
                rb=$(rss_kib $W/time.txt); [ "$rb" -gt "$rs" ] && rs=$rb
            else
                b=nan; lpf_what="llama-bench pp of one prompt of $((32 * P)) tokens (no llama-batched-bench)"
                p=$("$BIN/llama-bench" -m $g -t "$TH" -p $((32 * P)) -n 0 -r 1 -o json 2>/dev/null | jq '.[0].avg_ts')
            fi
            l1+=($a); l32+=($b); lpf+=($p); lrss+=($(awk -v k=$rs 'BEGIN { printf "%.1f", k / 1024 }'))
            r1+=($(ratio ${t1[-1]} $a | tr -d x)); r32+=($(ratio ${t32[-1]} $b | tr -d x)); rpf+=($(ratio ${tpf[-1]} $p | tr -d x))
            s1+=($(ratio ${q1[-1]} $a | tr -d x)); s32+=($(ratio ${q32[-1]} $b | tr -d x)); spf+=($(ratio ${qpf[-1]} $p | tr -d x))
            line="$line | llama.cpp b1 $a b32 $b prefill $p tok/s, peak RSS ${lrss[-1]} MiB | tandem/llama.cpp ${r1[-1]} ${r32[-1]} ${rpf[-1]}; passive ${s1[-1]} ${s32[-1]} ${spf[-1]}"
        fi
        echo "$line"
    done
    m() { printf '%s\n' "$@" | { grep -v -e '^-$' -e '^$' -e '^nan$' -e '^null$' || true; } | med; }
    for w in t1 t32 tpf trss q1 q32 qpf l1 l32 lpf lrss r1 r32 rpf s1 s32 spf; do eval "M_$w=\$(m \"\${$w[@]:-}\")"; done
    echo "medians of $R rounds ($kind): tandem decode b1 $M_t1, b32 $M_t32, prefill $M_tpf tok/s, peak RSS $M_trss MiB; with OMP_WAIT_POLICY=PASSIVE: b1 $M_q1, b32 $M_q32, prefill $M_qpf"
    if [ -n "$g" ]; then
        echo "  llama.cpp BF16: decode b1 $M_l1, b32 $M_l32, prefill $M_lpf tok/s ($lpf_what), peak RSS $M_lrss MiB"
        echo "  tandem / llama.cpp (median of the rounds' ratios): b1 ${M_r1}x, b32 ${M_r32}x, prefill ${M_rpf}x; passive: b1 ${M_s1}x, b32 ${M_s32}x, prefill ${M_spf}x"
    else
        echo "  llama.cpp: skipped (no LLAMA_CPP / LLAMA_CPP_DIR with llama-bench, or no GGUF)"
    fi
    ROW[$kind]="| $kind ($L layers) | $M_t1 · $M_q1 / $M_l1 (${M_r1}x · ${M_s1}x) | $M_t32 · $M_q32 / $M_l32 (${M_r32}x · ${M_s32}x) | $M_tpf · $M_qpf / $M_lpf (${M_rpf}x · ${M_spf}x) | $M_trss / $M_lrss |"
    [ -n "$g" ] && rm -f $g
    rm -rf $dir   # one model on disk at a time
    unset t1 t32 tpf trss q1 q32 qpf l1 l32 lpf lrss r1 r32 rpf s1 s32 spf
done

# training: one step at ep 1 and (when bench has --ep) ep 2, the same batch per rank
dir=$W/qwen3_moe-train
[ -f $dir/config.json ] || "$PY" bench/moe_model.py qwen3_moe 1 $dir 8192
TA="--model $dir --dtype bf16 --batch 2 --seq 128 --iters 2"
train_row() { # EP JSON GEMMS
    echo "train ep $1: $(jq -r '"\(.tokens_per_s) tok/s (\(.dp) x \(.batch) x \(.seq) tokens per step), peak RSS \(.peak_rss_mib) MiB per rank, sent per step per rank: dp \(.dp_mib_sent_per_step) MiB, tp \(.tp_mib_sent_per_step) MiB, ep \(.ep_mib_sent_per_step // "n/a") MiB"' <<<"$2")"
    echo "  expert GEMMs: $(jq -r '"\(.matmul_calls_per_layer) matmul calls per layer in one step for \(.tokens_x_k) (token, choice) pairs over \(.experts) experts"' <<<"$3")"
}
t=$(bin/tandem bench --train $TA --threads "$TH" 2>/dev/null)
train_row 1 "$(grep '"train"' <<<"$t")" "$(grep moe_gemms <<<"$t")"
TR1=$(grep '"train"' <<<"$t")
t=$(OMP_WAIT_POLICY=PASSIVE bin/tandem bench --train $TA --threads "$TH" 2>/dev/null)
echo -n "OMP_WAIT_POLICY=PASSIVE: "; train_row 1 "$(grep '"train"' <<<"$t")" "$(grep moe_gemms <<<"$t")"
TR1P=$(grep '"train"' <<<"$t")
if bin/tandem bench --help 2>&1 | grep -qE '^ *--ep '; then
    t=$(mpirun -q --allow-run-as-root --oversubscribe -np 2 bin/tandem bench --train $TA --threads 1 --ep 2 2>/dev/null)
    train_row 2 "$(grep '"train"' <<<"$t")" "$(grep moe_gemms <<<"$t")"
    TR2=$(grep '"train"' <<<"$t")
else
    echo "train ep 2: skipped (tandem bench --help lists no --ep$(bin/tandem sft --help 2>&1 | grep -qE '^ *--ep ' && echo '; sft has it' || echo ', nor does sft'))"
    TR2=
fi
rm -rf $dir

echo
echo "tok/s, medians of $R rounds: tandem (OpenMP's default wait policy) · tandem with OMP_WAIT_POLICY=PASSIVE / llama.cpp BF16 (the median of the rounds' tandem / llama.cpp ratios, each way)"
echo "| model (bf16) | decode batch 1 | decode 32 sequences | prefill 32 x $P | peak RSS MiB tandem / llama.cpp |"
echo "|---|---|---|---|---|"
for kind in $MODELS; do echo "${ROW[$kind]}"; done
echo
echo "| training step (Qwen3 widths, 1 layer, vocab 8192, bf16) | tok/s | peak RSS MiB (per rank) | MiB sent per step per rank (dp / tp / ep) |"
echo "|---|---|---|---|"
echo "$TR1" | jq -r '"| ep 1, 1 x 2 x 128 | \(.tokens_per_s) | \(.peak_rss_mib) | \(.dp_mib_sent_per_step) / \(.tp_mib_sent_per_step) / \(.ep_mib_sent_per_step // 0) |"'
echo "$TR1P" | jq -r '"| ep 1, OMP_WAIT_POLICY=PASSIVE | \(.tokens_per_s) | \(.peak_rss_mib) | \(.dp_mib_sent_per_step) / \(.tp_mib_sent_per_step) / \(.ep_mib_sent_per_step // 0) |"'
[ -n "$TR2" ] && echo "$TR2" | jq -r '"| ep 2, 2 x 2 x 128 | \(.tokens_per_s) | \(.peak_rss_mib) | \(.dp_mib_sent_per_step) / \(.tp_mib_sent_per_step) / \(.ep_mib_sent_per_step // "n/a") |"' ||
    echo "| ep 2 | skipped (no --ep in this build) | | |"
