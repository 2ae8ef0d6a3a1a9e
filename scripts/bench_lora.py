"""PyTorch half of `scripts/bench lora`: the LoRA fine-tuning step of a Forge finetune config (the
GPT of scripts/bench_gpt.py, every weight frozen, a hand-written LoRA module, no PEFT, on the same
Linear layers as lora.targets picks in Forge: attn.qkv, attn.proj, mlp.fc, mlp.proj of every
block), with AdamW over the adapters only, the same batch, context, schedule and clipping, on the
bytes of the record files of data.train. Prints "params=N tok_s=X tok_s_total=Z peak_mb=Y ..." as
bench_gpt.py does (params there = the trained adapter elements). Run with /usr/bin/python3.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from bench_gpt import (GPT, adamw, argument_parser, load_config, train_and_report,
                       window_step_loss)

# Forge's lora: defaults (runtime/lora_config.cpp); the Forge module names of the four Linear
# layers of a block and their attribute in bench_gpt.Block.
LORA_DEFAULTS = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "rslora": False,
                 "targets": ["*.attn.qkv", "*.attn.proj", "*.mlp.*"], "train_also": []}
BLOCK_LINEARS = {"attn.qkv": "c_attn", "attn.proj": "attn_proj", "mlp.fc": "c_fc",
                 "mlp.proj": "mlp_proj"}


class LoRALinear(nn.Module):
    """y = x W^T + b + s * (x A^T) B^T over a frozen nn.Linear; A [r, in] Kaiming-uniform (as
    nn.Linear's own weight init, a = sqrt(5)), B [out, r] zero, s = alpha / r."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)


def glob_match(pattern, name):
    """Forge's target globs: '*' any run of characters (dots included), '?' one."""
    import fnmatch
    return fnmatch.fnmatchcase(name, pattern)


def inject_lora(model, lora):
    """Swaps the targeted Linear layers of the frozen model for LoRALinear."""
    wrapped = []
    for i, block in enumerate(model.blocks):
        for forge_name, attr in BLOCK_LINEARS.items():
            path = f"blocks.{i}.{forge_name}"
            if any(glob_match(t, path) for t in lora["targets"]):
                setattr(block, attr, LoRALinear(getattr(block, attr), lora["rank"], lora["alpha"]))
                wrapped.append(path)
    if not wrapped:
        sys.exit(f"bench_lora.py: lora.targets {lora['targets']} match no Linear layer")
    return wrapped


def read_records(path):
    """The bytes of the *.txt files of a record directory (Forge's data/records.cpp reads those
    only), or of one file, in name order."""
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".txt")) \
        if os.path.isdir(path) else [path]
    out = bytearray()
    for f in files:
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                out += fh.read()
    return out


def train_adapters(args, config, model, inject):
    """Freezes `model`, adapts it with inject(model, lora settings) and trains the adapters as
    Forge's finetune recipe does (or prints the parameter counts, --params-only). Shared with
    scripts/bench_llama.py."""
    with open(args.config) as f:
        lora = dict(LORA_DEFAULTS, **((yaml.safe_load(f) or {}).get("lora") or {}))
    unsupported = [k for k in ("dropout", "rslora", "train_also") if lora[k] != LORA_DEFAULTS[k]]
    if unsupported or lora["rank"] <= 0:
        sys.exit(f"{args.config}: only lora.rank > 0 without {', '.join(unsupported) or 'extras'} "
                 "is benchmarked")
    for p in model.parameters():
        p.requires_grad_(False)
    inject(model, lora)
    trained = [p for p in model.parameters() if p.requires_grad]
    if args.params_only:
        print(f"params={sum(p.numel() for p in model.parameters())} "
              f"trainable={sum(p.numel() for p in trained)}")
        return
    optimizer = adamw(trained, config["optimizer"], args.foreach)

    # Forge with data.val given trains on every record of data.train; random windows of context + 1
    # bytes, as bench_gpt.py.
    data = torch.frombuffer(read_records(config["data"]["train"]), dtype=torch.uint8).long()
    tc = config["train"]
    B, T, accum = tc["batch_size"], config["model"]["context"], tc["grad_accum"]
    model.train()
    train_and_report(args, config, trained, optimizer, window_step_loss(model, data, B, T, accum),
                     B * T * accum)


def main():
    args = argument_parser(__doc__, "finetune").parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    torch.manual_seed(config["seed"])
    # The frozen base: its weights would come from model.init_from.
    train_adapters(args, config, GPT(config["model"]), inject_lora)


if __name__ == "__main__":
    main()
