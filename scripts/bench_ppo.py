"""PyTorch half of `scripts/bench ppo`: one step of a Forge ppo config (recipes/ppo.cpp: TRL's PPO
for language models) with the GPT of scripts/bench_gpt.py as policy and as reference (a frozen
copy), and its backbone with a Linear(C, 1, bias=False) head as reward model (frozen, read at each
row's last real token) and as value model (trained, read at every position; a copy of the reward
model with a zero head, as the recipe's build_critic makes it). One step:
  1. rollout: ppo.rollout_batch prompts of data.train ({"prompt": ...} a line, bytes as ids), each
     continued by ppo.max_new_tokens tokens through scripts/bench_generate.py's KV-cached loop
     (rows ordered by prompt length, left-padded, ppo.generation_batch_size rows a forward);
  2. scoring without gradient, train.batch_size rows at a time, each row prompt + completion
     (right padding): the policy's and the reference's log-probability of each response token, the
     policy's entropy there, the value model's values at the positions that predict them, the
     reward model's score of each row;
  3. per-token rewards -kl_coef (logp - ref_logp) plus the score at a row's last token, GAE
     backwards (gamma, lam), advantages whitened over all response tokens (nn/ppo.h);
  4. ppo.ppo_epochs passes over the rollout in shuffled minibatches of train.grad_accum
     micro-batches of train.batch_size rows, each minibatch an update: the clipped policy loss plus
     vf_coef times the clipped value loss (means over the minibatch's response tokens), backward,
     global norm clipping over policy and value, AdamW.
Prints the line of bench_gpt.py in rollout rows ("params=N rows_s=X rows_s_total=Z peak_mb=Y
..."); with --params-only "params=N trainable=M", N counting the four models and M the policy and
the value model. The ppo: keys come from the config, over PPO_DEFAULTS, and each has a flag that
overrides it (--rollout-batch 64 ...), so a GPT config alone runs it:
  bench_ppo.py configs/gpt_shakespeare_policy.yaml --prompts data/samples/preference/prompts_train.jsonl
Run with /usr/bin/python3.
"""
import copy
import json
import sys

import torch
import torch.nn as nn
import yaml

import bench_gpt
from bench_dpo import next_token_rows, token_logprobs
from bench_generate import sample_rows
from bench_gpt import GPT, adamw, argument_parser, clip_and_update, time_and_report

# The ppo: keys of one step, with recipes/ppo.cpp's defaults; the resolved config
# scripts/bench_train.sh passes sets every one anyway.
PPO_DEFAULTS = {"rollout_batch": 64, "generation_batch_size": 64, "max_new_tokens": 96,
                "temperature": 1.0, "top_k": 0, "ppo_epochs": 4, "kl_coef": 0.05, "gamma": 1.0,
                "lam": 0.95, "clip_range": 0.2, "clip_range_value": 0.2, "vf_coef": 0.1}
# Keys that change the step's work, and the only values benchmarked.
PPO_FIXED = {"value": "separate", "top_p": 1.0, "stop_text": "", "entropy_coef": 0.0,
             "whiten_rewards": False, "adaptive_kl": False}


class ScalarModel(nn.Module):
    """A GPT backbone (no LM head) and a scalar head, Linear(C, 1, bias=False): nn::GPTRewardModel.
    values() reads it at every position (the value model), rewards() at each row's last real token
    (the reward model)."""

    def __init__(self, m):
        super().__init__()
        self.backbone = GPT(m)
        self.backbone.lm_head = None  # tied or not, a backbone has no head of its own
        self.score = nn.Linear(m["d_model"], 1, bias=False)

    def values(self, ids):
        """ids [B, T] -> [B, T]."""
        return self.score(self.backbone.hidden(ids)).squeeze(-1)

    def rewards(self, ids, lengths):
        """ids [B, L] right-padded, lengths [B] -> [B], the head at position lengths - 1."""
        hidden = self.backbone.hidden(ids)
        return self.score(hidden[torch.arange(ids.size(0)), lengths - 1]).squeeze(-1)


def read_prompts(path):
    """The prompts of a {"prompt": ...} JSONL file as lists of byte values."""
    with open(path, encoding="utf-8") as f:
        return [list(json.loads(line)["prompt"].encode("utf-8")) for line in f if line.strip()]


def sample(policy, prompts, h):
    """generate_batch with one sample a prompt: rows ordered by prompt length, batches of
    generation_batch_size; returns prompt + completion a prompt, in the prompts' order."""
    order = sorted(range(len(prompts)), key=lambda r: -len(prompts[r]))
    rows = [None] * len(prompts)
    for first in range(0, len(order), h["generation_batch_size"]):
        batch = order[first:first + h["generation_batch_size"]]
        tokens = sample_rows(policy, prompts, batch, 1, h["max_new_tokens"], h["temperature"],
                             h["top_k"])
        for i, r in enumerate(batch):
            rows[r] = prompts[r] + tokens[i].tolist()
    return rows


