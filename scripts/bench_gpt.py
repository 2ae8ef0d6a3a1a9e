"""PyTorch half of `scripts/bench gpt`: trains the model of a Forge GPT config (a nanoGPT-style
GPT-2: learned positions, pre-norm LayerNorm, fused qkv, GELU-tanh MLP, tied head) with the same
batch, context, AdamW groups, schedule and clipping, and prints
"params=N tok_s=X tok_s_total=Z peak_mb=Y ...": tok_s from the median step time (robust to other
work on a shared machine), tok_s_total over all timed steps. Run with Debian's /usr/bin/python3
(torch 1.13). What every suite of scripts/bench_train.sh shares (config sections, the schedule,
AdamW groups, one clipped update, the timed loop and its output line) is here too; the other
scripts/bench_*.py of those suites import it.
"""
import argparse
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

# Forge's defaults (docs/config.md) for the keys this benchmark reads, so a config that leaves
# them out trains the same model; scripts/bench_train.sh passes the fully resolved config anyway.
DEFAULTS = {
    "model": {"vocab_size": 256, "context": 128, "d_model": 128, "n_layers": 4, "n_heads": 4,
              "dropout": 0.0, "bias": True, "norm": "layernorm", "position": "learned",
              "mlp": "gelu", "ffn_mult": 4.0, "tie_embeddings": True, "norm_eps": 1e-5},
    "data": {"tokenizer": "bytes", "val": "", "val_fraction": 0.1},
    "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": 0.0, "decay_1d": False, "layer_lr_decay": 1.0},
    "schedule": {"name": "constant", "warmup_steps": 0, "min_lr": 0.0},
    "train": {"batch_size": 8, "grad_accum": 1, "max_steps": 1000, "clip_grad_norm": 1.0,
              "precision": "fp32"},
}
SCHEDULES = ("constant", "warmup_cosine", "warmup_linear")


def read_sections(path, defaults):
    """The config's sections over `defaults` (section -> key -> value), and the raw YAML."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    config = {section: dict(keys, **(raw.get(section) or {})) for section, keys in defaults.items()}
    config["seed"] = raw.get("seed", 1337)
    return config, raw


def load_config(path):
    config, raw = read_sections(path, DEFAULTS)
    config["data"]["train"] = raw["data"]["train"]
    m, o, s = config["model"], config["optimizer"], config["schedule"]
    unsupported = [(m["norm"], "layernorm"), (m["position"], "learned"), (m["mlp"], "gelu"),
                   (o["name"], "adamw"), (config["data"]["tokenizer"], "bytes"),
                   (o["layer_lr_decay"], 1.0)]
    if s["name"] not in SCHEDULES:
        unsupported.append((s["name"], "warmup_cosine"))
    for got, want in unsupported:
        if got != want:
            sys.exit(f"bench_gpt.py: {path}: only the GPT-2 variant with AdamW and a constant, "
                     f"warmup_cosine or warmup_linear schedule is benchmarked; got {got!r} where "
                     f"{want!r} is needed")
    return config


class Block(nn.Module):
    """Pre-norm block as nanoGPT writes it for torch < 2.0 (no scaled_dot_product_attention).
    Dropout on the residual branches only: Forge's fused attention has no attention-weight dropout."""

    def __init__(self, m):
        super().__init__()
        C, bias = m["d_model"], m["bias"]
        hidden = int(m["ffn_mult"]) * C
        self.n_heads = m["n_heads"]
        self.ln_1 = nn.LayerNorm(C, eps=m["norm_eps"], elementwise_affine=True)
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.attn_proj = nn.Linear(C, C, bias=bias)
        self.ln_2 = nn.LayerNorm(C, eps=m["norm_eps"])
        self.c_fc = nn.Linear(C, hidden, bias=bias)
        self.mlp_proj = nn.Linear(hidden, C, bias=bias)
        self.drop = nn.Dropout(m["dropout"])
        if not bias:  # torch 1.13's LayerNorm always has a bias: freeze it at zero, out of the count
            for ln in (self.ln_1, self.ln_2):
                ln.bias = None
        T = m["context"]
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                             persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.drop(self.attn_proj(y))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        V, C = m["vocab_size"], m["d_model"]
        self.tok_emb = nn.Embedding(V, C)
        self.pos_emb = nn.Embedding(m["context"], C)
        self.drop = nn.Dropout(m["dropout"])
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        self.ln_f = nn.LayerNorm(C, eps=m["norm_eps"])
        if not m["bias"]:
            self.ln_f.bias = None
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(C, V, bias=False)
        # GPT-2 init (N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)): not needed
        # for speed, but keeps the loss curve comparable with Forge's.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * m["n_layers"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias") and "ln" not in name:
                nn.init.zeros_(p)

    def hidden(self, ids):
        """Final hidden states [B, T, C], after ln_f (what Forge's GPTOutput::hidden returns)."""
        T = ids.shape[1]
        x = self.drop(self.tok_emb(ids) + self.pos_emb.weight[:T])
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def logits(self, hidden):
        """Logits as rows [B*T, V] through the (possibly tied) head."""
        logits = F.linear(hidden, self.lm_head.weight if self.lm_head else self.tok_emb.weight)
        return logits.view(-1, logits.size(-1))

    def forward(self, ids, targets):
        return F.cross_entropy(self.logits(self.hidden(ids)), targets.view(-1))


