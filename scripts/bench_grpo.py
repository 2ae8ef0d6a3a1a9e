"""PyTorch half of `scripts/bench grpo`: one step of a Forge grpo config (recipes/grpo.cpp: TRL's
GRPOTrainer) with the GPT of scripts/bench_gpt.py as policy and, when grpo.beta > 0, as a frozen
reference. One step:
  1. rollout: grpo.prompts_per_step prompts of data.train ({"prompt", "answer"} a line, bytes as
     ids), each continued grpo.num_generations times through scripts/bench_generate.py's KV-cached
     loop (each prompt prefilled once, its cache copied to its samples, grpo.generation_batch_size
     rows a batch), a row ending at grpo.stop_text or after grpo.max_new_tokens, the batch once all
     its rows have ended;
  2. rewards: the answer verifier, group 1 of the last match of grpo.answer_pattern in the decoded
     completion, white space trimmed, equal to the record's grpo.answer_field (1, else 0);
  3. advantages: (r - mean) / (std + 1e-4) over each prompt's group (unbiased std; without it when
     grpo.scale_rewards is false), or with grpo.advantage rejection 1 for r >= rejection_threshold;
  4. without gradient, train.batch_size rows at a time, the rollout's log-probabilities when
     grpo.num_iterations > 1 and the reference's when grpo.beta > 0;
  5. grpo.num_iterations passes over the rollout in shuffled minibatches of train.grad_accum
     micro-batches of train.batch_size rows, one AdamW update each: the clipped surrogate
     -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A) + beta k3 per response token,
     normalised as grpo.loss_type says over the minibatch (nn::grpo_loss), and the policy's
     entropy at the response tokens (the recipe logs it).
Prints the line of bench_gpt.py in completions ("params=N rows_s=X rows_s_total=Z peak_mb=Y ...");
with --params-only "params=N trainable=M". The grpo: keys come from the config over GRPO_DEFAULTS.
  bench_grpo.py configs/grpo_arith.yaml
Run with /usr/bin/python3.
"""
import copy
import json
import re
import sys

import torch
import yaml

import bench_gpt
from bench_dpo import next_token_rows, token_logprobs
from bench_generate import forward_cached
from bench_gpt import GPT, adamw, argument_parser, clip_and_update, time_and_report
from bench_ppo import seeded_epochs

# The grpo: keys of one step with recipes/grpo.cpp's defaults; the resolved config
# scripts/bench_train.sh passes sets every one anyway.
GRPO_DEFAULTS = {"num_generations": 8, "prompts_per_step": 8, "num_iterations": 1,
                 "generation_batch_size": 64, "max_new_tokens": 256, "temperature": 1.0,
                 "top_k": 0, "stop_text": "", "advantage": "group", "scale_rewards": True,
                 "rejection_threshold": 1.0, "loss_type": "dapo", "epsilon": 0.2,
                 "epsilon_high": 0.0, "beta": 0.0, "answer_field": "answer",
                 "answer_pattern": r"(-?[0-9]+(?:\.[0-9]+)?)"}
# Keys that change the step's work, and the only values benchmarked.
GRPO_FIXED = {"rewards": ["answer"], "top_p": 1.0}


