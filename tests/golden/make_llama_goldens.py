"""Hub directories of the Llama family (Llama, Qwen2, Mistral), without the transformers package.

  /usr/bin/python3 tests/golden/make_llama_goldens.py

Builds tiny random models under transformers' tensor names and config.json fields and writes each
as a hub-style directory (safetensors by make_hf_goldens.write_safetensors), then records their
logits on fixed inputs and greedy continuations, computed in float64 by the forward below, which
follows transformers' LlamaForCausalLM (Mistral and Qwen2 are the same model; Qwen2 adds q/k/v
biases): RMSNorm, rotate-half RoPE with inv_freq computed in float32 as transformers computes it
(default, linear and llama3 scalings), repeat_kv for grouped-query attention, SwiGLU.
  tests/golden/hf/llama/          F32, one model.safetensors, untied head, GQA (4 heads, 2 kv),
                                  rope_scaling {"type": "linear"}, no tokenizer files
  tests/golden/hf/qwen2/          BF16 in two shards + model.safetensors.index.json, tied head,
                                  q/k/v biases, GQA, vocab.json + merges.txt beside tokenizer.json
  tests/golden/hf/mistral/        F16, multi-head (4 kv heads), head_dim 12 != hidden / heads
  tests/golden/hf/llama3_scaled/  F32, one layer, rope_scaling llama3 over all three bands
  tests/golden/llama.txt          ids, logits and greedy continuations, read by
                                  tests/formats/test_hf_llama.cpp
Logits come from the weights as stored (BF16 and F16 rounded), which is what a reader converts.
"""
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from make_hf_goldens import write_byte_vocab, write_safetensors  # noqa: E402

dt = torch.float64
STORED = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
NEW_TOKENS = 10


def inv_freq(cfg, dim):
    """transformers' _compute_default_rope_parameters and its linear and llama3 variants."""
    base = cfg["rope_theta"]
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return f
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return f / scaling["factor"]
    assert kind == "llama3", kind
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    llama = torch.where(wavelen > old / low, f / factor, f)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, llama)