class Rollout:
    """A rollout's rows in next_token_rows' layout ([P, W]: ids, targets, the response mask) and the
    per-token quantities of PPO at the same places; slices of B rows are trimmed to their longest
    row, as the recipe lays out each batch it forwards."""

    def __init__(self, rows, prompt_len):
        self.rows = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            self.rows[i, :len(r)] = torch.tensor(r)
        self.ids, self.targets = next_token_rows(rows, prompt_len)
        self.mask = self.targets != -100
        self.lengths = torch.tensor([len(r) for r in rows])

    def batch(self, r):
        """ids, targets and mask of rows r (a tensor of indices), [n, w]."""
        w = int(self.lengths[r].max()) - 1
        return self.ids[r, :w], self.targets[r, :w], self.mask[r, :w]


def policy_logprobs(model, ids, targets, temperature):
    """policy_forward: the logits at the sampling temperature (the distribution the tokens were
    drawn from) and the log-probabilities of the targets under them, [n, w]."""
    logits = model.logits(model.hidden(ids))
    if temperature != 1.0:
        logits = logits / temperature
    return logits, token_logprobs(logits, targets)


def score(models, ro, B, temperature):
    """collect_rollout's scoring, without gradient, B rows at a time: the policy's and the
    reference's log-probabilities of the response tokens, the values at the positions that predict
    them (logp, ref_logp, values [P, W]), the reward model's score of each whole row (scores [P],
    as score_texts batches them) and the policy's mean entropy over the response tokens (the recipe
    logs it)."""
    policy, reference, reward_model, value_model = models
    logp, ref_logp, values = (torch.zeros(ro.ids.shape) for _ in range(3))
    scores = torch.zeros(len(ro.lengths))
    entropy_sum = 0.0
    for first in range(0, len(ro.lengths), B):
        r = torch.arange(first, min(first + B, len(ro.lengths)))
        ids, targets, mask = ro.batch(r)
        w = ids.size(1)
        logits, logp[r, :w] = policy_logprobs(policy, ids, targets, temperature)
        log_p = logits.log_softmax(-1)  # nn::entropy_from_logits, times the tokens
        entropy_sum += (-(log_p.exp() * log_p).sum(-1).view(mask.shape) * mask).sum().item()
        ref_logp[r, :w] = policy_logprobs(reference, ids, targets, temperature)[1]
        values[r, :w] = value_model.values(ids)
    for first in range(0, len(ro.lengths), B):
        r = torch.arange(first, min(first + B, len(ro.lengths)))
        scores[r] = reward_model.rewards(ro.rows[r, :int(ro.lengths[r].max())], ro.lengths[r])
    return logp, ref_logp, values, scores, entropy_sum / ro.mask.sum().item()


def advantages_and_returns(logp, ref_logp, values, scores, ro, h):
    """nn::per_token_rewards, nn::gae and nn::whiten of the advantages over [P, W] tensors (0 off
    the response tokens)."""
    m = ro.mask.float()
    rewards = -h["kl_coef"] * (logp - ref_logp) * m
    rewards[torch.arange(len(scores)), ro.lengths - 2] += scores  # the row's last response token
    values = values * m
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(len(scores))
    next_adv = torch.zeros(len(scores))
    for t in reversed(range(rewards.size(1))):
        delta = rewards[:, t] + h["gamma"] * next_value - values[:, t]
        adv = (delta + h["gamma"] * h["lam"] * next_adv) * m[:, t]
        advantages[:, t] = adv
        next_value = torch.where(ro.mask[:, t], values[:, t], next_value)
        next_adv = torch.where(ro.mask[:, t], adv, next_adv)
    returns = advantages + values
    n = m.sum()
    mean = advantages.sum() / n
    var = ((advantages - mean) * m).pow(2).sum() / (n - 1)
    return (advantages - mean) * torch.rsqrt(var + 1e-8) * m, returns


def ppo_loss(logp, values, old, mask, h):
    """nn::ppo_policy_loss + vf_coef nn::ppo_value_loss of one micro-batch, summed (not averaged)
    over its response tokens; `old` holds the rollout's logp, values, advantages and returns at the
    same places."""
    m = mask.float()
    ratio = torch.exp((logp - old["logp"]) * m)
    c = h["clip_range"]
    pg = torch.max(-old["adv"] * ratio, -old["adv"] * ratio.clamp(1 - c, 1 + c))
    c = h["clip_range_value"]
    clipped = torch.max(torch.min(values, old["values"] + c), old["values"] - c)
    vf = 0.5 * torch.max((values - old["returns"]).pow(2), (clipped - old["returns"]).pow(2))
    return (pg * m).sum() + h["vf_coef"] * (vf * m).sum()


def seeded_epochs(items, count, generator):
    """step_prompts' shape: a function giving the next `count` items of an endless sequence of
    epochs over `items`, each a shuffle drawn from `generator`."""
    order, cursor = [], 0

    def take():
        nonlocal order, cursor
        chosen = []
        while len(chosen) < count:
            if cursor == len(order):
                order, cursor = torch.randperm(len(items), generator=generator).tolist(), 0
            chosen.append(items[order[cursor]])
            cursor += 1
        return chosen

    return take


