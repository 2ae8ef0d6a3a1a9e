"""PyTorch reference for the fortunes fine-tunes of docs/recipes/finetune.md: the same fine-tuning
as a Forge `finetune` config on record files (full, or LoRA with rank, alpha, rsLoRA, LoRA+'s
lr_ratio and train_also), from the same Forge checkpoint, with the same model (scripts/
bench_gpt.py's GPT), batch, context, steps, AdamW, schedule and clipping, so that the gap between
LoRA and full fine-tuning can be set beside one measured outside Forge.

What differs from Forge: the held-out records (10% of each file's, drawn here by Python's random
with the config's split_seed, not by Forge's Philox) and the random windows of each batch. The
val loss covers every held-out token once, as Forge's final evaluation does.

  /usr/bin/python3 scripts/finetune_reference.py configs/gpt_fortunes_lora.yaml \\
      'lora.train_also=[tok_emb.weight, pos_emb.weight]' optimizer.lr=1e-3 schedule.min_lr=1e-4 \\
      lora.lr_ratio=16

Overrides are Forge's `key.path=value` (the value read as YAML). Prints the base model's val loss
on this split, then val_loss every train.eval_every steps. Run with Debian's /usr/bin/python3.
"""
import argparse
import fnmatch
import io
import math
import os
import random

import h5py
import torch
import torch.nn.functional as F
import yaml

from bench_gpt import DEFAULTS, GPT, learning_rate
from bench_lora import BLOCK_LINEARS, LoRALinear

# The Forge names of bench_gpt.Block's attributes (Forge's nn/gpt.cpp registers these).
BLOCK_NAMES = dict({"ln1": "ln_1", "ln2": "ln_2"}, **BLOCK_LINEARS)
LORA = {"rank": 0, "alpha": 16.0, "dropout": 0.0, "rslora": False, "lr_ratio": 1.0,
        "targets": ["*.attn.qkv", "*.attn.proj", "*.mlp.*"], "train_also": []}


def set_path(config, path, value):
    *parents, last = path.split(".")
    for key in parents:
        config = config.setdefault(key, {})
    config[last] = value


def read_config(path, overrides):
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    for item in overrides:
        key, _, text = item.partition("=")
        value = yaml.safe_load(text)
        try:  # YAML 1.1 (PyYAML) reads 2e-3 as a string; yaml-cpp, as Forge, as a number
            value = float(value) if isinstance(value, str) else value
        except ValueError:
            pass
        set_path(raw, key, value)
    return raw


def latest_checkpoint(run):
    files = sorted(f for f in os.listdir(os.path.join(run, "checkpoints")) if f.endswith(".h5"))
    if not files:
        raise SystemExit(f"{run}: no checkpoint")
    return os.path.join(run, "checkpoints", files[-1])


def torch_name(forge_name):
    """blocks.0.attn.qkv.weight -> blocks.0.c_attn.weight; other names are the same."""
    parts = forge_name.split(".")
    if parts[0] != "blocks":
        return forge_name
    layer, attr = ".".join(parts[2:-1]), parts[-1]
    return f"blocks.{parts[1]}.{BLOCK_NAMES[layer]}.{attr}"


def forge_name(name):
    """The inverse of torch_name, also for a weight inside a LoRALinear (blocks.0.c_attn.base.*)."""
    parts = name.replace(".base.", ".").split(".")
    if parts[0] != "blocks":
        return name
    layer = {v: k for k, v in BLOCK_NAMES.items()}[parts[2]]
    return f"blocks.{parts[1]}.{layer}.{parts[-1]}"


def load_base(run, dropout):
    """bench_gpt.GPT with the architecture of the run's config.yaml, the fine-tune's dropout and
    the run's latest weights."""
    with open(os.path.join(run, "config.yaml")) as f:
        stored = yaml.safe_load(f)
    m = dict(DEFAULTS["model"], **dict(stored["model"], dropout=dropout))
    model = GPT(m)
    state = model.state_dict()
    with h5py.File(latest_checkpoint(run), "r") as f:
        loaded = {torch_name(name): torch.from_numpy(ds[()]) for name, ds in f["model"].items()}
    missing = set(state) - set(loaded) - {f"blocks.{i}.mask" for i in range(m["n_layers"])}
    if missing:
        raise SystemExit(f"{run}: the checkpoint lacks {sorted(missing)}")
    model.load_state_dict(loaded, strict=False)
    return model, m


def read_records(directory):
    """{file stem: [record, ...]} over the directory's *.txt files: records end at a line holding
    only '%' and keep their final newline, blank ones dropped (Forge's data/records.cpp and
    data/prepare.cpp split_records)."""
    out = {}
    for name in sorted(f for f in os.listdir(directory) if f.endswith(".txt")):
        with open(os.path.join(directory, name), "rb") as f:
            text = f.read().decode("utf-8", errors="surrogateescape")
        records, lines = [], []
        for line in io.StringIO(text, newline="\n"):  # lines end at '\n' only, as Forge's
            if line.removesuffix("\n") in ("%", "%\r"):
                records.append("".join(lines))
                lines = []
            else:
                lines.append(line)
        records.append("".join(lines))
        out[os.path.splitext(name)[0]] = [r for r in records if r.strip()]
    return out


