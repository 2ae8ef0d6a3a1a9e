"""Hugging Face interop goldens, without network access or the transformers package.

  /usr/bin/python3 tests/golden/make_hf_goldens.py            # writes the fixtures below
  /usr/bin/python3 tests/golden/make_hf_goldens.py --check DIR

The first form builds a small random GPT-2 and BERT under Hugging Face's tensor names and
config.json fields, in plain PyTorch (the forward passes below follow transformers' GPT2LMHeadModel
and BertForPreTraining), writes each as a hub-style directory with safetensors written by the
standard library, and records their outputs on fixed inputs:
  tests/golden/hf/gpt2/   config.json, model.safetensors (GPT2Model names, no "transformer."
                          prefix, with the attention-mask buffers old hub files carry),
                          vocab.json + merges.txt (a byte-level vocabulary without merges)
  tests/golden/hf/bert/   config.json, model.safetensors (BertForPreTraining names, with the
                          int64 position_ids buffer and the tied decoder copy), vocab.txt
  tests/golden/hf.txt     inputs and outputs, read by tests/formats/test_hf_interop.cpp
The second form loads a directory written by `forge export --format hf` into the same PyTorch
model and checks its outputs on the same inputs against the golden (the round trip
Forge -> transformers' layout -> PyTorch).
"""
import json
import math
import os
import struct
import sys

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
dt = torch.float64
DTYPES = {"F32": (torch.float32, 4), "I64": (torch.int64, 8), "F16": (torch.float16, 2),
          "BF16": (torch.bfloat16, 2), "F64": (torch.float64, 8)}

GPT = dict(vocab_size=257, n_positions=16, n_embd=32, n_layer=2, n_head=4)
BERT = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=16, type_vocab_size=2)


def write_safetensors(path, tensors):
    """The format: u64 little-endian header length, the JSON header, the data (8-aligned)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        code = next(k for k, (d, _) in DTYPES.items() if d == t.dtype)
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        dtype, size = DTYPES[e["dtype"]]
        a, b = e["data_offsets"]
        buf = bytearray(raw[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(e["shape"]) \
            if b > a else torch.zeros(e["shape"], dtype=dtype)
    return out


def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w.to(dt), b.to(dt), eps)


def attention(q, k, v, n_head, causal, key_mask=None):
    B, T, C = q.shape
    hd = C // n_head
    q, k, v = (t.view(B, T, n_head, hd).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


def gpt2_logits(w, cfg, ids, p=""):
    """GPT2LMHeadModel: Conv1D weights are [in, out] (y = x W + b); gelu_new; tied head."""
    g = lambda n: w[p + n].to(dt)
    conv = lambda x, n: x @ g(n + ".weight") + g(n + ".bias")
    x = g("wte.weight")[ids] + g("wpe.weight")[torch.arange(ids.shape[1])]
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        a = layer_norm(x, g(h + "ln_1.weight"), g(h + "ln_1.bias"), cfg["layer_norm_epsilon"])
        q, k, v = conv(a, h + "attn.c_attn").split(cfg["n_embd"], dim=2)
        x = x + conv(attention(q, k, v, cfg["n_head"], True), h + "attn.c_proj")
        m = layer_norm(x, g(h + "ln_2.weight"), g(h + "ln_2.bias"), cfg["layer_norm_epsilon"])
        f = torch.nn.functional.gelu(conv(m, h + "mlp.c_fc"), approximate="tanh")
        x = x + conv(f, h + "mlp.c_proj")
    x = layer_norm(x, g("ln_f.weight"), g("ln_f.bias"), cfg["layer_norm_epsilon"])
    return x @ g("wte.weight").T


def bert_outputs(w, cfg, ids, segments, mask, p="bert."):
    """BertForPreTraining (post-norm, exact GELU): MLM logits at every position and NSP logits."""
    g = lambda n: w[n].to(dt)
    lin = lambda x, n: x @ g(n + ".weight").T + g(n + ".bias")
    eps = cfg["layer_norm_eps"]
    ln = lambda x, n: layer_norm(x, g(n + ".weight"), g(n + ".bias"), eps)
    e = p + "embeddings."
    x = (g(e + "word_embeddings.weight")[ids] +
         g(e + "position_embeddings.weight")[torch.arange(ids.shape[1])] +
         g(e + "token_type_embeddings.weight")[segments])
    x = ln(x, e + "LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        h = f"{p}encoder.layer.{i}."
        s = h + "attention.self."
        a = attention(lin(x, s + "query"), lin(x, s + "key"), lin(x, s + "value"),
                      cfg["num_attention_heads"], False, mask)
        x = ln(lin(a, h + "attention.output.dense") + x, h + "attention.output.LayerNorm")
        f = torch.nn.functional.gelu(lin(x, h + "intermediate.dense"))
        x = ln(lin(f, h + "output.dense") + x, h + "output.LayerNorm")
    pooled = torch.tanh(lin(x[:, 0], p + "pooler.dense"))
    t = torch.nn.functional.gelu(lin(x, "cls.predictions.transform.dense"))
    t = ln(t, "cls.predictions.transform.LayerNorm")
    mlm = t @ g(e + "word_embeddings.weight").T + g("cls.predictions.bias")
    return mlm, lin(pooled, "cls.seq_relationship")


def inputs():
    gen = torch.Generator().manual_seed(7)
    gpt_ids = torch.randint(0, GPT["vocab_size"], (2, 9), generator=gen)
    bert_ids = torch.randint(5, BERT["vocab_size"], (2, 10), generator=gen)
    bert_ids[:, 0] = 2  # [CLS]
    segments = torch.zeros(2, 10, dtype=torch.long)
    segments[:, 5:] = 1
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False  # the second row is padded after 7 tokens
    bert_ids[1, 7:] = 0  # [PAD]
    return gpt_ids, bert_ids, segments, mask


def random_weights(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in shapes:
        t = torch.randn(shape, generator=gen) * (0.3 if len(shape) == 2 else 0.1)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "LayerNorm.weight")):
            t = 1 + t
        w[name] = t.float()
    return w


def write_byte_vocab(out):
    """vocab.json and merges.txt of a byte-level BPE without merges: GPT-2's byte-to-unicode
    spelling of the 256 bytes, then its end-of-text token."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(cs)}
    vocab["<|endoftext|>"] = 256
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")


