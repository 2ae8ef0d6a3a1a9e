"""Writes tests/golden/bert.txt: hidden states, pooled output, MLM and NSP logits, loss and gradients
of a tiny BERT computed by PyTorch 1.13 (float64), read by tests/nn/test_bert.cpp. Run from the
repository root with Debian's torch:
    /usr/bin/python3 tests/golden/make_bert_goldens.py
The reference is a plain-torch mirror of Hugging Face's BertForPreTraining (module tree, parameter
names and forward code follow transformers' modeling_bert.py; transformers itself is not installed):
separate query/key/value Linears, additive attention mask of finfo.min, erf GELU, post-norm blocks,
tanh pooler on token 0, MLM transform + decoder tied to the word embeddings + cls.predictions.bias,
NSP Linear(C, 2). A pre_norm flag turns the blocks into x + attn(LN(x)), x + ff(LN(x)) with a final
LayerNorm (as Megatron-BERT, but keeping the embedding LayerNorm), which Forge offers as an option.
Both sides fill the weights without any RNG: Forge parameter number k (in Forge name order) gets
    w[i] = base + 0.1 * sin(0.37 * i + 0.0013 * i * i + 0.7 * k),   i = 0 .. numel-1 (row-major)
with base = 1 for 1-D ".weight" tensors (LayerNorm scales) and 0 otherwise; Forge's fused qkv
[3C, C] maps to query/key/value as rows [0, C), [C, 2C), [2C, 3C). Each line is
"name n v1 ... vn"; per Forge parameter P: "<variant>.grad.<P>.norm" (L2 norm of the gradient) and
"<variant>.grad.<P>.at" (entries at flat indices 0, n/5, 2n/5, 3n/5, 4n/5, n-1). Also the parameter
count of BERT-base BertForPreTraining ("bert_base.num_params"), built in float32 on the CPU.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

lines = []


def put(name, values):
    values = [float(v) for v in values]
    lines.append(f"{name} {len(values)} " + " ".join(repr(v) for v in values))


class Cfg:
    def __init__(self, V, P, S, C, L, H, FF, pre_norm, eps=1e-12):
        self.vocab_size, self.max_position_embeddings, self.type_vocab_size = V, P, S
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = C, L, H
        self.intermediate_size, self.pre_norm, self.layer_norm_eps = FF, pre_norm, eps


# ---- the HF BertForPreTraining mirror (dropout 0) ----

class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids, token_type_ids):
        T = input_ids.shape[1]
        position_ids = torch.arange(T)[None, :]
        emb = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        emb = emb + self.position_embeddings(position_ids)
        return self.LayerNorm(emb)


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.d = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, extended_mask):
        B, T, C = x.shape
        split = lambda t: t.view(B, T, self.h, self.d).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d) + extended_mask
        probs = scores.softmax(-1)
        return (probs @ v).permute(0, 2, 1, 3).reshape(B, T, C)


class BertAttention(nn.Module):  # self + output (dense, LayerNorm) as HF names them
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = nn.Module()
        self.output.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.output.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pre_norm = c.pre_norm
        self.attention = BertAttention(c)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.output = nn.Module()
        self.output.dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.output.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x, m):
        a, o = self.attention, self.output
        ff = lambda h: o.dense(F.gelu(self.intermediate.dense(h)))
        if self.pre_norm:
            x = x + a.output.dense(a.self(a.output.LayerNorm(x), m))
            return x + ff(o.LayerNorm(x))
        x = a.output.LayerNorm(x + a.output.dense(a.self(x, m)))
        return o.LayerNorm(x + ff(x))


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])
        if c.pre_norm:
            self.encoder.ln = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, input_ids, token_type_ids, attention_mask):
        dt = self.pooler.dense.weight.dtype
        extended = (1.0 - attention_mask[:, None, None, :].to(dt)) * torch.finfo(dt).min
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            x = layer(x, extended)
        if hasattr(self.encoder, "ln"):
            x = self.encoder.ln(x)
        return x, torch.tanh(self.pooler.dense(x[:, 0]))


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        p = self.cls.predictions
        p.transform = nn.Module()
        p.transform.dense = nn.Linear(c.hidden_size, c.hidden_size)
        p.transform.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        p.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        p.bias = nn.Parameter(torch.zeros(c.vocab_size))
        p.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied
        self.cls.seq_relationship = nn.Linear(c.hidden_size, 2)

    def mlm_logits(self, rows):
        t = self.cls.predictions.transform
        h = t.LayerNorm(F.gelu(t.dense(rows)))
        return self.cls.predictions.decoder(h) + self.cls.predictions.bias


def forge_to_hf(c):
    """(Forge name, HF name, row range of the HF tensor or None) in Forge parameter order."""
    C = c.hidden_size
    out = [("tok_emb.weight", "bert.embeddings.word_embeddings.weight"),
           ("pos_emb.weight", "bert.embeddings.position_embeddings.weight"),
           ("seg_emb.weight", "bert.embeddings.token_type_embeddings.weight"),
           ("emb_ln.weight", "bert.embeddings.LayerNorm.weight"),
           ("emb_ln.bias", "bert.embeddings.LayerNorm.bias")]
    for l in range(c.num_hidden_layers):
        f, h = f"blocks.{l}.", f"bert.encoder.layer.{l}."
        for wb in ("weight", "bias"):
            out.append((f + "attn.qkv." + wb, [h + f"attention.self.{n}.{wb}" for n in ("query", "key", "value")]))
        # Post-norm ln1 normalises x + attn; pre-norm ln1 normalises attn's input. HF's
        # attention.output.LayerNorm plays both roles here (see BertLayer.forward).
        for fn, hn in (("attn.proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                       ("ff.fc", "intermediate.dense"), ("ff.proj", "output.dense"),
                       ("ln2", "output.LayerNorm")):
            for wb in ("weight", "bias"):
                out.append((f + fn + "." + wb, h + hn + "." + wb))
    if c.pre_norm:
        out += [("ln_f.weight", "bert.encoder.ln.weight"), ("ln_f.bias", "bert.encoder.ln.bias")]
    out += [("pooler.weight", "bert.pooler.dense.weight"), ("pooler.bias", "bert.pooler.dense.bias"),
            ("mlm.dense.weight", "cls.predictions.transform.dense.weight"),
            ("mlm.dense.bias", "cls.predictions.transform.dense.bias"),
            ("mlm.ln.weight", "cls.predictions.transform.LayerNorm.weight"),
            ("mlm.ln.bias", "cls.predictions.transform.LayerNorm.bias"),
            ("mlm.bias", "cls.predictions.bias"),
            ("nsp.weight", "cls.seq_relationship.weight"), ("nsp.bias", "cls.seq_relationship.bias")]
    return out


def fill_formula(model, c):
    """Writes the formula weights; returns Forge name -> the HF parameter(s) holding it."""
    hf = dict(model.named_parameters())
    mapping = forge_to_hf(c)
    covered = [n for _, h in mapping for n in (h if isinstance(h, list) else [h])]
    assert sorted(covered) == sorted(hf), "every HF parameter mapped exactly once"
    for k, (fname, hname) in enumerate(mapping):
        parts = [hf[n] for n in (hname if isinstance(hname, list) else [hname])]
        shape = (sum(p.shape[0] for p in parts),) + tuple(parts[0].shape[1:])
        n = math.prod(shape)
        base = 1.0 if fname.endswith(".weight") and len(shape) == 1 else 0.0
        w = torch.tensor([base + 0.1 * math.sin(0.37 * i + 0.0013 * i * i + 0.7 * k) for i in range(n)],
                         dtype=torch.float64).reshape(shape)
        with torch.no_grad():
            for j, p in enumerate(parts):
                p.copy_(w[j * p.shape[0]:(j + 1) * p.shape[0]])
    return mapping, hf


def forge_grad(hf, hname):
    parts = [hf[n].grad for n in (hname if isinstance(hname, list) else [hname])]
    return torch.cat(parts, 0).reshape(-1)


V, P, S, C, L, H, FF = 13, 9, 2, 16, 2, 2, 40
B, T = 2, 7
ids = torch.tensor([[1, 5, 9, 2, 7, 3, 12], [1, 8, 4, 2, 11, 6, 10]])  # row 1: last 3 are padding
segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]])
mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
chosen = torch.tensor([2, 5, 8, 10])  # flat positions b * T + t of the MLM rows (all real)
mlm_targets = torch.tensor([3, 7, 11, 4])
# One NSP label for both rows: with labels 0 and 1 and near-uniform predictions the two rows'
# gradients on nsp.bias (each ~0.25) cancel to ~1e-4, which f32 cannot match to 1e-4 relative.
nsp_labels = torch.tensor([1, 1])
put("ids", ids.reshape(-1).tolist())
put("segments", segments.reshape(-1).tolist())
put("mask", mask.reshape(-1).tolist())
put("chosen", chosen.tolist())
put("mlm_targets", mlm_targets.tolist())
put("nsp_labels", nsp_labels.tolist())
for variant, pre_norm in (("post", False), ("pre", True)):
    c = Cfg(V, P, S, C, L, H, FF, pre_norm)
    model = BertForPreTraining(c).double()
    mapping, hf = fill_formula(model, c)
    hidden, pooled = model.bert(ids, segments, mask)
    mlm = model.mlm_logits(hidden.reshape(B * T, C)[chosen])
    nsp = model.cls.seq_relationship(pooled)
    loss = F.cross_entropy(mlm, mlm_targets) + F.cross_entropy(nsp, nsp_labels)
    loss.backward()
    put(f"{variant}.num_params", [len(mapping)])
    put(f"{variant}.hidden", hidden.detach().reshape(-1).tolist())
    put(f"{variant}.pooled", pooled.detach().reshape(-1).tolist())
    put(f"{variant}.mlm_logits", mlm.detach().reshape(-1).tolist())
    put(f"{variant}.nsp_logits", nsp.detach().reshape(-1).tolist())
    put(f"{variant}.loss", [loss.item()])
    for fname, hname in mapping:
        g = forge_grad(hf, hname)
        n = g.numel()
        at = [0, n // 5, 2 * n // 5, 3 * n // 5, 4 * n // 5, n - 1]
        put(f"{variant}.grad.{fname}.norm", [g.norm().item()])
        put(f"{variant}.grad.{fname}.at", [g[i].item() for i in at])

# BERT-base (uncased vocabulary): parameters counted once each, so the tied decoder counts once.
base = BertForPreTraining(Cfg(30522, 512, 2, 768, 12, 12, 3072, False))
put("bert_base.num_params", [sum(p.numel() for p in base.parameters())])
put("bert_base.bert_model_num_params", [sum(p.numel() for p in base.bert.parameters())])

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bert.txt")
with open(path, "w") as f:
    f.write(f"# Generated by tests/golden/make_bert_goldens.py with torch {torch.__version__}; do not edit.\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {path}: {len(lines)} lines")
