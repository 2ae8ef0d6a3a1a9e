"""Checks a `forge export --format hf` of a Llama or Qwen2 in plain PyTorch (no transformers).

  /usr/bin/python3 tests/golden/check_llama_export.py DIR FORGE_OUTPUTS

DIR is the exported directory (config.json, model.safetensors in F32, BF16 or F16). FORGE_OUTPUTS
holds two lines in the golden format ("name count values..."): `ids` (one row of token ids) and
`logits` (Forge's, [len(ids), vocab_size] row-major), written by tests/formats/
test_hf_llama_export.cpp. The forward below follows transformers' LlamaForCausalLM and
Qwen2ForCausalLM as the config describes them (RMSNorm, rotate-half RoPE with rope_theta and
rope_scaling none/linear/llama3, grouped-query attention, SwiGLU, q/k/v biases for qwen2, tied or
separate head), in float64. Exits 0 when the logits agree within 1e-4, printing the largest gap.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_goldens import read_safetensors  # noqa: E402  (the standard-library reader)

dt = torch.float64


def inv_freq(cfg, head_dim):
    """transformers' rope_init_fn: theta^(-2i/d), stretched as rope_scaling says."""
    f = 1.0 / cfg["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=dt) / head_dim)
    s = cfg.get("rope_scaling")
    if not s:
        return f
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return f / s["factor"]
    assert kind == "llama3", kind
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > old / low, f / factor, f)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def logits(w, cfg, ids):
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C = cfg["hidden_size"]
    D = cfg.get("head_dim") or C // H
    eps = cfg["rms_norm_eps"]
    qwen2 = cfg["model_type"] == "qwen2"
    T = ids.shape[0]
    angles = torch.arange(T, dtype=dt)[:, None] * inv_freq(cfg, D)[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)

    def lin(x, name, bias=False):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin(a, p + "self_attn.q_proj", qwen2).view(T, H, D).transpose(0, 1)
        k = lin(a, p + "self_attn.k_proj", qwen2).view(T, Hkv, D).transpose(0, 1)
        v = lin(a, p + "self_attn.v_proj", qwen2).view(T, Hkv, D).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, 0), v.repeat_interleave(H // Hkv, 0)
        s = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(causal, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, H * D)
        x = x + lin(o, p + "self_attn.o_proj")
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        f = torch.nn.functional.silu(lin(m, p + "mlp.gate_proj")) * lin(m, p + "mlp.up_proj")
        x = x + lin(f, p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def main(directory, outputs):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] in ("llama", "qwen2"), cfg["model_type"]
    stored = read_safetensors(os.path.join(directory, "model.safetensors"))
    w = {name: t.to(dt) for name, t in stored.items()}
    forge = {}
    with open(outputs) as f:
        for line in f:
            name, _, *values = line.split()
            forge[name] = torch.tensor([float(v) for v in values], dtype=dt)
    got = logits(w, cfg, forge["ids"].long())
    worst = (got.reshape(-1) - forge["logits"]).abs().max().item()
    print(f"{directory}: {cfg['model_type']}, max |PyTorch - Forge| logits {worst:.3g}")
    sys.exit(0 if worst <= 1e-4 else 1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
