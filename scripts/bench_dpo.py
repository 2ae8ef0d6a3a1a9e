"""PyTorch half of `scripts/bench dpo`: the step of a Forge dpo config (recipes/dpo.cpp) with the
GPT of scripts/bench_gpt.py as policy and as reference (a frozen copy of it, so the loss starts at
log 2): B preference pairs read from data.train, tokenized as bytes, truncated and batched as
data/preference.h does (one [2B, L-1] next-token batch, chosen rows first, right padding, targets
-100 on prompt and padding), the reference's forward under torch.no_grad(), the policy's forward
and backward, each row's summed response log-probability, the sigmoid DPO loss averaged over the
pairs, clipping and AdamW, with the same batch, schedule and hyper-parameters. Prints the line of
bench_gpt.py in pairs ("params=N pairs_s=X pairs_s_total=Z peak_mb=Y ... first_loss=F"); with
--params-only "params=N trainable=M", N counting policy and reference and M the policy.
--write-pairs TEXT DIR writes the synthetic pairs the suite trains on (see write_pairs).
Run with /usr/bin/python3.
"""
import copy
import json
import os
import random
import sys

import torch
import torch.nn.functional as F
import yaml

import bench_gpt
from bench_gpt import GPT, adamw, argument_parser, train_and_report

# Forge's preference: and dpo: defaults (recipes/preference_config.cpp, recipes/dpo.cpp: TRL's);
# the resolved config scripts/bench_train.sh passes sets every key anyway. A length of 0 stands for
# model.context and max_length / 4, as in preference_truncation.
PREFERENCE_DEFAULTS = {"max_length": 0, "max_prompt_length": 0, "end_of_text": ""}
DPO_DEFAULTS = {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0,
                "precompute_reference": False}

# The synthetic pairs: every chosen row (prompt + response) is ROW_BYTES long and no rejected row
# is longer, so every batch is [2B, ROW_BYTES - 1] whichever pairs it draws: Forge's loader
# shuffles with its own generator, and the two sides still do the same work each step. The sizes
# are those of data/samples/preference (prompts of at most 32 bytes, responses of about 96), whose
# batches are mostly [2B, 127] too.
ROW_BYTES = 128
PROMPT_BYTES = (20, 32)
REJECTED_BYTES = (80, 96)
TRAIN_PAIRS, VAL_PAIRS = 1024, 32


def write_pairs(text_file, out_dir, seed=1337):
    """train.jsonl and val.jsonl in out_dir, {"prompt", "chosen", "rejected"} a line: a prompt of
    20-32 bytes of text_file, as chosen the bytes that follow it up to ROW_BYTES (96-108), as
    rejected 80-96 bytes from elsewhere in the file. Deterministic for a given file and seed."""
    with open(text_file, "rb") as f:
        text = f.read().decode("ascii")  # tinyshakespeare: one byte a character
    rng = random.Random(seed)

    def pair():
        p = rng.randint(*PROMPT_BYTES)
        at = rng.randrange(len(text) - ROW_BYTES)
        r = rng.randint(*REJECTED_BYTES)
        other = rng.randrange(len(text) - r)
        return {"prompt": text[at:at + p], "chosen": text[at + p:at + ROW_BYTES],
                "rejected": text[other:other + r]}

    os.makedirs(out_dir, exist_ok=True)
    for name, n in (("train.jsonl", TRAIN_PAIRS), ("val.jsonl", VAL_PAIRS)):
        with open(os.path.join(out_dir, name), "w") as f:
            for _ in range(n):
                f.write(json.dumps(pair()) + "\n")


def load_configs(path):
    """The config as bench_gpt.py reads it (the resolved one holds the architecture model.init_from
    fixes), its preference: section with both lengths resolved, and its dpo: section."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    config = bench_gpt.load_config(path)
    pref = dict(PREFERENCE_DEFAULTS, **(raw.get("preference") or {}))
    pref["max_length"] = pref["max_length"] or config["model"]["context"]
    pref["max_prompt_length"] = pref["max_prompt_length"] or pref["max_length"] // 4
    d = dict(DPO_DEFAULTS, **(raw.get("dpo") or {}))
    if d["loss_type"] != "sigmoid" or d["precompute_reference"] or \
            (raw.get("lora") or {}).get("rank", 0) > 0:
        sys.exit(f"bench_dpo.py: {path}: only the full fine-tune (lora.rank 0) with dpo.loss_type "
                 "sigmoid and the reference's forward every step (precompute_reference: false) "
                 "is benchmarked")
    return config, pref, d


def tokenize_pairs(path, pref):
    """Forge's tokenize_preferences with the bytes tokenizer: (chosen row, rejected row, prompt
    length) a record, the rows as lists of byte values, truncated by TRL's keep_end rule."""
    eot = list(pref["end_of_text"].encode("utf-8"))
    max_length, max_prompt = pref["max_length"], pref["max_prompt_length"]
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            prompt = list(record["prompt"].encode("utf-8"))
            chosen = list(record["chosen"].encode("utf-8")) + eot
            rejected = list(record["rejected"].encode("utf-8")) + eot
            longer = max(len(chosen), len(rejected))
            if len(prompt) + longer > max_length and len(prompt) > max_prompt:
                prompt = prompt[-max_prompt:]
            if len(prompt) + longer > max_length:
                chosen, rejected = (r[:max_length - max_prompt] for r in (chosen, rejected))
            pairs.append((prompt + chosen, prompt + rejected, len(prompt)))
    return pairs


