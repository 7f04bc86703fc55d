#!/usr/bin/env bash
# The main job on the default model: $TANDEM_MODEL if set, else ../shared/assets/models/stories260K-hf.
# Until `tandem generate` lands this is `tandem eval`: Hugging Face parity of the model against
# its committed reference (or, for your own model, its perplexity on examples/data.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT=../shared/assets/models/stories260K-hf
MODEL="${TANDEM_MODEL:-$DEFAULT}"
if [ ! -d "$MODEL" ]; then
    echo "tandem: no model found. Set TANDEM_MODEL to a Hugging Face model directory (config.json +" >&2
    echo "        *.safetensors), or convert a llama2.c checkpoint: bin/tandem convert MODEL.bin --out DIR" >&2
    exit 1
fi
if [ -z "${TANDEM_MODEL:-}" ]; then
    exec bin/tandem eval --model "$MODEL" --reference tests/fixtures/refs/stories260K.jsonl
fi
echo "model: $MODEL (perplexity on examples/data.jsonl; write a reference with eval/hf_reference.py for parity)" >&2
exec bin/tandem eval --model "$MODEL" --data examples/data.jsonl
