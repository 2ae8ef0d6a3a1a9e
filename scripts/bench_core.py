"""PyTorch half of scripts/bench: forward+backward timings of the hot ops (suite core) and of a
mixture-of-experts layer (suite moe) with the same shapes and math as scripts/bench_core.cpp. Prints one line per op, "op=NAME ms=MEDIAN fwd_ms=MEDIAN
bwd_ms=MEDIAN", for the script to join. Run with Debian's /usr/bin/python3 (torch 1.13, which has
no scaled_dot_product_attention, so attention is written out as PyTorch 1.13 models did).
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# GPT-2 small shapes: N = B*T = 2048 tokens, C = 768, hidden 4C = 3072, V = 50257, H = 12, D = 64.
N, C, FF, V, B, H, T, D = 2048, 768, 3072, 50257, 8, 12, 256, 64


def randn(*shape, std=1.0, grad=False):
    return (torch.randn(*shape) * std).requires_grad_(grad)


# Each maker returns (warmup, iters, leaves, forward, dy); dy None means a scalar output.
def linear():
    x = randn(N, C, grad=True)
    w, b = randn(FF, C, std=0.02, grad=True), randn(FF, std=0.02, grad=True)
    return 3, 20, [x, w, b], lambda: F.linear(x, w, b), randn(N, FF)


def attention():
    q, k, v = (randn(B, H, T, D, grad=True) for _ in range(3))
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scale = 1.0 / D ** 0.5

    def forward():
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(mask, float("-inf"))
        att = att.softmax(-1)
        return att @ v

    return 3, 20, [q, k, v], forward, randn(B, H, T, D)


def layernorm():
    x = randn(N, C, grad=True)
    w = (randn(C, std=0.1) + 1.0).requires_grad_(True)
    b = randn(C, std=0.1, grad=True)
    return 3, 20, [x, w, b], lambda: F.layer_norm(x, (C,), w, b), randn(N, C)


def cross_entropy():
    # 2048 x 50257 logits are 412 MB: fewer iterations keep the suite short.
    logits = randn(N, V, grad=True)
    targets = torch.randint(0, V, (N,))
    return 1, 6, [logits], lambda: F.cross_entropy(logits, targets), None


def kd_kl_div_bench(vocab, warmup, iters):
    # Distillation at temperature 2 over 768 rows, as Forge's kd_kl_div with every row scored.
    student, teacher, temp = randn(768, vocab, grad=True), randn(768, vocab), 2.0

    def forward():
        log_s = F.log_softmax(student / temp, -1)
        log_t = F.log_softmax(teacher / temp, -1)
        return temp * temp * F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")

    return warmup, iters, [student], forward, None


def kd_kl_div():
    return kd_kl_div_bench(V, 1, 6)


def kd_kl_div_v256():
    return kd_kl_div_bench(256, 3, 20)


def gelu():
    x = randn(N, FF, grad=True)
    return 3, 20, [x], lambda: F.gelu(x), randn(N, FF)


def embedding():
    w = randn(V, C, std=0.02, grad=True)
    ids = torch.randint(0, V, (N,))
    return 3, 20, [w], lambda: F.embedding(ids, w), randn(N, C)


def cv_squared(v):
    return v.var(unbiased=False) / (v.mean() ** 2 + 1e-10)


class MoE(torch.nn.Module):
    """Shazeer et al.'s noisy top-k MoE as nn/moe.h computes it: routers at zero, GELU (tanh)
    experts stacked [E, ...], capacity with first choices first, per-expert index_select and
    index_add, and the cv2 losses with the smooth load estimator."""

    def __init__(self, c, h, e, k, capacity_factor):
        super().__init__()
        self.e, self.k, self.capacity_factor = e, k, capacity_factor
        self.w_gate = torch.nn.Parameter(torch.zeros(e, c))
        self.w_noise = torch.nn.Parameter(torch.zeros(e, c))
        self.w1 = torch.nn.Parameter(torch.randn(e, h, c) * 0.02)
        self.b1 = torch.nn.Parameter(torch.zeros(e, h))
        self.w2 = torch.nn.Parameter(torch.randn(e, c, h) * 0.02)
        self.b2 = torch.nn.Parameter(torch.zeros(e, c))

    def forward(self, x):
        n, e, k = x.shape[0], self.e, self.k
        clean = x @ self.w_gate.T
        noise_std = F.softplus(x @ self.w_noise.T) + 0.01
        noisy = clean + torch.randn_like(clean) * noise_std
        top_vals, top_idx = noisy.topk(k + 1, dim=1)
        gates = F.softmax(top_vals[:, :k], dim=1)
        experts = top_idx[:, :k]
        capacity = max(1, math.ceil(self.capacity_factor * n * k / e))
        # Rank-major order: every token's first choice claims capacity before any second one.
        flat_expert = experts.T.reshape(-1)
        flat_token = torch.arange(n).repeat(k)
        flat_gate = gates.T.reshape(-1)
        out = torch.zeros_like(x)
        for i in range(e):
            chosen = (flat_expert == i).nonzero().squeeze(1)[:capacity]
            tokens = flat_token[chosen]
            h = F.gelu(F.linear(x.index_select(0, tokens), self.w1[i], self.b1[i]),
                       approximate="tanh")
            y = F.linear(h, self.w2[i], self.b2[i]) * flat_gate[chosen].unsqueeze(1)
            out = out.index_add(0, tokens, y)
        importance = torch.zeros(e).index_add(0, experts.reshape(-1), gates.reshape(-1))
        thr_in, thr_out = top_vals[:, k:k + 1], top_vals[:, k - 1:k]
        normal = torch.distributions.Normal(0.0, 1.0)
        prob = torch.where(noisy > thr_in, normal.cdf((clean - thr_in) / noise_std),
                           normal.cdf((clean - thr_out) / noise_std))
        aux = 0.1 * cv_squared(importance) + 0.1 * cv_squared(prob.sum(0))
        return out, aux


def moe_bench(n, c, h, iters):
    layer = MoE(c, h, 8, 2, 1.25)
    x, dy = randn(n, c, grad=True), randn(n, c)

    def forward():
        out, aux = layer(x)
        return (out * dy).sum() + aux

    return 3, iters, [x] + list(layer.parameters()), forward, None


def moe_shakespeare():
    return moe_bench(768, 128, 256, 40)


def moe_gpt2():
    return moe_bench(2048, 768, 1536, 10)


SUITES = {"core": [linear, attention, layernorm, cross_entropy, kd_kl_div, kd_kl_div_v256, gelu,
                   embedding],
          "moe": [moe_shakespeare, moe_gpt2]}


def run(name, make, repeat):
    warmup, iters, leaves, forward, dy = make()
    total, fwd, bwd = [], [], []
    for i in range(warmup + iters * repeat):
        for leaf in leaves:
            leaf.grad = None
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        del y
        if i < warmup:
            continue
        total.append((t2 - t0) * 1e3)
        fwd.append((t1 - t0) * 1e3)
        bwd.append((t2 - t1) * 1e3)
    print(f"op={name} ms={statistics.median(total):.3f} fwd_ms={statistics.median(fwd):.3f} "
          f"bwd_ms={statistics.median(bwd):.3f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--only", default="", help="comma-separated ops of the suite")
    parser.add_argument("--repeat", type=int, default=1, help="N times the default iterations")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat wants N >= 1, got {args.repeat}")
    makers = SUITES[args.suite]
    only = [o for o in args.only.split(",") if o]
    unknown = set(only) - {m.__name__ for m in makers}
    if unknown:
        parser.error(f"suite {args.suite} has no op {', '.join(sorted(unknown))}")

    torch.set_num_threads(2)
    torch.manual_seed(0)
    for make in makers:
        if not only or make.__name__ in only:
            run(make.__name__, make, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