def make_batch(pairs, rows):
    """PreferenceLoader::make_batch: ids and targets i64 [2B, L-1], row b the chosen row of pair
    rows[b], row B + b its rejected row; targets the next byte from the first response byte on,
    -100 on the prompt and the padding."""
    seqs = [pairs[r][0] for r in rows] + [pairs[r][1] for r in rows]
    return next_token_rows(seqs, [pairs[r][2] for r in rows] * 2)


def next_token_rows(seqs, prompt_len):
    """next_token_rows (data/batch.h) of token lists `seqs` whose first prompt_len[i] tokens are the
    prompt: ids and targets i64 [N, L-1], L the longest row, right padding; targets[i][j] =
    seqs[i][j + 1] where that is a response token, else -100."""
    width = max(len(s) for s in seqs) - 1
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, p) in enumerate(zip(seqs, prompt_len)):
        row = torch.tensor(s, dtype=torch.long)
        ids[i, :len(s) - 1] = row[:-1]
        first = max(p - 1, 0)  # targets[j] = row[j + 1] is scored when j + 1 >= prompt length
        targets[i, first:len(s) - 1] = row[first + 1:]
    return ids, targets


def token_logprobs(logits, targets):
    """nn::token_logprobs: logits [N*T, V] (GPT.logits) and targets [N, T] -> [N, T], the
    log-probability of each target, 0 where it is -100."""
    return -F.cross_entropy(logits, targets.reshape(-1), reduction="none").view(targets.shape)


def sequence_logprobs(model, ids, targets):
    """Each row's summed log-probability of its targets (nn::sequence_logprobs), [2B]."""
    return token_logprobs(model.logits(model.hidden(ids)), targets).sum(1)


def dpo_step_loss(policy, reference, pairs, d, B, accum, seed):
    """One step over `accum` batches of B pairs, drawn epoch by epoch in a seeded shuffle with a
    short last batch (EpochSampler's shape, not its order); returns the step's mean loss over its
    pairs. Every batch is [2B, L-1] with the fixture of write_pairs, whatever its pairs."""
    beta, eps = d["beta"], d["label_smoothing"]
    generator = torch.Generator().manual_seed(seed)
    order, cursor = [], 0

    def next_rows():
        nonlocal order, cursor
        if cursor >= len(order):
            order, cursor = torch.randperm(len(pairs), generator=generator).tolist(), 0
        rows = order[cursor:cursor + B]
        cursor += B
        return rows

    def step_loss(step):
        total = 0.0
        for _ in range(accum):
            ids, targets = make_batch(pairs, next_rows())
            n = ids.size(0) // 2
            with torch.no_grad():
                ref = sequence_logprobs(reference, ids, targets)
            pol = sequence_logprobs(policy, ids, targets)
            z = beta * ((pol[:n] - pol[n:]) - (ref[:n] - ref[n:]))
            losses = -F.logsigmoid(z)
            if eps > 0:
                losses = (1 - eps) * losses - eps * F.logsigmoid(-z)
            loss = losses.sum() / (n * accum)
            loss.backward()
            total = total + loss.detach()
        return total

    return step_loss


def main():
    if sys.argv[1:2] == ["--write-pairs"]:  # the suite's data, written before any config runs
        if len(sys.argv) != 4:
            sys.exit("usage: bench_dpo.py --write-pairs TEXT DIR")
        write_pairs(sys.argv[2], sys.argv[3])
        return
    args = argument_parser(__doc__, "dpo").parse_args()
    torch.set_num_threads(args.threads)
    config, pref, d = load_configs(args.config)
    m, tc = config["model"], config["train"]
    torch.manual_seed(config["seed"])
    policy = GPT(m)  # its weights would come from model.init_from: they do not matter for speed
    reference = copy.deepcopy(policy)
    reference.requires_grad_(False)
    reference.eval()
    params = list(policy.parameters())  # tied weights counted once
    if args.params_only:
        trainable = sum(p.numel() for p in params)
        print(f"params={trainable + sum(p.numel() for p in reference.parameters())} "
              f"trainable={trainable}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)

    pairs = tokenize_pairs(config["data"]["train"], pref)
    B, accum = tc["batch_size"], tc["grad_accum"]
    longest = max(len(row) for pair in pairs for row in pair[:2])
    if longest - 1 > m["context"]:
        sys.exit(f"bench_dpo.py: a row of {longest} tokens does not fit the context {m['context']}")
    policy.train()
    train_and_report(args, config, params, optimizer,
                     dpo_step_loss(policy, reference, pairs, d, B, accum, config["seed"]),
                     B * accum, unit="pairs")


if __name__ == "__main__":
    main()