def gpt2_directory(out):
    cfg = dict(GPT, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=16,
               n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
               resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, tie_word_embeddings=True)
    C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    shapes = [("wte.weight", (V, C)), ("wpe.weight", (P, C))]
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        shapes += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                   (h + "attn.c_attn.weight", (C, 3 * C)), (h + "attn.c_attn.bias", (3 * C,)),
                   (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                   (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                   (h + "mlp.c_fc.weight", (C, 4 * C)), (h + "mlp.c_fc.bias", (4 * C,)),
                   (h + "mlp.c_proj.weight", (4 * C, C)), (h + "mlp.c_proj.bias", (C,))]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    w = random_weights(shapes, 11)
    stored = dict(w)
    for i in range(cfg["n_layer"]):  # transformers < 4.30 saved the causal mask as a buffer
        stored[f"h.{i}.attn.bias"] = torch.ones(1, 1, P, P).tril()
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), stored)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_byte_vocab(out)
    return w, cfg


def bert_directory(out):
    cfg = dict(BERT, model_type="bert", architectures=["BertForPreTraining"], hidden_act="gelu",
               hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12,
               pad_token_id=0, position_embedding_type="absolute")
    C, V, F = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    e = "bert.embeddings."
    shapes = [(e + "word_embeddings.weight", (V, C)),
              (e + "position_embeddings.weight", (cfg["max_position_embeddings"], C)),
              (e + "token_type_embeddings.weight", (cfg["type_vocab_size"], C)),
              (e + "LayerNorm.weight", (C,)), (e + "LayerNorm.bias", (C,))]
    for i in range(cfg["num_hidden_layers"]):
        h = f"bert.encoder.layer.{i}."
        for m in ("query", "key", "value"):
            shapes += [(h + f"attention.self.{m}.weight", (C, C)),
                       (h + f"attention.self.{m}.bias", (C,))]
        shapes += [(h + "attention.output.dense.weight", (C, C)),
                   (h + "attention.output.dense.bias", (C,)),
                   (h + "attention.output.LayerNorm.weight", (C,)),
                   (h + "attention.output.LayerNorm.bias", (C,)),
                   (h + "intermediate.dense.weight", (F, C)), (h + "intermediate.dense.bias", (F,)),
                   (h + "output.dense.weight", (C, F)), (h + "output.dense.bias", (C,)),
                   (h + "output.LayerNorm.weight", (C,)), (h + "output.LayerNorm.bias", (C,))]
    shapes += [("bert.pooler.dense.weight", (C, C)), ("bert.pooler.dense.bias", (C,)),
               ("cls.predictions.bias", (V,)),
               ("cls.predictions.transform.dense.weight", (C, C)),
               ("cls.predictions.transform.dense.bias", (C,)),
               ("cls.predictions.transform.LayerNorm.weight", (C,)),
               ("cls.predictions.transform.LayerNorm.bias", (C,)),
               ("cls.seq_relationship.weight", (2, C)), ("cls.seq_relationship.bias", (2,))]
    w = random_weights(shapes, 12)
    stored = dict(w)
    stored["bert.embeddings.position_ids"] = torch.arange(cfg["max_position_embeddings"])[None]
    stored["cls.predictions.decoder.weight"] = w[e + "word_embeddings.weight"]
    stored["cls.predictions.decoder.bias"] = w["cls.predictions.bias"]
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), stored)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "king", "queen", "lord",
             "love", "night", "day", "sweet", "fair", "##s", "##ed", "##ing", "a", "b", "c",
             "d", "e", "f", "g", "h", "i", "k", "l", "m", "n", "o", "p", "r", "s", "t", "u",
             "w", "y", ",", "."]
    assert len(words) == V
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    return w, cfg


