#!/usr/bin/env python3
"""moe_model.py KIND LAYERS OUT [VOCAB [EXPERTS]]: a random-weight Mixture-of-Experts model of a real
shape as a Hugging Face directory (config.json + bf16 safetensors, one shard per layer), for
bench/moe.sh. Speed does not depend on the values: every weight N(0, 0.02), norms 1, the routers
N(0, 0.02) too (near-uniform routing, as a trained router's load-balanced one).
KIND: qwen3_moe (Qwen3-30B-A3B's widths: hidden 2048, 128 experts of 768, top 8, 32 heads / 4 kv
heads of 128, vocab 151936, untied) or mixtral (Mixtral-8x7B's: hidden 4096, 8 experts of 14336,
top 2, 32 heads / 8 kv heads, vocab 32000). LAYERS replaces the real 48 / 32; VOCAB and EXPERTS, when
given, replace the real ones (the training rows cut the embedding to fit the machine).
torch (.venv's 1.13) + safetensors; transformers is not needed (4.47 has no Qwen3-MoE). Writes each
tensor's shard as it goes, so the peak memory is one layer's weights (~1.2 GB / 2.8 GB in bf16)."""
import json
import os
import sys

import torch
from safetensors.torch import save_file

kind, L, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SHAPES = {
    "qwen3_moe": dict(D=2048, E=128, K=8, F=768, H=32, Hkv=4, hd=128, V=151936, dense=6144),
    "mixtral": dict(D=4096, E=8, K=2, F=14336, H=32, Hkv=8, hd=128, V=32000, dense=14336),
}
s = dict(SHAPES[kind])
if len(sys.argv) > 4: s["V"] = int(sys.argv[4])
if len(sys.argv) > 5: s["E"] = int(sys.argv[5])
D, E, K, F, H, Hkv, hd, V = (s[k] for k in ("D", "E", "K", "F", "H", "Hkv", "hd", "V"))
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(1)


def rnd(*shape):
    return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


common = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=hd,
              vocab_size=V, num_experts_per_tok=K, rms_norm_eps=1e-6 if kind == "qwen3_moe" else 1e-5,
              rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=False, torch_dtype="bfloat16",
              hidden_act="silu", router_aux_loss_coef=0.001, output_router_logits=False, bos_token_id=1, eos_token_id=2,
              attention_dropout=0.0, initializer_range=0.02)
if kind == "qwen3_moe":
    cfg = dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", intermediate_size=s["dense"],
               moe_intermediate_size=F, num_experts=E, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
               attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=L)
else:
    cfg = dict(common, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=F,
               num_local_experts=E, sliding_window=None, router_jitter_noise=0.0)
weight_map = {}


def shard(name, tensors):
    save_file(tensors, os.path.join(out, name), metadata={"format": "pt"})
    weight_map.update({k: name for k in tensors})


n = L + 2
for l in range(L):
    p = f"model.layers.{l}."
    t = {p + "input_layernorm.weight": ones(D), p + "post_attention_layernorm.weight": ones(D),
         p + "self_attn.q_proj.weight": rnd(H * hd, D), p + "self_attn.k_proj.weight": rnd(Hkv * hd, D),
         p + "self_attn.v_proj.weight": rnd(Hkv * hd, D), p + "self_attn.o_proj.weight": rnd(D, H * hd)}
    if kind == "qwen3_moe":
        t[p + "self_attn.q_norm.weight"] = ones(hd)
        t[p + "self_attn.k_norm.weight"] = ones(hd)
        t[p + "mlp.gate.weight"] = rnd(E, D)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            t.update({q + "gate_proj.weight": rnd(F, D), q + "up_proj.weight": rnd(F, D), q + "down_proj.weight": rnd(D, F)})
    else:
        t[p + "block_sparse_moe.gate.weight"] = rnd(E, D)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            t.update({q + "w1.weight": rnd(F, D), q + "w3.weight": rnd(F, D), q + "w2.weight": rnd(D, F)})
    shard(f"model-{l + 1:05d}-of-{n:05d}.safetensors", t)
    del t
shard(f"model-{L + 1:05d}-of-{n:05d}.safetensors", {"model.embed_tokens.weight": rnd(V, D), "model.norm.weight": ones(D)})
shard(f"model-{L + 2:05d}-of-{n:05d}.safetensors", {"lm_head.weight": rnd(V, D)})
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
print(f"{kind}: {L} layers, hidden {D}, {E} experts of {F} (top {K}), heads {H}/{Hkv} x {hd}, vocab {V} -> {out}",
      file=sys.stderr)
