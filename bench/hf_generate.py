#!/usr/bin/env python3
"""transformers' generation speed on one GPU: the peer for `tandem bench --generate --device cuda`
(bench/cuda.sh runs both on the same machine, same model directory, same prompt and output lengths).

    python3 bench/hf_generate.py MODEL_DIR [--dtype bfloat16] [--prompt 16] [--new 32] [--big 32] [--rounds 3]
                                           [--pf-batch 4] [--pf-seq 512]

Random prompts (ids), greedy, EOS ignored (min_new_tokens = max_new_tokens). Reports, as one JSON
line, the medians over rounds of: batch-1 decode tokens/s, batch-`big` decode tokens/s (new tokens
of all sequences over the decode time: total time minus a prefill-only call's time) and prefill
tokens/s (one forward of pf-batch x pf-seq random tokens, as `tandem bench --batch --seq`). Eager attention (sdpa), no
compilation, no CUDA graphs: transformers as a user runs it by default.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--big", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pf-batch", type=int, default=4)
    ap.add_argument("--pf-seq", type=int, default=512)
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype).cuda().eval()
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def gen(B, new):
        ids = torch.randint(3, V, (B, a.prompt), generator=g).cuda()
        return lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, pad_token_id=0)

    def prefill():
        ids = torch.randint(3, V, (a.pf_batch, a.pf_seq), generator=g).cuda()
        return lambda: model(ids)

    with torch.no_grad():
        gen(1, 4)(); gen(a.big, 4)(); prefill()()   # warm-up: kernels, allocator
        d1, db, pf = [], [], []
        for _ in range(a.rounds):
            t_pre1 = timed(gen(1, 1))
            d1.append((a.new - 1) / (timed(gen(1, a.new)) - t_pre1))
            t_preb = timed(gen(a.big, 1))
            db.append(a.big * (a.new - 1) / (timed(gen(a.big, a.new)) - t_preb))
            pf.append(a.pf_batch * a.pf_seq / timed(prefill()))
    print(json.dumps({"bench": "hf_generate", "device": torch.cuda.get_device_name(), "dtype": a.dtype,
                      "torch": torch.__version__, "prompt": a.prompt, "new_tokens": a.new,
                      "prefill_shape": [a.pf_batch, a.pf_seq], "rounds": a.rounds,
                      "decode_b1_tokens_per_s": round(statistics.median(d1), 1),
                      f"decode_b{a.big}_tokens_per_s": round(statistics.median(db), 1),
                      "prefill_tokens_per_s": round(statistics.median(pf), 1)}))


if __name__ == "__main__":
    main()
