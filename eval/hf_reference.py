#!/usr/bin/env python3
"""Write Tandem's HF reference file (teacher-forced top-k logprobs + greedy continuation).

Usage:
    python eval/hf_reference.py --model DIR --input IN.jsonl --out REF.jsonl [--top-k 8] [--greedy N]
                                [--dtype float32|bfloat16|bf16-emulated]

IN.jsonl, one object per line:
    {"id": "optional string", "input_ids": [1, 345, ...]}
    {"id": "optional string", "text": "Once upon a time"}   # tokenized with AutoTokenizer(DIR)

REF.jsonl, one object per input line:
    "id"                  copied from the input, or "rec<i>" (i = 0-based line index)
    "input_ids"           the ids that were scored
    "top_logprobs"        one entry per position t of input_ids: the top-k [token_id, logprob] pairs of
                          log_softmax (fp32) of the next-token distribution after input_ids[0..t],
                          sorted by logprob descending (ties: smaller id first)
    "greedy_ids"          (only with --greedy N > 0) N greedy tokens continuing input_ids; EOS is not a
                          stop condition. Each step is a full forward over prompt + tokens so far and an
                          argmax of the last logits (identical to generate(do_sample=False) without EOS
                          stopping).
    "greedy_top_logprobs" per greedy step, the top-k [token_id, logprob] list of that step's
                          distribution (a top-2 gap below ~1e-4 means the step is a tie and a runtime
                          may legitimately pick the other token)
Logprobs are fp32 values written as Python floats (repr), i.e. exactly.

REF.jsonl.meta.json: {"torch", "transformers", "model", "dtype", "top_k"}; dtype is --dtype's value.

--dtype (attn_implementation="eager" in every case; one sequence per forward, no KV cache):
    float32        (default) the model in fp32: weights stored in bf16/fp16 are upcast exactly, so
                   the reference is an fp32 computation on the stored weights.
    bfloat16       the model in torch.bfloat16 throughout (from_pretrained(torch_dtype=bfloat16)):
                   weights, activations, residual stream and matmul outputs in bf16, as transformers
                   computes them (its RMSNorm and attention softmax work in fp32 internally and cast
                   back); logprobs are log_softmax (fp32) of the bf16 logits cast to fp32. What a
                   transformers user running the model in bf16 gets.
    bf16-emulated  Tandem's --dtype bf16 function (runtime/forward.c), transcribed independently: an
                   fp32 model whose every parameter is rounded to bf16 (round to nearest even) and
                   whose every nn.Linear input is rounded to bf16 by a forward pre-hook
                   (x.to(bfloat16).float()); everything else fp32. Tandem --dtype bf16 computes the
                   same function up to fp32 summation order.

Pinned versions (the committed fixtures in tests/fixtures/refs were made with these):
    torch 1.13 (CPU)      Debian: apt-get install python3-torch   (reported as 1.13.0a0)
    transformers 4.47.1   pip install transformers==4.47.1 safetensors sentencepiece
    safetensors 0.8.0
`make pyenv` builds this environment in .venv/ (eval/requirements.txt): .venv/bin/python eval/hf_reference.py ...

Note (transformers 4.47.1, eager): Mistral's sliding window masks key k for query q unless
0 <= q - k < sliding_window. Qwen2's eager path applies config.sliding_window to ALL layers and
ignores max_window_layers (only its flash-attention path honours it); see
load_model() patches the layers below max_window_layers back to full causal attention, so
references follow the per-layer semantics of the flash-attention path and of later transformers
versions (layer i is windowed iff use_sliding_window and i >= max_window_layers). Padding masks are
not supported by that patch; this script never pads (one sequence per forward).
"""

import argparse
import json
import math
import os
import sys

import torch


DTYPES = ("float32", "bfloat16", "bf16-emulated")