def split_stream(records, val_fraction, seed, end_of_text):
    """Train and val byte streams: round(val_fraction * n) of each file's records held out."""
    train, val = bytearray(), bytearray()
    for stem, recs in records.items():
        held = set(random.Random(f"{seed}:{stem}").sample(range(len(recs)),
                                                          round(len(recs) * val_fraction)))
        for i, r in enumerate(recs):
            (val if i in held else train).extend((r + end_of_text).encode("utf-8",
                                                                          "surrogateescape"))
    as_tensor = lambda b: torch.frombuffer(b, dtype=torch.uint8).long()
    return as_tensor(train), as_tensor(val)


def add_lora(model, lora):
    """Every weight frozen, adapters on the targeted Linear layers (bench_lora.LoRALinear), and
    train_also's parameters trainable again. Returns the (A, B, other) trained parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    scale = lora["alpha"] / (math.sqrt(lora["rank"]) if lora["rslora"] else lora["rank"])
    a, b = [], []
    for i, block in enumerate(model.blocks):
        for layer_name, attr in BLOCK_LINEARS.items():
            if any(fnmatch.fnmatchcase(f"blocks.{i}.{layer_name}", t) for t in lora["targets"]):
                layer = LoRALinear(getattr(block, attr), lora["rank"], lora["alpha"])
                layer.scale = scale
                setattr(block, attr, layer)
                a.append(layer.lora_A)
                b.append(layer.lora_B)
    also = []
    for name, p in model.named_parameters():
        if not p.requires_grad and any(fnmatch.fnmatchcase(forge_name(name), t)
                                       for t in lora["train_also"]):
            p.requires_grad_(True)
            also.append(p)
    return a, b, also


@torch.no_grad()
def val_loss(model, val, T, batch=64):
    """Mean loss over non-overlapping windows predicting every token after the first once (the
    last window shifted back to end at the stream's end, its already scored targets ignored)."""
    starts = list(range(0, len(val) - 1 - T + 1, T))
    scored = starts[-1] + T + 1 if starts else 1
    tail = len(val) - T - 1
    total, count = 0.0, 0
    windows = [(s, 0) for s in starts]
    if scored < len(val):
        windows.append((tail, scored - 1 - tail))
    model.eval()
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch]
        x = torch.stack([val[s:s + T] for s, _ in chunk])
        y = torch.stack([val[s + 1:s + T + 1] for s, _ in chunk])
        for row, (_, skip) in enumerate(chunk):
            y[row, :skip] = -100
        losses = F.cross_entropy(model.logits(model.hidden(x)), y.view(-1), reduction="sum",
                                 ignore_index=-100)
        total += losses.item()
        count += int((y != -100).sum())
    model.train()
    return total / count


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a Forge finetune config on a directory of record files")
    parser.add_argument("overrides", nargs="*", help="key.path=value, as forge train takes them")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    raw = read_config(args.config, args.overrides)
    o = dict(DEFAULTS["optimizer"], **raw.get("optimizer", {}))
    s = dict(DEFAULTS["schedule"], **raw.get("schedule", {}))
    tc = dict(DEFAULTS["train"], **raw.get("train", {}))
    lora = dict(LORA, **(raw.get("lora") or {}))
    data = raw["data"]
    seed = raw.get("seed", 1337)
    torch.manual_seed(seed)

    if lora["dropout"] != 0:
        raise SystemExit("finetune_reference.py: lora.dropout is not implemented here")
    model, m = load_base(raw["model"]["init_from"], raw["model"].get("dropout", 0.0))
    records = read_records(data["train"])
    train, val = split_stream(records, data.get("val_fraction", 0.1),
                              data.get("split_seed", seed),
                              raw.get("finetune", {}).get("end_of_text", "<|endoftext|>"))
    T, B = m["context"], tc["batch_size"]
    print(f"train {len(train)} bytes, val {len(val)} bytes; base val_loss "
          f"{val_loss(model, val, T):.4f}", flush=True)

    if lora["rank"] > 0:
        a, b, also = add_lora(model, lora)
        groups = [{"params": a + also, "lr_mult": 1.0}, {"params": b, "lr_mult": lora["lr_ratio"]}]
    else:
        groups = [{"params": list(model.parameters()), "lr_mult": 1.0}]
    trained = [p for g in groups for p in g["params"]]
    print(f"trainable {sum(p.numel() for p in trained)}", flush=True)
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in g["params"] if p.dim() >= 2 or o["decay_1d"]],
          "weight_decay": o["weight_decay"], "lr_mult": g["lr_mult"]} for g in groups] +
        [{"params": [p for p in g["params"] if not (p.dim() >= 2 or o["decay_1d"])],
          "weight_decay": 0.0, "lr_mult": g["lr_mult"]} for g in groups],
        lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
    offsets = torch.arange(T + 1)
    for step in range(tc["max_steps"]):
        windows = train[torch.randint(len(train) - T, (B, 1)) + offsets]
        loss = model(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, tc["clip_grad_norm"])
        rate = learning_rate(s, o, tc["max_steps"], step)
        for group in optimizer.param_groups:
            group["lr"] = rate * group["lr_mult"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % tc.get("eval_every", 250) == 0 or step + 1 == tc["max_steps"]:
            print(f"step {step + 1} train_loss {loss.item():.4f} val_loss "
                  f"{val_loss(model, val, T):.4f}", flush=True)


if __name__ == "__main__":
    main()