def ppo_step(models, prompts, optimizer, params, config, h):
    """The function time_and_report times: one PPO step (rollout, scoring, ppo_epochs passes of
    minibatch updates, each grad_accum micro-batches of batch_size rows), returning the mean loss
    per response token of its updates."""
    policy, _, _, value_model = models
    B, accum = config["train"]["batch_size"], config["train"]["grad_accum"]
    P = h["rollout_batch"]
    generator = torch.Generator().manual_seed(config["seed"])
    next_prompts = seeded_epochs(prompts, P, generator)

    def step(i):
        with torch.no_grad():
            chosen = next_prompts()
            ro = Rollout(sample(policy, chosen, h), [len(p) for p in chosen])
            logp, ref_logp, values, scores, _ = score(models, ro, B, h["temperature"])
            adv, returns = advantages_and_returns(logp, ref_logp, values, scores, ro, h)
        rollout = {"logp": logp, "values": values, "adv": adv, "returns": returns}
        loss_sum, tokens = 0.0, 0
        for _ in range(h["ppo_epochs"]):
            shuffled = torch.randperm(P, generator=generator)
            for first in range(0, P, B * accum):
                n = int(ro.mask[shuffled[first:first + B * accum]].sum())  # the update's tokens
                for micro in range(first, first + B * accum, B):
                    r = shuffled[micro:micro + B]
                    ids, targets, mask = ro.batch(r)
                    old = {k: v[r, :ids.size(1)] for k, v in rollout.items()}
                    logp_new = policy_logprobs(policy, ids, targets, h["temperature"])[1]
                    loss = ppo_loss(logp_new, value_model.values(ids), old, mask, h)
                    (loss / n).backward()
                    loss_sum += loss.item()
                clip_and_update(params, optimizer, config, i)
                tokens += n
        return loss_sum / tokens

    return step


def load_configs(args):
    """The config as bench_gpt.py reads it and its ppo: section over PPO_DEFAULTS, with the flags
    given on the command line over both."""
    with open(args.config) as f:
        raw = yaml.safe_load(f) or {}
    config = bench_gpt.load_config(args.config)
    section = raw.get("ppo") or {}
    h = dict(PPO_DEFAULTS, **{k: v for k, v in section.items() if k in PPO_DEFAULTS})
    h.update({k: getattr(args, k) for k in PPO_DEFAULTS if getattr(args, k) is not None})
    other = {k: section[k] for k in PPO_FIXED if k in section and section[k] != PPO_FIXED[k]}
    if other or (raw.get("lora") or {}).get("rank", 0) > 0:
        sys.exit(f"bench_ppo.py: {args.config}: only the full fine-tune (lora.rank 0) with "
                 f"{PPO_FIXED} is benchmarked; got {other or 'a lora: section'}")
    tc = config["train"]
    if h["rollout_batch"] % (tc["batch_size"] * tc["grad_accum"]):
        sys.exit(f"bench_ppo.py: ppo.rollout_batch {h['rollout_batch']} is not a multiple of "
                 f"train.batch_size x train.grad_accum")
    return config, h


def main():
    parser = argument_parser(__doc__, "ppo")
    parser.add_argument("--prompts", help="prompts, {\"prompt\": ...} a line; default data.train")
    for key, default in PPO_DEFAULTS.items():
        parser.add_argument("--" + key.replace("_", "-"), type=type(default),
                            help=f"ppo.{key} (default: the config's, else {default})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, h = load_configs(args)
    m = config["model"]
    torch.manual_seed(config["seed"])
    # Weights that would come from the base and the reward model: they do not matter for speed.
    policy = GPT(m)
    reference = copy.deepcopy(policy).requires_grad_(False)
    reward_model = ScalarModel(m).requires_grad_(False)
    value_model = copy.deepcopy(reward_model).requires_grad_(True)
    nn.init.zeros_(value_model.score.weight)  # the recipe's fresh value head (build_critic)
    params = list(policy.parameters()) + list(value_model.parameters())  # tied weights once
    if args.params_only:
        frozen = sum(p.numel() for model in (reference, reward_model) for p in model.parameters())
        trainable = sum(p.numel() for p in params)
        print(f"params={trainable + frozen} trainable={trainable}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)
    prompts = read_prompts(args.prompts or config["data"]["train"])
    longest = max(len(p) for p in prompts) + h["max_new_tokens"]
    if longest > m["context"]:
        sys.exit(f"bench_ppo.py: a row of {longest} tokens does not fit the context {m['context']}")
    policy.train()
    value_model.train()
    step = ppo_step((policy, reference, reward_model, value_model), prompts, optimizer, params,
                    config, h)
    time_and_report(args, params, step, h["rollout_batch"], unit="rows")


if __name__ == "__main__":
    main()