def load_model(model_dir, dtype="float32", **config_overrides):
    """Load DIR with eager attention in one of DTYPES (see the module docstring); config_overrides go
    to from_pretrained (config kwargs)."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch_dtype, attn_implementation="eager", **config_overrides
    )
    model.eval()
    if dtype == "bf16-emulated":
        emulate_bf16(model)
    patch_qwen2_window_layers(model)
    return model


def round_bf16(t):
    """t rounded to the nearest bf16 value (ties to even), kept in t's dtype (fp32)."""
    return t.to(torch.bfloat16).to(t.dtype)


@torch.no_grad()
def emulate_bf16(model):
    """Make an fp32 model compute Tandem's bf16 function: every parameter (embeddings, projections,
    norm weights, biases, lm_head; a tied lm_head is the embedding tensor) rounded to bf16 in place,
    and every nn.Linear's input rounded to bf16 before the product (so each product is of two bf16
    values, exact in fp32, summed in fp32). Buffers (RoPE's inv_freq) are not weights: left fp32."""
    for p in model.parameters():
        p.copy_(round_bf16(p))

    def round_input(_module, args):
        return (round_bf16(args[0]),) + tuple(args[1:])

    n = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(round_input)
            n += 1
    if n == 0:
        raise RuntimeError("bf16-emulated: the model has no nn.Linear to hook")
    return n


def qwen2_full_layers(config):
    """Layers that a Qwen2 config wants WITHOUT the sliding window: with use_sliding_window and a
    sliding_window set, layers with index < max_window_layers use full causal attention (as in
    transformers' Qwen2FlashAttention2 in 4.47 and in the layer_types of later versions)."""
    if getattr(config, "model_type", None) != "qwen2":
        return []
    if not getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None) is None:
        return []
    return list(range(min(config.max_window_layers, config.num_hidden_layers)))


def patch_qwen2_window_layers(model):
    """transformers 4.47's eager Qwen2 builds ONE mask with config.sliding_window and gives it to every
    layer, ignoring max_window_layers. Give the layers below max_window_layers a plain causal mask so
    the reference follows the per-layer semantics. Returns the patched layer indices."""
    layers = qwen2_full_layers(model.config)
    for i in layers:
        attn = model.model.layers[i].self_attn
        orig = attn.forward

        def fwd(*args, _orig=orig, **kw):
            m = kw.get("attention_mask")
            if m is not None and m.dim() == 4:
                q, k = m.shape[-2], m.shape[-1]
                cache_pos = kw.get("cache_position")
                qpos = cache_pos if cache_pos is not None else torch.arange(k - q, k)
                kpos = torch.arange(k)
                full = torch.zeros(q, k, dtype=m.dtype, device=m.device)
                full.masked_fill_(kpos[None, :] > qpos[:, None], torch.finfo(m.dtype).min)
                kw["attention_mask"] = full[None, None].expand(m.shape[0], 1, q, k)
            return _orig(*args, **kw)

        attn.forward = fwd
    if layers:
        print(f"hf_reference: qwen2 max_window_layers={model.config.max_window_layers}: layers "
              f"{layers} use full causal attention, the others sliding_window="
              f"{model.config.sliding_window}", file=sys.stderr)
    return layers


def _topk_pairs(logprobs_row, k):
    """logprobs_row: 1-D fp32 tensor. Returns [[id, logprob], ...] sorted by (-logprob, id)."""
    k = min(k, logprobs_row.shape[-1])
    vals, idx = torch.topk(logprobs_row, k)
    # Include everything equal to the k-th value so the tie order is deterministic.
    kth = vals[-1].item()
    cand = torch.nonzero(logprobs_row >= kth).flatten().tolist()
    pairs = [(int(i), float(logprobs_row[i].item())) for i in cand]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return [[i, lp] for i, lp in pairs[:k]]


@torch.no_grad()
def forward_logprobs(model, ids):
    """Full forward over ids (list of ints); returns (T, V) fp32 log_softmax tensor."""
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x, use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


