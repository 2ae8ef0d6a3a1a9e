"""Writes tests/golden/gpt.txt: loss, logits and gradients of a tiny GPT computed by PyTorch 1.13
(float64), read by tests/nn/test_nn.cpp. Run from the repository root with Debian's torch:
    /usr/bin/python3 tests/golden/make_gpt_goldens.py
Both sides fill the weights without any RNG: parameter number k (in name order) gets
    w[i] = base + 0.1 * sin(0.37 * i + 0.0013 * i * i + 0.7 * k),   i = 0 .. numel-1 (row-major)
with base = 1 for 1-D ".weight" tensors (norm scales) and 0 otherwise. The quadratic term keeps
weight matrices from being rank 2. Three variants: "gpt2" (learned positions, LayerNorm, GELU-tanh,
biases, tied head), "llama" (RMSNorm, rotary, SwiGLU with hidden 48, no biases, tied head) and
"llama_gqa" (the hub's Llama/Qwen2 layout: 4 query heads sharing 2 key/value heads as
transformers' repeat_kv does, head dimension 6 apart from d_model / n_heads, q, k, v projected
apart with biases as Qwen2's, SwiGLU hidden 40, untied head, rotary frequencies scaled as
transformers' llama3 rope_scaling with factor 4 and an original context of 16).
Each line is "name n v1 ... vn"; per parameter P: "<variant>.grad.<P>.norm" (L2 norm of the
gradient) and "<variant>.grad.<P>.at" (entries at flat indices 0, n/5, 2n/5, 3n/5, 4n/5, n-1).
"""
import math
import os

import torch
import torch.nn.functional as F

dt = torch.float64
V, CTX, C, L, H = 11, 8, 16, 2, 2
B, T = 2, 8
EPS = 1e-5
lines = []


def put(name, values):
    values = [float(v) for v in values]
    lines.append(f"{name} {len(values)} " + " ".join(repr(v) for v in values))


GQA = dict(heads=4, kv_heads=2, head_dim=6, hidden=40, factor=4.0, low=1.0, high=4.0, original=16)


def names_and_shapes(variant):
    hidden = {"gpt2": 4 * C, "llama": 48, "llama_gqa": GQA["hidden"]}[variant]  # llama: ceil8(2*4C/3)
    bias = variant == "gpt2"
    out = [("tok_emb.weight", (V, C))]
    if variant == "gpt2":
        out.append(("pos_emb.weight", (CTX, C)))

    def norm(n):
        out.append((n + ".weight", (C,)))
        if bias:
            out.append((n + ".bias", (C,)))

    def lin(n, i, o):
        out.append((n + ".weight", (o, i)))
        if bias:
            out.append((n + ".bias", (o,)))

    for l in range(L):
        p = f"blocks.{l}."
        norm(p + "ln1")
        if variant == "llama_gqa":
            q_width, kv_width = GQA["heads"] * GQA["head_dim"], GQA["kv_heads"] * GQA["head_dim"]
            for name, width in (("q", q_width), ("k", kv_width), ("v", kv_width)):
                out.append((p + f"attn.{name}.weight", (width, C)))
                out.append((p + f"attn.{name}.bias", (width,)))
            lin(p + "attn.proj", q_width, C)
        else:
            lin(p + "attn.qkv", C, 3 * C)
            lin(p + "attn.proj", C, C)
        norm(p + "ln2")
        if variant == "gpt2":
            lin(p + "mlp.fc", C, hidden)
        else:
            lin(p + "mlp.gate", C, hidden)
            lin(p + "mlp.up", C, hidden)
        lin(p + "mlp.proj", hidden, C)
    norm("ln_f")
    if variant == "llama_gqa":
        out.append(("lm_head.weight", (V, C)))
    return out


def make_params(variant):
    params = {}
    for k, (name, shape) in enumerate(names_and_shapes(variant)):
        n = math.prod(shape)
        base = 1.0 if name.endswith(".weight") and len(shape) == 1 else 0.0
        w = [base + 0.1 * math.sin(0.37 * i + 0.0013 * i * i + 0.7 * k) for i in range(n)]
        params[name] = torch.tensor(w, dtype=dt).reshape(shape).requires_grad_(True)
    return params


