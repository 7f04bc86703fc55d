#!/usr/bin/env bash
# The CPU's bf16 choices (issue 43), each against its baseline in the same run, rounds alternating:
#   dot   --cpu-bf16-dot native (AVX512_BF16's vdpbf16ps; emulated, and slow, where the CPU lacks it:
#         the script says which) against exact, both --dtype bf16: each forward matmul's GFLOP/s at
#         N = 1, 32, 512 (`bench --kernels`), and decode at batch 1 and 32 after 16-token prompts with
#         prefill (`bench --generate`)
#   kv    --kv-dtype bf16 against fp32 at long contexts (the 110M shape with 2048 positions): the
#         attention kernel alone at N = 1 and 32 sequences of CTX cached keys (`bench --kernels
#         --seq CTX`), and decode at batch 1 and 4 after CTX-token prompts (`bench --generate`)
# Every row prints each round's numbers, their medians and the median ratio.
# Usage: bench/cpu_bf16.sh [THREADS] [ROUNDS] [SHAPES] [CONTEXTS]
#   SHAPES: default "110M 1.1B" (dot; "none" skips it); CONTEXTS: default "1024 2000" (kv; "none" skips it)
#   KITERS (environment): `bench --kernels --iters`, default 3
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; R=${2:-3}; SHAPES=${3:-"110M 1.1B"}; CTXS=${4:-"1024 2000"}; KITERS=${KITERS:-3}
[ "$SHAPES" = none ] && SHAPES=""
TOK=../shared/assets/tokenizers/llama2/tokenizer.model
mkdir -p build/bench
shape_of() { case $1 in 1.1B) echo 2048,5632,22,32,4,32000,2048 ;; 110M-2k) echo 768,2048,12,12,12,32000,2048 ;; *) echo "$1" ;; esac; }
model() { local dir=build/bench/$1-tok; [ -d $dir ] || bin/tandem convert --from random --shape "$(shape_of $1)" --tokenizer $TOK --out $dir >/dev/null 2>&1; echo $dir; }
med() { sort -g | awk '{ a[NR] = $1 } END { printf "%.4g\n", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
# summary FILE A B: per key (the line's first fields), medians of A and B runs and of the round ratios B / A
summary() {
    awk '{ k = $2; for (i = 3; i < NF; i++) k = k " " $i; print k }' "$1" | awk '!seen[$0]++' | while read -r key; do
        col() { awk -v m="$1" -v k="$key" '{ kk = $2; for (i = 3; i < NF; i++) kk = kk " " $i } $1 == m && kk == k { print $NF }' "$2"; }
        xa=$(col "$2" "$1"); xb=$(col "$3" "$1")
        ratios=$(paste <(echo "$xa") <(echo "$xb") | awk '$1 > 0 { printf "%.3f\n", $2 / $1 }')
        printf "  %-40s %s %9s  %s %9s  %s / %s: median of rounds %sx (rounds: %s)\n" "$key" "$2" "$(echo "$xa" | med)" "$3" \
            "$(echo "$xb" | med)" "$3" "$2" "$(echo "$ratios" | med)" "$(echo "$ratios" | paste -sd' ')"
    done
}

hw=$(grep -qw avx512_bf16 /proc/cpuinfo && echo "the instruction (avx512_bf16)" || echo "EMULATED (this CPU has no avx512_bf16)")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $TH threads, $R rounds; --cpu-bf16-dot native runs $hw"

for s in $SHAPES; do
    dir=$(model $s)
    out=build/bench/cpu_bf16_dot_$s.txt; : > $out
    for r in $(seq 1 "$R"); do
        for dot in exact native; do
            bin/tandem bench --kernels --model $dir --dtype bf16 --cpu-bf16-dot $dot --threads "$TH" --iters "$KITERS" 2>/dev/null |
                jq -r --arg d $dot 'select(.kernel != null and (.kernel | test("proj|lm_head"))) | "\($d) matmul GFLOP/s \(.kernel) N=\(.N) \(.tflop_s * 1000)"' >> $out
            new=32; [ $s = 1.1B ] && new=16
            g=$(bin/tandem bench --generate --model $dir --dtype bf16 --cpu-bf16-dot $dot --seq 16 --new-tokens $new --threads "$TH" --iters 1 2>/dev/null | tail -1)
            jq -r --arg d $dot '"\($d) decode batch 1 tok/s \(.decode_b1_tokens_per_s)", "\($d) decode batch 32 tok/s \(.decode_b32_tokens_per_s)", "\($d) prefill 32x16 tok/s \(.prefill_tokens_per_s)"' <<<"$g" >> $out
        done
    done
    echo "== $s --cpu-bf16-dot: exact vs native (--dtype bf16)"
    summary $out exact native
done

[ "$CTXS" = none ] && exit 0
dir=$(model 110M-2k)
out=build/bench/cpu_bf16_kv.txt; : > $out
for r in $(seq 1 "$R"); do
    for kv in fp32 bf16; do
        for ctx in $CTXS; do
            bin/tandem bench --kernels --model $dir --kv-dtype $kv --seq $ctx --threads "$TH" --iters "$KITERS" 2>/dev/null |
                jq -r --arg d $kv --arg c $ctx 'select(.kernel == "attention_decode") | "\($d) attention_decode ctx=\($c) N=\(.N) us \(.us)"' >> $out
            g=$(bin/tandem bench --generate --model $dir --kv-dtype $kv --seq $ctx --new-tokens 16 --big-batch 4 --threads "$TH" --iters 1 2>/dev/null | tail -1)
            jq -r --arg d $kv --arg c $ctx '"\($d) decode ctx=\($c) batch 1 tok/s \(.decode_b1_tokens_per_s)", "\($d) decode ctx=\($c) batch 4 tok/s \(.decode_b4_tokens_per_s)"' <<<"$g" >> $out
        done
    done
done
echo "== 110M (2048 positions) --kv-dtype: fp32 vs bf16 (fp32 weights; attention in microseconds, lower is better)"
summary $out fp32 bf16