def put(lines, name, t):
    v = t.detach().reshape(-1).tolist()
    lines.append(f"{name} {len(v)} " + " ".join(repr(float(x)) for x in v))


def outputs(kind, w, cfg, prefix):
    gpt_ids, bert_ids, segments, mask = inputs()
    if kind == "gpt2":
        return {"gpt2.logits": gpt2_logits(w, cfg, gpt_ids, prefix)}
    mlm, nsp = bert_outputs(w, cfg, bert_ids, segments, mask, prefix)
    return {"bert.mlm_logits": mlm, "bert.nsp_logits": nsp}


def write():
    gpt_w, gpt_cfg = gpt2_directory(os.path.join(ROOT, "hf", "gpt2"))
    bert_w, bert_cfg = bert_directory(os.path.join(ROOT, "hf", "bert"))
    gpt_ids, bert_ids, segments, mask = inputs()
    lines = [f"# Generated by tests/golden/make_hf_goldens.py with torch {torch.__version__}; "
             "do not edit."]
    put(lines, "gpt2.ids", gpt_ids)
    put(lines, "bert.ids", bert_ids)
    put(lines, "bert.segments", segments)
    put(lines, "bert.mask", mask.long())
    for name, t in {**outputs("gpt2", gpt_w, gpt_cfg, ""),
                    **outputs("bert", bert_w, bert_cfg, "bert.")}.items():
        put(lines, name, t)
    with open(os.path.join(ROOT, "hf.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def check(directory):
    """A directory Forge exported, run by the PyTorch model above, against the golden outputs."""
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(directory, "model.safetensors"))
    kind = cfg["model_type"]
    if kind == "gpt2":
        prefix = "transformer."
        w = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in w.items()}
        got = outputs(kind, w, cfg, "")
    else:
        got = outputs(kind, w, cfg, "bert.")
    golden = {}
    with open(os.path.join(ROOT, "hf.txt")) as f:
        for line in f:
            if not line.startswith("#"):
                name, _, *values = line.split()
                golden[name] = torch.tensor([float(v) for v in values], dtype=dt)
    _, _, _, mask = inputs()
    worst = 0.0
    for name, t in got.items():
        diff = (t.reshape(-1) - golden[name]).abs().reshape(t.shape)
        if name == "bert.mlm_logits":  # padded positions' outputs are not part of the contract
            diff = diff[mask]
        worst = max(worst, diff.max().item())
    print(f"{directory}: {kind}, max |difference| to the golden outputs {worst:.3g}")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        write()
