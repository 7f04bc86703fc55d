#!/usr/bin/env bash
# The main job: batch generation on the default model ($TANDEM_MODEL if set, else
# ../shared/assets/models/stories260K-hf) for examples/prompts.jsonl, then the completions.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${TANDEM_MODEL:-../shared/assets/models/stories260K-hf}"
if [ ! -d "$MODEL" ]; then
    echo "tandem: no model found. Set TANDEM_MODEL to a Hugging Face model directory (config.json +" >&2
    echo "        *.safetensors + tokenizer), or convert a llama2.c checkpoint: bin/tandem convert MODEL.bin --out DIR" >&2
    exit 1
fi
OUT=${TANDEM_OUTPUT:-build/completions.jsonl}
mkdir -p "$(dirname "$OUT")"
bin/tandem generate --model "$MODEL" --input examples/prompts.jsonl --output "$OUT" --max-new-tokens 64 --progress
echo
echo "completions ($OUT):"
jq -r '"[\(.id)] \(.prompt) >>>\(.completion)  (\(.finish_reason), \(.completion_tokens) tokens)\n"' "$OUT"