def read_records(path):
    """The {"prompt": ...} records of a JSONL prompt file, each with its prompt as byte values."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [(list(r["prompt"].encode("utf-8")), r) for r in records]


def sample_group_rows(model, prompts, K, h, stop):
    """G = K samples of each prompt of `prompts` (lists of ids) as generate_batch draws them:
    each distinct prompt prefilled once (left-padded), its cache copied to its K rows, one token a
    step until every row has generated `stop` (a list of ids) or max_new_tokens; returns each row's
    tokens up to its end, ordered by (prompt, sample)."""
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    for u, p in enumerate(prompts):
        ids[u, L - len(p):] = torch.tensor(p)
    start = torch.tensor([L - len(p) for p in prompts])
    C, H = model.tok_emb.weight.shape[1], model.blocks[0].n_heads
    capacity = L + h["max_new_tokens"] - 1
    caches = [(torch.zeros(len(prompts), H, capacity, C // H),
               torch.zeros(len(prompts), H, capacity, C // H)) for _ in model.blocks]
    logits = forward_cached(model, ids, caches, 0, start)
    index = torch.arange(len(prompts)).repeat_interleave(K)
    caches = [(k.index_select(0, index), v.index_select(0, index)) for k, v in caches]
    logits, start = logits.index_select(0, index), start.index_select(0, index)
    rows = [[] for _ in range(len(index))]
    done = [False] * len(index)
    logprob = torch.zeros(len(index), dtype=torch.float64)  # kept as Forge keeps it: equal work
    for i in range(h["max_new_tokens"]):
        scaled = logits / h["temperature"]
        if h["top_k"]:
            top, top_ids = torch.topk(scaled, min(h["top_k"], scaled.shape[1]), dim=1)
            token = top_ids.gather(1, torch.multinomial(top.softmax(1), 1))
        else:
            token = torch.multinomial(scaled.softmax(1), 1)
        logprob += logits.log_softmax(1).gather(1, token)[:, 0].double()
        for r, t in enumerate(token[:, 0].tolist()):
            if not done[r]:
                rows[r].append(t)
                done[r] = bool(stop) and rows[r][-len(stop):] == stop
        if all(done) or i + 1 == h["max_new_tokens"]:
            break
        logits = forward_cached(model, token, caches, L + i, start)
    return rows


def rollout(policy, chosen, h, stop):
    """prompt + completion of every (prompt, sample) row, in that order, in batches of
    generation_batch_size rows (whole groups of a prompt where they fit)."""
    G = h["num_generations"]
    per_batch = max(1, h["generation_batch_size"] // G)
    rows = []
    for first in range(0, len(chosen), per_batch):
        prompts = [p for p, _ in chosen[first:first + per_batch]]
        completions = sample_group_rows(policy, prompts, G, h, stop)
        rows += [prompts[i // G] + c for i, c in enumerate(completions)]
    return rows


def rewards_of(rows, chosen, h, pattern):
    """The answer verifier's reward of each row: 1 when group 1 of the last match of the pattern in
    the completion, trimmed, is the record's answer field."""
    G = h["num_generations"]
    out = []
    for i, row in enumerate(rows):
        prompt, record = chosen[i // G]
        text = bytes(row[len(prompt):]).decode("utf-8", errors="replace")
        matches = pattern.findall(text)
        last = matches[-1] if matches else None
        if isinstance(last, tuple):
            last = last[0]
        out.append(1.0 if last is not None and last.strip() == str(record[h["answer_field"]])
                   else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def advantages_of(rewards, h):
    """nn::group_advantages or nn::rejection_advantages."""
    if h["advantage"] == "rejection":
        return (rewards >= h["rejection_threshold"]).double()
    groups = rewards.view(-1, h["num_generations"])
    a = groups - groups.mean(1, keepdim=True)
    if h["scale_rewards"]:
        a = a / (groups.std(1, keepdim=True) + 1e-4)
    return a.reshape(-1)


def tempered_logprobs(model, ids, targets, temperature):
    """policy_forward: the logits at the sampling temperature and the targets' log-probabilities."""
    logits = model.logits(model.hidden(ids))
    if temperature != 1.0:
        logits = logits / temperature
    return logits, token_logprobs(logits, targets)


def grpo_loss(logp, old, ref, adv, mask, h):
    """nn::grpo_loss: the summed per-token loss of one micro-batch (divided by its length for each
    completion with loss_type grpo, by max_new_tokens with dr_grpo)."""
    m = mask.float()
    ratio = torch.exp((logp - old) * m)
    a = adv[:, None].float()
    low, high = 1 - h["epsilon"], 1 + (h["epsilon_high"] or h["epsilon"])
    per_token = -torch.min(ratio * a, ratio.clamp(low, high) * a)
    if h["beta"] > 0:
        d = (ref - logp) * m
        per_token = per_token + h["beta"] * (torch.exp(d) - d - 1)
    per_token = per_token * m
    if h["loss_type"] == "grpo":
        return (per_token.sum(1) / m.sum(1).clamp(min=1)).sum()
    if h["loss_type"] == "dr_grpo":
        return per_token.sum() / h["max_new_tokens"]
    return per_token.sum()


def grpo_step(models, records, optimizer, params, config, h):
    """The function time_and_report times: one GRPO step, returning its mean update loss."""
    policy, reference = models
    B, accum = config["train"]["batch_size"], config["train"]["grad_accum"]
    P, G = h["prompts_per_step"], h["num_generations"]
    generator = torch.Generator().manual_seed(config["seed"])
    pattern = re.compile(h["answer_pattern"])
    stop = list(h["stop_text"].encode("utf-8"))
    next_prompts = seeded_epochs(records, P, generator)

    def step(i):
        with torch.no_grad():
            policy.eval()
            chosen = next_prompts()
            rows = rollout(policy, chosen, h, stop)
            prompt_len = [len(chosen[r // G][0]) for r in range(len(rows))]
            adv = advantages_of(rewards_of(rows, chosen, h, pattern), h)
            ids, targets = next_token_rows(rows, prompt_len)
            lengths = torch.tensor([len(r) for r in rows])
            old = torch.zeros(ids.shape)
            ref = torch.zeros(ids.shape)
            for first in range(0, len(rows), B):
                r = torch.arange(first, min(first + B, len(rows)))
                w = int(lengths[r].max()) - 1
                if h["num_iterations"] > 1:
                    old[r, :w] = tempered_logprobs(policy, ids[r, :w], targets[r, :w],
                                                   h["temperature"])[1]
                if h["beta"] > 0:
                    ref[r, :w] = tempered_logprobs(reference, ids[r, :w], targets[r, :w],
                                                   h["temperature"])[1]
            policy.train()
        loss_sum, units_sum = 0.0, 0
        for _ in range(h["num_iterations"]):
            shuffled = torch.randperm(len(rows), generator=generator)
            for first in range(0, len(rows), B * accum):
                micro_rows = [shuffled[m:m + B] for m in range(first, first + B * accum, B)]
                # What the update's summed loss is divided by: its response tokens (dapo), else
                # its completions.
                units = (sum(int((targets[r] != -100).sum()) for r in micro_rows)
                         if h["loss_type"] == "dapo" else B * accum)
                for r in micro_rows:
                    w = int(lengths[r].max()) - 1
                    mask = targets[r, :w] != -100
                    logits, logp = tempered_logprobs(policy, ids[r, :w], targets[r, :w],
                                                     h["temperature"])
                    o = old[r, :w] if h["num_iterations"] > 1 else logp.detach()
                    loss = grpo_loss(logp, o, ref[r, :w], adv[r], mask, h)
                    (loss / units).backward()
                    loss_sum += loss.item()
                    with torch.no_grad():  # nn::entropy_from_logits, logged by the recipe
                        log_p = logits.log_softmax(-1)
                        (-(log_p.exp() * log_p).sum(-1).view(mask.shape) * mask).sum().item()
                units_sum += units
                clip_and_update(params, optimizer, config, i)
        return loss_sum / max(units_sum, 1)

    return step


def load_configs(args):
    """The config as bench_gpt.py reads it and its grpo: section over GRPO_DEFAULTS."""
    with open(args.config) as f:
        raw = yaml.safe_load(f) or {}
    config = bench_gpt.load_config(args.config)
    section = raw.get("grpo") or {}
    h = dict(GRPO_DEFAULTS, **{k: v for k, v in section.items() if k in GRPO_DEFAULTS})
    other = {k: section[k] for k in GRPO_FIXED if k in section and section[k] != GRPO_FIXED[k]}
    if other or (raw.get("lora") or {}).get("rank", 0) > 0:
        sys.exit(f"bench_grpo.py: {args.config}: only the full fine-tune (lora.rank 0) with "
                 f"{GRPO_FIXED} is benchmarked; got {other or 'a lora: section'}")
    tc = config["train"]
    if (h["prompts_per_step"] * h["num_generations"]) % (tc["batch_size"] * tc["grad_accum"]):
        sys.exit("bench_grpo.py: grpo.prompts_per_step x num_generations is not a multiple of "
                 "train.batch_size x train.grad_accum")
    return config, h


def main():
    parser = argument_parser(__doc__, "grpo")
    parser.add_argument("--prompts", help="prompt records, {\"prompt\", ...} a line; "
                                          "default data.train")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, h = load_configs(args)
    m = config["model"]
    torch.manual_seed(config["seed"])
    # Weights that would come from the base: they do not matter for speed.
    policy = GPT(m)
    reference = copy.deepcopy(policy).requires_grad_(False) if h["beta"] > 0 else None
    params = list(policy.parameters())
    if args.params_only:
        frozen = sum(p.numel() for p in reference.parameters()) if reference else 0
        trainable = sum(p.numel() for p in params)
        print(f"params={trainable + frozen} trainable={trainable}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)
    records = read_records(args.prompts or config["data"]["train"])
    longest = max(len(p) for p, _ in records) + h["max_new_tokens"]
    if longest > m["context"]:
        sys.exit(f"bench_grpo.py: a row of {longest} tokens does not fit the context {m['context']}")
    step = grpo_step((policy, reference), records, optimizer, params, config, h)
    time_and_report(args, params, step, h["prompts_per_step"] * h["num_generations"], unit="rows")


if __name__ == "__main__":
    main()
