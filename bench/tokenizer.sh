#!/usr/bin/env bash
# Tokenizer encode speed: Tandem (SentencePiece via libsentencepiece; byte-level BPE in C) against
# Debian's spm_encode CLI on the same text, measured in the same run. Prints the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
TEXT=${1:-../shared/assets/data/pretrain/tinyshakespeare.txt}
SPM=../shared/assets/tokenizers/llama2/tokenizer.model
BPE=../shared/assets/tokenizers/gpt2/tokenizer.json
bytes=$(stat -c %s "$TEXT")
best=999
for i in 1 2 3; do
    t0=$(date +%s.%N); spm_encode --model "$SPM" --output_format=id < "$TEXT" > /dev/null; t1=$(date +%s.%N)
    best=$(awk -v a="$best" -v t0="$t0" -v t1="$t1" 'BEGIN { b = t1 - t0; print (b < a) ? b : a }')
done
spm=$(awk -v n="$bytes" -v t="$best" 'BEGIN { printf "%.3f", n / t / 1e6 }')
echo "{\"bench\": \"tokenizer\", \"tokenizer\": \"spm_encode CLI\", \"encode_mb_per_s\": $spm}"
out=$(bin/tandem bench --tokenizer "$SPM,$BPE" --text "$TEXT" --iters 3)
echo "$out"
ours=$(sed -n 1p <<<"$out" | grep -oE '"encode_mb_per_s": [0-9.]+' | cut -d' ' -f2)
awk -v a="$ours" -v b="$spm" 'BEGIN { printf "sentencepiece: tandem / spm_encode = %.2fx\n", a / b }'