def rotary(cfg, dim, T):
    """cos, sin [T, dim] in float32, as LlamaRotaryEmbedding.forward."""
    freqs = inv_freq(cfg, dim)[:, None] @ torch.arange(T).float()[None, :]
    emb = torch.cat((freqs.T, freqs.T), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def put(lines, name, t):
    """A golden line "name count values..."; 9 significant digits (float32's) keep the file small."""
    v = t.detach().reshape(-1).tolist()
    lines.append(f"{name} {len(v)} " + " ".join(f"{float(x):.9g}" for x in v))


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def logits(w, cfg, ids):
    """LlamaForCausalLM.forward on ids [B, T] -> [B, T, V], in float64."""
    g = lambda n: w[n].to(dt)
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    B, T = ids.shape
    cos, sin = (t.to(dt) for t in rotary(cfg, D, T))
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)

    def lin(x, n):
        y = x @ g(n + ".weight").T
        return y + g(n + ".bias") if n + ".bias" in w else y

    x = g("model.embed_tokens.weight")[ids]
    for i in range(cfg["num_hidden_layers"]):
        h = f"model.layers.{i}."
        a = rms_norm(x, g(h + "input_layernorm.weight"), eps)
        q = lin(a, h + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = lin(a, h + "self_attn.k_proj").view(B, T, Hkv, D).transpose(1, 2)
        v = lin(a, h + "self_attn.v_proj").view(B, T, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))  # repeat_kv
        s = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(causal, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(o, h + "self_attn.o_proj")
        m = rms_norm(x, g(h + "post_attention_layernorm.weight"), eps)
        x = x + lin(torch.nn.functional.silu(lin(m, h + "mlp.gate_proj")) * lin(m, h + "mlp.up_proj"),
                    h + "mlp.down_proj")
    x = rms_norm(x, g("model.norm.weight"), eps)
    head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
    return x @ g(head).T


def greedy(w, cfg, prompt):
    """NEW_TOKENS argmax tokens after prompt [T]; each step's top two must differ by 1e-3 so that
    float32 rounding in the reader cannot change the continuation."""
    seq = list(prompt)
    for _ in range(NEW_TOKENS):
        last = logits(w, cfg, torch.tensor([seq]))[0, -1]
        top = last.topk(2).values
        assert top[0] - top[1] > 1e-3, f"near tie {top.tolist()}: pick another seed"
        seq.append(int(last.argmax()))
    return seq[len(prompt):]


def shapes(cfg, qkv_bias):
    C, V, F = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(cfg["num_hidden_layers"]):
        h = f"model.layers.{i}."
        out += [(h + "input_layernorm.weight", (C,)),
                (h + "self_attn.q_proj.weight", (H * D, C)),
                (h + "self_attn.k_proj.weight", (Hkv * D, C)),
                (h + "self_attn.v_proj.weight", (Hkv * D, C))]
        if qkv_bias:
            out += [(h + "self_attn.q_proj.bias", (H * D,)), (h + "self_attn.k_proj.bias", (Hkv * D,)),
                    (h + "self_attn.v_proj.bias", (Hkv * D,))]
        out += [(h + "self_attn.o_proj.weight", (C, H * D)),
                (h + "post_attention_layernorm.weight", (C,)),
                (h + "mlp.gate_proj.weight", (F, C)), (h + "mlp.up_proj.weight", (F, C)),
                (h + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def random_weights(shapes, seed, dtype):
    """Scaled so that logits spread over a few units (an init of std 0.02 gives near-uniform
    ones, whose argmax rounding could flip); norm scales around 1. Rounded to the stored dtype."""
    gen = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in shapes:
        if len(shape) == 1:
            t = torch.randn(shape, generator=gen) * 0.1
            t = t + 1 if name.endswith("norm.weight") else t
        else:
            t = torch.randn(shape, generator=gen) * (0.3 if "embed" in name else 0.25)
        w[name] = t.to(STORED[dtype])
    return w


def write_tokenizer(out):
    """A Qwen2 directory's vocab.json and merges.txt (GPT-2's byte-level vocabulary without
    merges) and the same tokenizer as Qwen2's tokenizer.json spells it beside them (which Forge
    reads first): the 256 bytes as a byte-level BPE, <|endoftext|> an added special token."""
    write_byte_vocab(out)
    with open(os.path.join(out, "vocab.json")) as f:
        vocab = json.load(f)
    endoftext = vocab.pop("<|endoftext|>")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": endoftext, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)


def write_directory(out, cfg, w, shards):
    """config.json and the weights: model.safetensors, or `shards` files named as transformers'
    save_pretrained names them, tensors in order, with model.safetensors.index.json."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), w)
        return
    names = list(w)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: w[n] for n in names[k * per:(k + 1) * per]}
        write_safetensors(os.path.join(out, file), part)
        weight_map.update({n: file for n in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


BASE = dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, hidden_act="silu", max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, attention_dropout=0.0,
            initializer_range=0.02, use_cache=True)

MODELS = {
    "llama": dict(
        config=dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=300,
                    head_dim=8, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                    tie_word_embeddings=False, rope_scaling={"type": "linear", "factor": 2.0},
                    bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
        dtype="F32", shards=1, seed=21),
    "qwen2": dict(
        config=dict(BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=300,
                    rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                    sliding_window=4096, max_window_layers=2, bos_token_id=256,
                    eos_token_id=256, torch_dtype="bfloat16"),
        dtype="BF16", shards=2, seed=22, qkv_bias=True, tokenizer=True),
    "mistral": dict(
        config=dict(BASE, model_type="mistral", architectures=["MistralForCausalLM"],
                    vocab_size=256, num_key_value_heads=4, head_dim=12, sliding_window=None,
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    torch_dtype="float16"),
        dtype="F16", shards=1, seed=23),
    "llama3_scaled": dict(
        config=dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=256,
                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                    attention_bias=False, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64},
                    torch_dtype="float32"),
        dtype="F32", shards=1, seed=24),
}


def main():
    lines = [f"# Generated by tests/golden/make_llama_goldens.py with torch {torch.__version__}; "
             "do not edit."]
    for name, m in MODELS.items():
        cfg = m["config"]
        w = random_weights(shapes(cfg, m.get("qkv_bias", False)), m["seed"], m["dtype"])
        out = os.path.join(ROOT, "hf", name)
        write_directory(out, cfg, w, m["shards"])
        if m.get("tokenizer"):
            write_tokenizer(out)
        gen = torch.Generator().manual_seed(m["seed"])
        ids = torch.randint(0, 256, (2, 7), generator=gen)
        put(lines, name + ".ids", ids)
        put(lines, name + ".logits", logits(w, cfg, ids))
        put(lines, name + ".greedy", torch.tensor(greedy(w, cfg, ids[0].tolist())))
    with open(os.path.join(ROOT, "llama.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
