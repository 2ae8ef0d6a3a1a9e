"""PyTorch half of `scripts/bench bert`: trains the model of a Forge BERT config (nn/bert.h: token +
learned position + segment embeddings, LayerNorm, post-norm encoder blocks with fused qkv over a
key-padding mask, tanh pooler, MLM head tied to the token embedding, NSP head) with the same batch,
context, AdamW groups, schedule and clipping, and prints the line of scripts/bench_gpt.py
("params=N tok_s=X tok_s_total=Z peak_mb=Y ..."). Batches are random stand-ins for Forge's
sentence pairs, with the same shape: [CLS] A [SEP] B [SEP] over the whole context but for a random
padding tail of 0-6% per row (Forge's Tiny Shakespeare batches: always the full context, 2.9%
padding), and round(mask_prob) of the non-special positions chosen for the masked-LM loss. Run with Debian's /usr/bin/python3 (torch 1.13).
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_gpt import adamw, argument_parser, read_sections, train_and_report, SCHEDULES

# Forge's defaults (docs/config.md) for the keys read here; scripts/bench_train.sh passes the fully
# resolved config anyway.
DEFAULTS = {
    "model": {"arch": "bert", "vocab_size": 256, "context": 128, "d_model": 128, "n_layers": 4,
              "n_heads": 4, "dropout": 0.0, "bias": True, "norm": "layernorm",
              "position": "learned", "mlp": "gelu", "ffn_mult": 4.0, "tie_embeddings": True,
              "norm_eps": 1e-5, "norm_placement": "auto"},
    "data": {"special_tokens": []},
    "bert": {"mask_prob": 0.15, "type_vocab_size": 2},
    "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": 0.0, "decay_1d": False, "layer_lr_decay": 1.0},
    "schedule": {"name": "constant", "warmup_steps": 0, "min_lr": 0.0},
    "train": {"batch_size": 8, "grad_accum": 1, "max_steps": 1000, "clip_grad_norm": 1.0},
}


def load_config(path):
    config, _ = read_sections(path, DEFAULTS)
    m, o, s = config["model"], config["optimizer"], config["schedule"]
    # Fixed by the bert_pretrain recipe (docs/config.md) or not modelled here.
    unsupported = [(m["arch"], "bert"), (m["norm_placement"] in ("auto", "post"), True),
                   (o["name"], "adamw"), (o["layer_lr_decay"], 1.0),
                   (s["name"] in SCHEDULES, True)]
    for got, want in unsupported:
        if got != want:
            sys.exit(f"bench_bert.py: {path}: only post-norm BERT with AdamW and a constant, "
                     f"warmup_cosine or warmup_linear schedule is benchmarked; got {got!r} where "
                     f"{want!r} is needed")
    return config


class Block(nn.Module):
    """Post-norm encoder block, x = LN(x + drop(proj(attn(x)))), x = LN(x + drop(fc2(gelu(fc(x))))).
    Attention as matmul + softmax (torch 1.13 has no scaled_dot_product_attention), with no dropout
    on the probabilities: Forge's fused attention has none."""

    def __init__(self, m, d_ff):
        super().__init__()
        C, eps = m["d_model"], m["norm_eps"]
        self.n_heads = m["n_heads"]
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln1 = nn.LayerNorm(C, eps=eps)
        self.fc = nn.Linear(C, d_ff)
        self.fc2 = nn.Linear(d_ff, C)
        self.ln2 = nn.LayerNorm(C, eps=eps)
        self.drop = nn.Dropout(m["dropout"])

    def attention(self, x, key_bias):  # key_bias [B, 1, 1, T]: 0 for real keys, -inf for padding
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        att = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H)) + key_bias).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.drop(self.proj(y))

    def forward(self, x, key_bias):
        x = self.ln1(x + self.attention(x, key_bias))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc(x)))))