@torch.no_grad()
def reference_record(model, ids, top_k=8, greedy=0, rec_id=None):
    """Compute one reference record (a dict in the REF.jsonl format)."""
    ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("empty input_ids")
    lp = forward_logprobs(model, ids)
    rec = {"id": rec_id, "input_ids": ids}
    rec["top_logprobs"] = [_topk_pairs(lp[t], top_k) for t in range(len(ids))]
    if greedy > 0:
        seq = list(ids)
        gids, gtops = [], []
        last = lp[-1]
        for step in range(greedy):
            if step > 0:
                last = forward_logprobs(model, seq)[-1]
            nxt = int(torch.argmax(last).item())
            gtops.append(_topk_pairs(last, top_k))
            gids.append(nxt)
            seq.append(nxt)
        rec["greedy_ids"] = gids
        rec["greedy_top_logprobs"] = gtops
    return rec


def min_greedy_gap(rec):
    """Smallest top-1 minus top-2 logprob gap over the greedy steps (inf if none)."""
    gap = math.inf
    for top in rec.get("greedy_top_logprobs", []):
        if len(top) >= 2:
            gap = min(gap, top[0][1] - top[1][1])
    return gap


@torch.no_grad()
def mean_nll(model, seqs):
    """Token-weighted mean next-token NLL over all predicted positions of all sequences.
    Returns (loss, tokens); the sum is accumulated in float64 over fp32 logprobs."""
    total, count = 0.0, 0
    for ids in seqs:
        if len(ids) < 2:
            continue
        lp = forward_logprobs(model, ids)
        tgt = torch.tensor(ids[1:], dtype=torch.long)
        nll = -lp[:-1].gather(1, tgt[:, None]).squeeze(1)
        total += float(nll.double().sum().item())
        count += len(ids) - 1
    return (total / count if count else float("nan")), count


def meta(model_dir, top_k, model=None, dtype="float32"):
    import transformers

    m = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": os.path.basename(os.path.normpath(model_dir)),
        "dtype": dtype,
        "top_k": top_k,
    }
    if model is not None and qwen2_full_layers(model.config):
        m["qwen2_full_attention_layers"] = qwen2_full_layers(model.config)
    return m


def write_jsonl(path, records):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def write_meta(out_path, model_dir, top_k, model=None, dtype="float32"):
    p = out_path + ".meta.json"
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        json.dump(meta(model_dir, top_k, model, dtype), f, indent=1)
        f.write("\n")
    os.replace(tmp, p)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--input", required=True, help="input jsonl (input_ids or text)")
    ap.add_argument("--out", required=True, help="output reference jsonl")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--greedy", type=int, default=0, help="greedy tokens per record (EOS ignored)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="float32 (default), bfloat16 (the model in bf16), bf16-emulated (Tandem's bf16)")
    ap.add_argument("--adapter", help="a PEFT adapter directory, applied unmerged (PeftModel)")
    args = ap.parse_args(argv)

    torch.set_grad_enabled(False)
    model = load_model(args.model, args.dtype)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).eval()
    tok = None
    records = []
    with open(args.input) as f:
        lines = [ln for ln in f if ln.strip()]
    for i, ln in enumerate(lines):
        obj = json.loads(ln)
        if "input_ids" in obj:
            ids = obj["input_ids"]
        elif "text" in obj:
            if tok is None:
                from transformers import AutoTokenizer

                try:
                    tok = AutoTokenizer.from_pretrained(args.model)
                except Exception as e:  # e.g. fast-tokenizer conversion needs protobuf
                    print(f"hf_reference: fast tokenizer failed ({type(e).__name__}); "
                          "using the slow one", file=sys.stderr)
                    tok = AutoTokenizer.from_pretrained(args.model, use_fast=False)
            ids = tok(obj["text"]).input_ids
        else:
            sys.exit(f"{args.input}:{i + 1}: need 'input_ids' or 'text'")
        rid = obj.get("id")
        rid = str(rid) if rid is not None else f"rec{i}"
        records.append(reference_record(model, ids, args.top_k, args.greedy, rid))
    write_jsonl(args.out, records)
    write_meta(args.out, args.model, args.top_k, model, args.dtype)
    print(f"wrote {len(records)} records to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
