#!/usr/bin/env bash
# Issue 29 item 5, in one run: per-rank memory of plain dp, ZeRO-1, ZeRO-2 and ZeRO-3 at dp 4 and of
# tp 2 with and without --sequence-parallel, and the bytes a rank sends per step.
#  1. Plans at the 1.1B TinyLlama shape (dim 2048, 22 layers, 32 / 4 heads, ffn 5632, vocab 32000),
#     from `bench --train --plan`: the run's own allocations, measured before the first step (nothing
#     of the gradients or moments touched). Four ranks of the whole 1.1B do not fit this VM (each
#     loads its replica's weights before ZeRO-3 slices them: 4 x 4.4 GB fp32), so the plans are
#     taken at 2 and 4 layers of the 1.1B widths and extended to 22 (every part is a + b L: the
#     layers' units are alike), and the line checks itself at 6 layers.
#  2. Real steps at the 110M shape (dp 4, 1 x 256 tokens): peak RSS and dp bytes per step against Psi.
# Usage: bench/zero.sh [DTYPE]   (bf16 by default; fp32 too)
set -euo pipefail
cd "$(dirname "$0")/.."
DT=${1:-bf16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
B=build/bench
mkdir -p $B
for L in 2 4 6; do
    [ -d $B/w1.1B-L$L ] || bin/tandem convert --from random --shape 2048,5632,$L,32,4,32000,2048 --out $B/w1.1B-L$L 2>/dev/null
done
[ -d $B/110M ] || bin/tandem convert --from random --shape 110M --out $B/110M 2>/dev/null

plan() {   # NP L ARGS... -> one JSON line
    local np=$1 L=$2; shift 2
    mpirun -q --oversubscribe -np "$np" bin/tandem bench --train --plan --model $B/w1.1B-L$L --dtype "$DT" --threads 1 "$@" 2>/dev/null |
        grep '^{"bench": "train_plan"' | jq -c --argjson L "$L" '. + {layers: $L}'
}
: > $B/zero_plans.jsonl
for L in 2 4 6; do
    for z in 0 1 2 3; do plan 4 $L --batch 1 --seq 2048 --zero $z >> $B/zero_plans.jsonl; done
    for sp in "" --sequence-parallel; do plan 2 $L --batch 1 --seq 2048 --tp 2 $sp >> $B/zero_plans.jsonl; done
done
python3 - $B/zero_plans.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ["weights_mib", "master_mib", "grads_mib", "moments_mib", "activations_mib", "total_mib"]
def name(r): return f"tp {r['tp']} dp {r['dp']} " + (f"ZeRO-{r['zero']}" if r["zero"] else "plain") + (" +SP" if r["sequence_parallel"] else "")
by = {}
for r in rows: by.setdefault(name(r), {})[r["layers"]] = r
print(f"per-rank MiB at the 1.1B shape ({rows[0]['dtype']} weights; 1 x 2048 tokens), each rank's largest part:")
print(f"{'layout':22s}" + "".join(f"{k[:-4]:>12s}" for k in keys) + "   (22 layers from 2 and 4; predicted vs measured at 6)")
for n, d in by.items():
    a = {k: (d[4][k] - d[2][k]) / 2 for k in keys}       # per layer
    c = {k: d[2][k] - 2 * a[k] for k in keys}             # the rest
    p6 = c["total_mib"] + 6 * a["total_mib"]
    print(f"{n:22s}" + "".join(f"{c[k] + 22 * a[k]:12.0f}" for k in keys) +
          f"   {p6:.1f} vs {d[6]['total_mib']:.1f}")
PY

echo "LoRA (issue 30): one rank at the 1.1B shape, 1 x 2048 tokens, $DT weights, full training vs --lora-r 16 (all seven projections):"
: > $B/lora_plans.jsonl
for L in 2 4; do for r in 0 16; do plan 1 $L --batch 1 --seq 2048 --lora-r $r >> $B/lora_plans.jsonl; done; done
python3 - $B/lora_plans.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ["weights_mib", "master_mib", "grads_mib", "moments_mib", "activations_mib", "total_mib"]
for r in (0, 16):
    d = {x["layers"]: x for x in rows if x["lora_r"] == r}
    v = {k: d[2][k] + 10 * (d[4][k] - d[2][k]) for k in keys}   # 22 layers: 2 + 20 more
    print(f"{'full' if r == 0 else 'LoRA r 16':10s}" + "".join(f"{k[:-4]:>13s} {v[k]:8.0f}" for k in keys))
PY

echo "real steps, 110M shape, dp 4, 1 x 256 tokens, $DT:"
for z in 0 1 2 3; do
    mpirun -q --oversubscribe -np 4 bin/tandem bench --train --model $B/110M --dtype "$DT" --threads 1 --batch 1 --seq 256 \
        --iters 2 --zero $z 2>/dev/null | grep '^{"bench": "train"' |
        jq -c '{zero, peak_rss_mib, steps_peak_rss_mib, tokens_per_s, dp_mib_sent_per_step, psi_mib, dp_sent_per_psi}'
done
