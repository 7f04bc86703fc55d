"""PyTorch baseline for `tandem bench --train --score`: a reward model (backbone + score head) trained
with the Bradley–Terry loss on the same HF model directory, batch, sequence length and threads;
forward + backward + clip 1.0 + AdamW per step, median of --iters steps after one warm-up.

The model is AutoModelForSequenceClassification (num_labels 1) built from the causal-LM directory:
the backbone is loaded, score.weight is new (as Tandem's model_load_score). The reward is read
directly at the last position, score(model.model(ids).last_hidden_state[:, -1]), instead of
through the full model's pad-token search: every sequence is full length, so that is the same
value with no pad_token_id to choose. Sequences 2i / 2i+1 are pair i's chosen / rejected (as
rlhf/pref_loss.h), loss = -logsigmoid(r_c - r_r).mean() over the B/2 pairs.
Benchmark-only dependency and threads as train_pytorch.py: run with OMP_WAIT_POLICY=PASSIVE.
Prints one JSON line."""
import argparse, json, resource, statistics, sys, time

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForSequenceClassification

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--iters", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
if a.batch % 2:
    sys.exit(f"rm_pytorch.py: --batch {a.batch} is odd (sequences 2i and 2i+1 are a pair)")
torch.set_num_threads(a.threads)
torch.manual_seed(0)
transformers.logging.set_verbosity_error()   # "score.weight newly initialized" is the point here
model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=1, torch_dtype=torch.float32,
                                                           attn_implementation="eager")
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq))
times = []
for it in range(a.iters + 1):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    h = model.model(input_ids=ids, use_cache=False).last_hidden_state   # (B, T, D)
    r = model.score(h[:, -1]).squeeze(-1)                                # (B) reward at the last token
    loss = -F.logsigmoid(r[0::2] - r[1::2]).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if it:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"bench": "train", "impl": "pytorch " + torch.__version__, "head": "score", "batch": a.batch,
                  "seq": a.seq, "threads": a.threads, "tokens_per_s": round(a.batch * a.seq / med, 1),
                  "step_s": round(med, 4), "last_loss": round(loss.item(), 6),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
