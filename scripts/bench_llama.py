"""PyTorch half of `scripts/bench llama`: a hand-written Llama (RMSNorm, rotary positions in Hugging
Face's rotate-half layout with its rope_scaling, grouped-query attention whose key/value heads are
repeated as transformers' repeat_kv does, SwiGLU, no biases, tied or separate head) of a Forge
config's shape, in two modes.
Training (as scripts/bench_lora.py, whose LoRA module it uses): every weight frozen, LoRA on the
Linear layers lora.targets names in Forge's module paths (blocks.<i>.attn.q, .k, .v, .proj,
blocks.<i>.mlp.gate, .up, .proj), AdamW over the adapters; prints "params=N tok_s=X ..." as
scripts/bench_gpt.py does. Generation (--generate PROMPTS): greedy decoding of the first prompt,
batch 1, through a preallocated key/value cache of the key/value heads only; prints
"tok_s=X tokens=N seconds=S": prefill and decoding, as forge generate times them.
Run with Debian's /usr/bin/python3 (torch 1.13).
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_generate import read_prompts
from bench_gpt import DEFAULTS, argument_parser, read_sections
from bench_lora import LoRALinear, glob_match, train_adapters

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from make_llama_goldens import inv_freq  # noqa: E402

MODEL_DEFAULTS = dict(DEFAULTS["model"], n_kv_heads=0, head_dim=0, ffn_hidden=0, fused_qkv=True,
                      qkv_bias=False, rope_theta=10000.0, rope_scaling={"type": "none"})

# torch 1.13 has the math path of scaled_dot_product_attention under a private name (2.0 made it
# public, with fused kernels); measured a few percent faster than writing it out.
sdpa = getattr(F, "scaled_dot_product_attention", None)
if sdpa is None and hasattr(F, "_scaled_dot_product_attention"):
    def sdpa(q, k, v, is_causal):
        return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, is_causal)[0]


def load_config(path):
    config, raw = read_sections(path, dict(DEFAULTS, model=MODEL_DEFAULTS))
    config["data"]["train"] = raw["data"]["train"]
    m, o = config["model"], config["optimizer"]
    wanted = {"norm": "rmsnorm", "position": "rotary", "mlp": "swiglu", "bias": False,
              "dropout": 0.0}
    bad = [f"model.{k}: {m[k]!r} (wants {v!r})" for k, v in wanted.items() if m[k] != v]
    if o["name"] != "adamw" or config["data"]["tokenizer"] != "bytes":
        bad.append("optimizer.name adamw and data.tokenizer bytes")
    if m["rope_scaling"]["type"] not in ("none", "linear", "llama3"):
        bad.append(f"model.rope_scaling.type {m['rope_scaling']['type']!r}")
    if bad:
        sys.exit(f"bench_llama.py: {path}: only the Llama family is benchmarked: {'; '.join(bad)}")
    return config


def rotary_frequencies(D, theta, scaling):
    """theta^(-2i/D), i < D/2, stretched as rope_scaling says: transformers' computation as
    tests/golden/make_llama_goldens.py writes it, given Forge's keys as config.json's."""
    hub = {"rope_theta": theta}
    if scaling["type"] != "none":
        hub["rope_scaling"] = dict(scaling, original_max_position_embeddings=scaling.get(
            "original_context"))
    return inv_freq(hub, D)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (torch 1.13 has no nn.RMSNorm): w * x / sqrt(mean(x^2) + eps)."""

    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    """Children named as Forge's: q, k, v (or qkv, fused) and proj."""

    def __init__(self, m):
        super().__init__()
        C, self.H = m["d_model"], m["n_heads"]
        self.Hkv = m["n_kv_heads"] or self.H
        self.D = m["head_dim"] or C // self.H
        H, Hkv, D, qkv_bias = self.H, self.Hkv, self.D, m["qkv_bias"]
        if m["fused_qkv"]:
            self.qkv = nn.Linear(C, (H + 2 * Hkv) * D, bias=qkv_bias)
        else:
            self.q = nn.Linear(C, H * D, bias=qkv_bias)
            self.k = nn.Linear(C, Hkv * D, bias=qkv_bias)
            self.v = nn.Linear(C, Hkv * D, bias=qkv_bias)
        self.proj = nn.Linear(H * D, C, bias=False)

    def project(self, x, cos, sin):
        """x [B, T, C] -> q [B, H, T, D], k and v [B, Hkv, T, D], q and k rotated."""
        B, T, _ = x.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split((H * D, Hkv * D, Hkv * D), dim=2)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def repeat_kv(self, t):
        """transformers' repeat_kv: [B, Hkv, S, D] -> [B, H, S, D], kv head j serving query heads
        j * G .. j * G + G - 1."""
        B, Hkv, S, D = t.shape
        G = self.H // Hkv
        return t if G == 1 else t[:, :, None].expand(B, Hkv, G, S, D).reshape(B, self.H, S, D)

    def attend(self, q, k, v, causal):
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=causal)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.D))
        if causal:
            T = q.shape[2]
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return att.softmax(-1) @ v

    def output(self, y):
        B, _, T, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(B, T, self.H * self.D))

    def forward(self, x, cos, sin):
        q, k, v = self.project(x, cos, sin)
        return self.output(self.attend(q, k, v, causal=True))