def learning_rate(s, o, max_steps, step):
    """Forge's optim/schedule.cpp: nanoGPT warm-up (step+1)/(warmup+1), then cosine (or a straight
    line, warmup_linear) to min_lr at max_steps."""
    base = o["lr"]
    if s["name"] == "constant":
        return base
    if step < s["warmup_steps"]:
        return base * (step + 1) / (s["warmup_steps"] + 1)
    if step >= max_steps:
        return s["min_lr"]
    progress = (step - s["warmup_steps"]) / (max_steps - s["warmup_steps"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress)) if s["name"] == "warmup_cosine" \
        else 1.0 - progress
    return s["min_lr"] + coeff * (base - s["min_lr"])


def argument_parser(description, family):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("config", help=f"a Forge {family} config (YAML)")
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--threads", type=int, default=2)
    # PyTorch at its best: AdamW's multi-tensor path measured 5-30% faster per step on the small
    # config than torch 1.13's default per-tensor loop (equal on the medium one).
    parser.add_argument("--no-foreach", dest="foreach", action="store_false",
                        help="AdamW's per-tensor loop (torch 1.13's default) instead of foreach")
    parser.add_argument("--params-only", action="store_true", help="print params=N and exit")
    return parser


def adamw(params, o, foreach):
    """Forge's groups: decoupled decay on >= 2-D weights (all of them, embeddings included), none
    on 1-D ones unless decay_1d."""
    decay = [p for p in params if p.dim() >= 2 or o["decay_1d"]]
    no_decay = [p for p in params if not (p.dim() >= 2 or o["decay_1d"])]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": o["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], foreach=foreach)


def train_and_report(args, config, params, optimizer, step_loss, per_step, unit="tok"):
    """Runs warmup + steps optimizer steps, each `step_loss(step)` (forward and backward of all its
    micro-batches, returning the step's loss as a 0-d tensor), clipping and the schedule as Forge's
    trainer does, and prints the result line, its rates in `unit`s (per_step of them a step: tokens,
    or pairs for scripts/bench_dpo.py), with the first step's loss and the last one's."""

    def step(i):
        loss = step_loss(i)
        clip_and_update(params, optimizer, config, i)
        return loss.item()  # the sync a training loop does to log its loss

    time_and_report(args, params, step, per_step, unit)


def clip_and_update(params, optimizer, config, step):
    """One optimizer update as Forge's trainer makes it: the global gradient norm clipped at
    train.clip_grad_norm (none when 0), the schedule's learning rate at `step`, AdamW, zeroed
    gradients."""
    o, s, tc = config["optimizer"], config["schedule"], config["train"]
    torch.nn.utils.clip_grad_norm_(params, tc["clip_grad_norm"] if tc["clip_grad_norm"] > 0
                                   else float("inf"))
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(s, o, tc["max_steps"], step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_and_report(args, params, step, per_step, unit):
    """Times warmup + steps calls of `step(i)` (one training step, returning its loss as a float)
    and prints "params=N UNIT_s=X UNIT_s_total=Z peak_mb=Y steps=S loss=L first_loss=F": X from
    the median step time, Z over all timed steps, N the trained parameters."""
    times = [time.perf_counter()]
    losses = []
    for i in range(args.warmup + args.steps):
        losses.append(step(i))
        times.append(time.perf_counter())
    step_s = [b - a for a, b in zip(times[args.warmup:], times[args.warmup + 1:])]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"params={sum(p.numel() for p in params)} "
          f"{unit}_s={per_step / statistics.median(step_s):.1f} "
          f"{unit}_s_total={per_step * len(step_s) / sum(step_s):.1f} peak_mb={peak_mb:.1f} "
          f"steps={args.steps} loss={losses[-1]:.4f} first_loss={losses[0]:.4f}")


def training_bytes(config):
    """The training split of a text data.train as Forge makes it: the head of the file, or all of
    it when data.val is given (data.val itself is not read)."""
    with open(config["data"]["train"], "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if not config["data"]["val"]:
        data = data[: len(data) - int(len(data) * config["data"]["val_fraction"])]
    return data


def autocast(config):
    """train.precision bf16 as PyTorch users run it: CPU autocast to bfloat16 around the forward
    and the loss (fp32 weights, gradients and optimizer state), backward outside it."""
    bf16 = config is not None and config["train"]["precision"] == "bf16"
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def window_step_loss(model, data, B, T, accum, config=None):
    """One step's loss over `accum` micro-batches of B random windows of T + 1 tokens of `data`
    (nanoGPT's get_batch), backpropagated; the function train_and_report times."""
    offsets = torch.arange(T + 1)

    def step_loss(step):
        for _ in range(accum):
            windows = data[torch.randint(len(data) - T, (B, 1)) + offsets]
            with autocast(config):
                loss = model(windows[:, :-1].contiguous(), windows[:, 1:].contiguous()) / accum
            loss.backward()
        return loss.detach() * accum

    return step_loss


def main():
    args = argument_parser(__doc__, "GPT").parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    m, tc = config["model"], config["train"]
    torch.manual_seed(config["seed"])
    model = GPT(m)
    params = list(model.parameters())  # tied weight counted once
    if args.params_only:
        print(f"params={sum(p.numel() for p in params)}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)

    # Random windows of context + 1 bytes, nanoGPT's get_batch.
    data = training_bytes(config)
    B, T, accum = tc["batch_size"], m["context"], tc["grad_accum"]
    model.train()
    train_and_report(args, config, params, optimizer,
                     window_step_loss(model, data, B, T, accum, config), B * T * accum)


if __name__ == "__main__":
    main()