class Bert(nn.Module):
    def __init__(self, m, type_vocab_size):
        super().__init__()
        V, C, eps = m["vocab_size"], m["d_model"], m["norm_eps"]
        d_ff = round(m["ffn_mult"] * C)  # runtime/components.cpp: llround(ffn_mult * d_model)
        self.tok_emb = nn.Embedding(V, C)
        self.pos_emb = nn.Embedding(m["context"], C)
        self.seg_emb = nn.Embedding(type_vocab_size, C)
        self.emb_ln = nn.LayerNorm(C, eps=eps)
        self.drop = nn.Dropout(m["dropout"])
        self.blocks = nn.ModuleList(Block(m, d_ff) for _ in range(m["n_layers"]))
        self.pooler = nn.Linear(C, C)
        self.mlm_dense = nn.Linear(C, C)
        self.mlm_ln = nn.LayerNorm(C, eps=eps)
        self.mlm_bias = nn.Parameter(torch.zeros(V))  # decoder weight: tok_emb.weight (tied)
        self.nsp = nn.Linear(C, 2)
        # Forge's init (nn/bert.h): N(0, 0.02) weights, zero biases, unit LayerNorms; not needed for
        # speed, but keeps the loss comparable.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def pair_losses(self, ids, segments, key_bias, mlm_positions, mlm_targets, nsp_labels):
        """Summed MLM and NSP cross-entropy, the final hidden states [B, T, C] and the MLM logits
        of the chosen rows, as Forge's recipes/bert_objective.cpp pair_losses."""
        B, T = ids.shape
        C = self.tok_emb.embedding_dim
        x = self.tok_emb(ids) + self.pos_emb.weight[:T] + self.seg_emb(segments)
        x = self.drop(self.emb_ln(x))
        for block in self.blocks:
            x = block(x, key_bias)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        # The V-wide decoder runs on the chosen rows only, as in Forge's recipe.
        rows = x.reshape(B * T, C).index_select(0, mlm_positions)
        rows = self.mlm_ln(F.gelu(self.mlm_dense(rows)))
        mlm_logits = F.linear(rows, self.tok_emb.weight, self.mlm_bias)
        mlm_sum = F.cross_entropy(mlm_logits, mlm_targets, reduction="sum")
        nsp_sum = F.cross_entropy(self.nsp(pooled), nsp_labels, reduction="sum")
        return mlm_sum, nsp_sum, x, mlm_logits

    def forward(self, *batch):
        return self.pair_losses(*batch)[:2]


def random_batch(B, T, V, n_special, mask_prob):
    """B pairs [CLS] A [SEP] B [SEP] [PAD]... of random tokens: each row real for T minus 0-6%,
    A/B split at a random point, round(mask_prob) of the non-special real positions chosen (flat
    indices b*T+t, increasing, as Forge's BertBatch.mlm_positions)."""
    pad, cls, sep = V - n_special, V - n_special + 1, V - n_special + 2
    lengths = T - torch.randint(0, T // 16 + 1, (B,))
    split = (torch.rand(B) * (lengths - 4).float()).long() + 2  # the first [SEP], in [2, len - 2)
    t = torch.arange(T).expand(B, T)
    real = t < lengths[:, None]
    ids = torch.randint(0, V - n_special, (B, T))
    first_sep, last = t == split[:, None], t == (lengths - 1)[:, None]
    ids[first_sep | last] = sep
    ids[:, 0] = cls
    ids[~real] = pad
    segments = ((t > split[:, None]) & real).long()
    candidate = real & (t != 0) & ~first_sep & ~last
    # A random permutation of each row's candidates, first round(mask_prob * count) kept.
    n_chosen = (candidate.sum(1).double() * mask_prob).round().clamp(min=1).long()
    order = torch.rand(B, T).masked_fill(~candidate, 2.0).argsort(1)
    rank = torch.empty_like(order).scatter_(1, order, t.contiguous())
    chosen = rank < n_chosen[:, None]
    positions = chosen.view(-1).nonzero().squeeze(1)
    targets = torch.randint(0, V - n_special, (positions.numel(),))
    key_bias = torch.zeros(B, 1, 1, T).masked_fill(~real[:, None, None, :], float("-inf"))
    nsp_labels = torch.randint(0, 2, (B,))
    return ids, segments, key_bias, positions, targets, nsp_labels


def main():
    args = argument_parser(__doc__, "BERT").parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    m, tc = config["model"], config["train"]
    torch.manual_seed(config["seed"])
    model = Bert(m, config["bert"]["type_vocab_size"])
    params = list(model.parameters())  # tied decoder weight counted once
    if args.params_only:
        print(f"params={sum(p.numel() for p in params)}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)

    B, T, accum, V = tc["batch_size"], m["context"], tc["grad_accum"], m["vocab_size"]
    n_special = max(4, len(config["data"]["special_tokens"]))

    # Forge's objective (recipes/bert_pretrain.cpp): mean MLM cross-entropy over all positions
    # chosen in the step plus mean NSP cross-entropy over its pairs, so the step's batches come
    # first when it accumulates several.
    def step_loss(step):
        batches = [random_batch(B, T, V, n_special, config["bert"]["mask_prob"])
                   for _ in range(accum)]
        chosen = sum(b[3].numel() for b in batches)
        for batch in batches:
            mlm_sum, nsp_sum = model(*batch)
            loss = mlm_sum / chosen + nsp_sum / (B * accum)
            loss.backward()
        return loss.detach()

    model.train()
    train_and_report(args, config, params, optimizer, step_loss, B * T * accum)


if __name__ == "__main__":
    main()
