#!/usr/bin/env bash
# The main job: batch generation for examples/prompts.jsonl, then the completions, on the default model:
#   $TANDEM_MODEL if set (a model directory or a Hub id ORG/NAME, fetched into the hub cache), else
#   ../shared/assets/models/stories260K-hf ($TANDEM_ASSETS replaces ../shared/assets), else
#   karpathy/tinyllamas' stories260K (the same model in llama2.c form, 1 MiB) fetched from the
#   Hugging Face Hub ($HF_ENDPOINT) and converted once into build/models/stories260K-hf.
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS="${TANDEM_ASSETS:-../shared/assets}"
MODEL="${TANDEM_MODEL:-}"
if [ -z "$MODEL" ] && [ -d "$ASSETS/models/stories260K-hf" ]; then MODEL="$ASSETS/models/stories260K-hf"; fi
if [ -z "$MODEL" ]; then
    MODEL=build/models/stories260K-hf
    if [ ! -f "$MODEL/config.json" ]; then
        echo "tandem: no local model (TANDEM_MODEL unset, $ASSETS/models/stories260K-hf absent): fetching karpathy/tinyllamas stories260K from the Hugging Face Hub" >&2
        if ! SNAP=$(bin/tandem fetch karpathy/tinyllamas --include stories260K/stories260K.bin,stories260K/tok512.model --retries 2); then
            echo "tandem: no model to run. Set TANDEM_MODEL to a Hugging Face model directory (config.json + *.safetensors +" >&2
            echo "        tokenizer) or a Hub id ORG/NAME (fetched when the network allows; HF_ENDPOINT for a mirror), or put" >&2
            echo "        the assets at $ASSETS" >&2
            exit 1
        fi
        rm -rf "$MODEL.tmp"
        bin/tandem convert --from llama2c "$SNAP/stories260K/stories260K.bin" --tokenizer "$SNAP/stories260K/tok512.model" --out "$MODEL.tmp"
        mv "$MODEL.tmp" "$MODEL"
    fi
fi
OUT=${TANDEM_OUTPUT:-build/completions.jsonl}
mkdir -p "$(dirname "$OUT")"
bin/tandem generate --model "$MODEL" --input examples/prompts.jsonl --output "$OUT" --max-new-tokens 64 --progress
echo
echo "completions ($OUT):"
jq -r '"[\(.id)] \(.prompt) >>>\(.completion)  (\(.finish_reason), \(.completion_tokens) tokens)\n"' "$OUT"