def llama3_scaled(inv):  # transformers' _compute_llama3_parameters
    low_wavelen, high_wavelen = GQA["original"] / GQA["low"], GQA["original"] / GQA["high"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / GQA["factor"], inv)
    smooth = (GQA["original"] / wavelen - GQA["low"]) / (GQA["high"] - GQA["low"])
    smoothed = (1 - smooth) * scaled / GQA["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope(x, scaled=False):  # x [B, H, T, D], rotate-half with positions 0 .. T-1
    D = x.shape[-1]
    half = D // 2
    inv = torch.tensor([10000.0 ** (-2.0 * i / D) for i in range(half)], dtype=dt)
    if scaled:
        inv = llama3_scaled(inv)
    ang = torch.arange(x.shape[2], dtype=dt)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def forward(variant, P, ids):
    gpt2 = variant == "gpt2"

    def norm(x, n):
        if gpt2:
            return F.layer_norm(x, (C,), P[n + ".weight"], P[n + ".bias"], eps=EPS)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * P[n + ".weight"]

    def lin(x, n):
        return F.linear(x, P[n + ".weight"], P.get(n + ".bias"))

    x = F.embedding(ids, P["tok_emb.weight"])
    if gpt2:
        x = x + P["pos_emb.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = f"blocks.{l}."
        h = norm(x, p + "ln1")
        if variant == "llama_gqa":
            heads, kv_heads, D = GQA["heads"], GQA["kv_heads"], GQA["head_dim"]
            q = lin(h, p + "attn.q").reshape(B, T, heads, D).transpose(1, 2)
            k, v = [lin(h, p + f"attn.{n}").reshape(B, T, kv_heads, D).transpose(1, 2)
                    for n in ("k", "v")]
            q, k = rope(q, scaled=True), rope(k, scaled=True)
            # repeat_kv: key/value head j serves query heads j * group .. j * group + group - 1
            k, v = [t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v)]
        else:
            heads, D = H, C // H
            q, k, v = lin(h, p + "attn.qkv").split(C, dim=2)
            q, k, v = [t.reshape(B, T, H, D).transpose(1, 2) for t in (q, k, v)]
            if not gpt2:
                q, k = rope(q), rope(k)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, heads * D)
        x = x + lin(y, p + "attn.proj")
        h = norm(x, p + "ln2")
        if gpt2:
            m = F.gelu(lin(h, p + "mlp.fc"), approximate="tanh")
        else:
            m = F.silu(lin(h, p + "mlp.gate")) * lin(h, p + "mlp.up")
        x = x + lin(m, p + "mlp.proj")
    x = norm(x, "ln_f")
    return F.linear(x, P.get("lm_head.weight", P["tok_emb.weight"]))  # tied unless it has a head


ids = torch.tensor([[(3 * b + 5 * t + 1) % V for t in range(T)] for b in range(B)])
targets = torch.tensor([[(7 * b + 2 * t + 3) % V for t in range(T)] for b in range(B)])
put("ids", ids.reshape(-1).tolist())
put("targets", targets.reshape(-1).tolist())
for variant in ["gpt2", "llama", "llama_gqa"]:
    P = make_params(variant)
    logits = forward(variant, P, ids)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    put(f"{variant}.num_params", [len(P)])
    put(f"{variant}.loss", [loss.item()])
    put(f"{variant}.logits", logits.detach().reshape(-1).tolist())
    for name, p in P.items():
        g = p.grad.reshape(-1)
        n = g.numel()
        at = [0, n // 5, 2 * n // 5, 3 * n // 5, 4 * n // 5, n - 1]
        put(f"{variant}.grad.{name}.norm", [g.norm().item()])
        put(f"{variant}.grad.{name}.at", [g[i].item() for i in at])

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt.txt")
with open(path, "w") as f:
    f.write(f"# Generated by tests/golden/make_gpt_goldens.py with torch {torch.__version__}; do not edit.\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {path}: {len(lines)} lines")
