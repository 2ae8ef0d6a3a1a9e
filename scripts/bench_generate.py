"""PyTorch half of `scripts/bench generate`: batched sampling with a KV cache from a randomly
initialised GPT of a Forge config's shape (scripts/bench_gpt.py's model), done as
`forge generate --prompts` does it: rows (prompt, sample) ordered by prompt length, --batch-size
rows at a time, each distinct prompt of a batch prefilled once (left-padded: each row at its own
positions, padding masked) and its cache copied to its samples, then one token a step for every
row through the preallocated cache, drawn with temperature and top-k, and each row's
log-probability summed from the raw logits. Prints "tok_s=X tokens=N seconds=S params=P"; the
time covers sampling only, not building the model. Run with Debian's /usr/bin/python3 (torch 1.13).
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

from bench_gpt import GPT, load_config


def read_prompts(path):
    """forge generate's plain prompt file: one prompt a line, blank lines skipped, bytes as ids."""
    with open(path, "rb") as f:
        lines = [line.rstrip(b"\r") for line in f.read().split(b"\n")]
    return [list(line) for line in lines if line.strip(b" \t\r")]


def forward_cached(model, ids, caches, length, start):
    """ids [B, T] at cache slots length .. length+T-1 (row b's position 0 at slot start[b]) ->
    logits [B, V] of the last slot; writes the keys and values into `caches`."""
    B, T = ids.shape
    C = model.tok_emb.weight.shape[1]
    slots = torch.arange(length, length + T)
    x = model.tok_emb(ids) + model.pos_emb((slots[None, :] - start[:, None]).clamp(min=0))
    S = length + T
    keys = torch.arange(S)
    # A query sees its row's slots up to its own; a padding query sees itself (never NaN).
    own = keys[None, None, :] >= start[:, None, None]  # [B, 1, S]
    allowed = (own & (keys[None, None, :] <= slots[None, :, None])) | (keys == slots[:, None])
    bias = torch.zeros(B, 1, T, S).masked_fill(~allowed[:, None], float("-inf"))
    for block, (k_cache, v_cache) in zip(model.blocks, caches):
        H = block.n_heads
        D = C // H
        q, k, v = block.c_attn(block.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        k_cache[:, :, length:S] = k
        v_cache[:, :, length:S] = v
        att = (q @ k_cache[:, :, :S].transpose(-2, -1)) * (1.0 / math.sqrt(D)) + bias
        y = (att.softmax(-1) @ v_cache[:, :, :S]).transpose(1, 2).reshape(B, T, C)
        x = x + block.attn_proj(y)
        x = x + block.mlp_proj(F.gelu(block.c_fc(block.ln_2(x)), approximate="tanh"))
    return F.linear(model.ln_f(x[:, -1]), model.tok_emb.weight)


def sample_rows(model, prompts, rows, K, max_new, temperature, top_k):
    """Samples max_new tokens for each row (prompt index * K + sample) of one batch, from the top_k
    most likely (all of them for 0); returns them, i64 [len(rows), max_new]."""
    distinct, row_prompt = [], []
    for r in rows:
        if not distinct or distinct[-1] != r // K:
            distinct.append(r // K)
        row_prompt.append(len(distinct) - 1)
    L = max(len(prompts[p]) for p in distinct)
    ids = torch.zeros(len(distinct), L, dtype=torch.long)
    for u, p in enumerate(distinct):
        ids[u, L - len(prompts[p]):] = torch.tensor(prompts[p])
    start = torch.tensor([L - len(prompts[p]) for p in distinct])
    C, H = model.tok_emb.weight.shape[1], model.blocks[0].n_heads
    capacity = L + max_new - 1
    caches = [(torch.zeros(len(distinct), H, capacity, C // H),
               torch.zeros(len(distinct), H, capacity, C // H)) for _ in model.blocks]
    logits = forward_cached(model, ids, caches, 0, start)
    index = torch.tensor(row_prompt)
    caches = [(k.index_select(0, index), v.index_select(0, index)) for k, v in caches]
    logits, start = logits.index_select(0, index), start.index_select(0, index)
    logprob = torch.zeros(len(rows), dtype=torch.float64)  # kept as Forge keeps it: equal work
    tokens = torch.empty(len(rows), max_new, dtype=torch.long)
    for i in range(max_new):
        if top_k:
            top, top_ids = torch.topk(logits / temperature, min(top_k, logits.shape[1]), dim=1)
            token = top_ids.gather(1, torch.multinomial(top.softmax(1), 1))  # [B, 1]
        else:
            token = torch.multinomial((logits / temperature).softmax(1), 1)
        logprob += logits.log_softmax(1).gather(1, token)[:, 0].double()
        tokens[:, i] = token[:, 0]
        if i + 1 < max_new:
            logits = forward_cached(model, token, caches, L + i, start)
    return tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", help="a Forge GPT config (YAML), resolved")
    parser.add_argument("prompts", help="one prompt a line")
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=200, help="0: sample from all tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--params-only", action="store_true", help="print params=N and exit")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    torch.manual_seed(config["seed"])
    model = GPT(config["model"]).eval()
    params = sum(p.numel() for p in model.parameters())
    if args.params_only:
        print(f"params={params}")
        return
    prompts, K = read_prompts(args.prompts), args.num_samples
    order = sorted(range(len(prompts) * K), key=lambda r: -len(prompts[r // K]))
    with torch.inference_mode():
        begin = time.perf_counter()
        tokens = 0
        for first in range(0, len(order), args.batch_size):
            tokens += sample_rows(model, prompts, order[first:first + args.batch_size], K,
                                  args.max_new_tokens, args.temperature, args.top_k).numel()
        seconds = time.perf_counter() - begin
    print(f"tok_s={tokens / seconds:.1f} tokens={tokens} seconds={seconds:.3f} params={params}")


if __name__ == "__main__":
    main()