class MLP(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["d_model"]
        # Forge's mlp_hidden_size: ffn_hidden, else 2/3 of ffn_mult * d_model up to a multiple of 8.
        hidden = m["ffn_hidden"] or (int(2 * round(m["ffn_mult"] * C) / 3) + 7) // 8 * 8
        self.gate = nn.Linear(C, hidden, bias=False)
        self.up = nn.Linear(C, hidden, bias=False)
        self.proj = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        return self.proj(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.ln1 = RMSNorm(m["d_model"], m["norm_eps"])
        self.attn = Attention(m)
        self.ln2 = RMSNorm(m["d_model"], m["norm_eps"])
        self.mlp = MLP(m)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class Llama(nn.Module):
    def __init__(self, m):
        super().__init__()
        V, C = m["vocab_size"], m["d_model"]
        self.tok_emb = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        self.ln_f = RMSNorm(C, m["norm_eps"])
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(C, V, bias=False)
        for p in self.parameters():  # N(0, 0.02) as Forge's: keeps the loss in range
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
        D = self.blocks[0].attn.D
        angles = torch.outer(torch.arange(m["context"], dtype=torch.float64),
                             rotary_frequencies(D, m["rope_theta"], m["rope_scaling"]))
        angles = torch.cat((angles, angles), dim=1)  # [context, D]: both halves rotate alike
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def head(self, x):
        return F.linear(self.ln_f(x), self.lm_head.weight if self.lm_head else self.tok_emb.weight)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.tok_emb(ids)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    @torch.inference_mode()
    def generate_greedy(self, prompt, max_new, allowed):
        """prompt [T0] -> max_new token ids, each the most likely of the first `allowed` ids,
        through caches k, v [1, Hkv, T0 + max_new - 1, D] per block."""
        attn0 = self.blocks[0].attn
        capacity = len(prompt) + max_new - 1
        caches = [(torch.zeros(1, attn0.Hkv, capacity, attn0.D),
                   torch.zeros(1, attn0.Hkv, capacity, attn0.D)) for _ in self.blocks]
        ids, length, out = prompt[None, :], 0, []
        for _ in range(max_new):
            T = ids.shape[1]
            S = length + T
            cos, sin = self.cos[length:S], self.sin[length:S]
            x = self.tok_emb(ids)
            for block, (k_cache, v_cache) in zip(self.blocks, caches):
                q, k, v = block.attn.project(block.ln1(x), cos, sin)
                k_cache[:, :, length:S] = k
                v_cache[:, :, length:S] = v
                # The prefill is causal; a decoded token sees the whole cache.
                y = block.attn.attend(q, k_cache[:, :, :S], v_cache[:, :, :S], causal=T > 1)
                x = x + block.attn.output(y)
                x = x + block.mlp(block.ln2(x))
            token = self.head(x[:, -1])[0, :allowed].argmax()
            out.append(int(token))
            ids, length = token.view(1, 1), S
        return out


def inject_lora(model, lora):
    """Swaps the Linear layers whose Forge module path a target glob matches for LoRALinear."""
    wrapped = [(path, module) for path, module in model.named_modules()
               if isinstance(module, nn.Linear) and any(glob_match(t, path) for t in lora["targets"])]
    if not wrapped:
        sys.exit(f"bench_llama.py: lora.targets {lora['targets']} match no Linear layer")
    for path, module in wrapped:
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, LoRALinear(module, lora["rank"], lora["alpha"]))


def main():
    parser = argument_parser(__doc__, "Llama")
    parser.add_argument("--generate", metavar="PROMPTS",
                        help="greedy decoding of the first prompt of this file instead of training")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    torch.manual_seed(config["seed"])
    model = Llama(config["model"])
    if args.generate:
        prompt = torch.tensor(read_prompts(args.generate)[0])
        model.eval()
        begin = time.perf_counter()
        tokens = model.generate_greedy(prompt, args.max_new_tokens, allowed=256)
        seconds = time.perf_counter() - begin
        print(f"tok_s={len(tokens) / seconds:.1f} tokens={len(tokens)} seconds={seconds:.3f}")
        return
    train_adapters(args, config, model, inject_lora)


if __name__ == "__main__":
    main()
