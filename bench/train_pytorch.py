"""PyTorch baseline for `tandem bench --train`: the same HF model directory, batch, sequence length
and threads; forward + backward + AdamW per step, median of --iters steps after one warm-up; --autocast runs the
forward under torch.autocast(bfloat16) (the mixed precision Tandem's --dtype bf16 is compared with).
Benchmark-only dependency: Debian's python3-torch 1.13 + pip transformers 4.47.1 (as the fixtures).
Run with OMP_WAIT_POLICY=PASSIVE (see ../shared/NOTES.md: otherwise torch's OpenMP threads and
OpenBLAS's fight and 2 threads come out slower than 1). Prints one JSON line."""
import argparse, json, resource, statistics, time

import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--iters", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--autocast", action="store_true", help="bf16 autocast forward (fp32 weights and optimizer)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager")
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq))
times = []
for it in range(a.iters + 1):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if it:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"bench": "train", "impl": "pytorch " + torch.__version__ + (" bf16 autocast" if a.autocast else " fp32"),
                  "batch": a.batch, "seq": a.seq,
                  "threads": a.threads, "tokens_per_s": round(a.batch * a.seq / med, 1), "step_s": round(med, 4),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
