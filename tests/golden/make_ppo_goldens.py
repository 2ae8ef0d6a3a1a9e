"""Writes tests/golden/ppo.txt: PyTorch 1.13 (float64) values and gradients of the PPO pieces of
nn/ppo.h, read by tests/nn/test_ppo.cpp. Run from the repository root with Debian's torch:
    /usr/bin/python3 tests/golden/make_ppo_goldens.py
Lines are "name n v1 ... vn". The formulas are TRL's (PPOTrainer.compute_rewards,
compute_advantages and loss; core.masked_mean, masked_var, masked_whiten, entropy_from_logits,
clip_by_value; AdaptiveKLController; TRL 0.4-0.11), chained as one PPO step does: rewards, GAE,
whitened advantages, then the losses. Forge's tensors are 0 at masked positions, so TRL's outputs
are multiplied by the mask before they are written. One row of the batch has a hole in its mask,
where Forge's GAE skips the masked positions and TRL's chains through them: its advantages come
from TRL's recursion run on the row's response tokens alone, and the script checks that this
equals TRL's own recursion on the rows without holes.
"""
import os

import numpy as np
import torch

torch.manual_seed(2025)
dt = torch.float64
lines = []


def put(name, t):
    if isinstance(t, list):  # hyper-parameters: as written, not rounded to torch's float32 default
        t = torch.tensor(t, dtype=dt)
    v = t.detach().reshape(-1).tolist()
    lines.append(f"{name} {len(v)} " + " ".join(repr(float(x)) for x in v))


# ---- TRL's helpers (trl/core.py), as written there ----
def masked_mean(values, mask, axis=None):
    if axis is not None:
        return (values * mask).sum(axis=axis) / mask.sum(axis=axis)
    return (values * mask).sum() / mask.sum()


def masked_var(values, mask, unbiased=True):
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def masked_whiten(values, mask, shift_mean=True):
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def entropy_from_logits(logits):
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, axis=-1) - torch.sum(pd * logits, axis=-1)


def clip_by_value(x, tensor_min, tensor_max):
    return torch.max(torch.min(x, tensor_max), tensor_min)


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        target = self.target
        proportional_error = np.clip(current / target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


# ---- PPOTrainer's methods ----
def compute_rewards(scores, logprobs, ref_logprobs, masks, kl_coef):
    rewards, non_score_rewards = [], []
    for score, logprob, ref_logprob, mask in zip(scores, logprobs, ref_logprobs, masks):
        kl = logprob - ref_logprob  # kl_penalty "kl"
        non_score_reward = -kl_coef * kl
        non_score_rewards.append(non_score_reward)
        reward = non_score_reward.clone()
        last_non_masked_index = mask.nonzero()[-1]
        reward[last_non_masked_index] += score
        rewards.append(reward)
    return torch.stack(rewards), torch.stack(non_score_rewards)


def compute_advantages(values, rewards, mask, gamma, lam):
    """TRL's compute_advantages without its final whitening (whitened separately below)."""
    lastgaelam = 0
    advantages_reversed = []
    gen_len = rewards.shape[-1]
    values = values * mask
    rewards = rewards * mask
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1]).transpose(0, 1)
    returns = advantages + values
    return advantages, returns


def gae_on_response_tokens(values, rewards, mask, gamma, lam):
    """TRL's recursion on each row's response tokens alone, scattered back; 0 elsewhere."""
    advantages, returns = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = mask[b].nonzero().squeeze(1)
        a, r = compute_advantages(values[b, idx][None], rewards[b, idx][None],
                                  torch.ones(1, len(idx), dtype=dt), gamma, lam)
        advantages[b, idx], returns[b, idx] = a[0], r[0]
    return advantages, returns


# ---- one rollout: B rows of T response positions ----
B, T = 4, 7
mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0],   # prompt, response, padding
                     [1, 1, 1, 1, 1, 1, 1],   # all response
                     [0, 1, 1, 0, 0, 0, 0],   # a short response
                     [0, 1, 1, 0, 1, 1, 0]],  # a hole (tokens the policy did not generate)
                    dtype=dt)
contiguous = [0, 1, 2]
logp = -torch.rand(B, T, dtype=dt) * 3.0
ref_logp = logp + torch.randn(B, T, dtype=dt) * 0.3
scores = torch.randn(B, dtype=dt) * 2.0
values = torch.randn(B, T, dtype=dt)
kl_coef = 0.05
put("mask", mask)
put("logp", logp)
put("ref_logp", ref_logp)
put("scores", scores)
put("values", values)
put("kl_coef", [kl_coef])

rewards, non_score = compute_rewards(scores, logp, ref_logp, mask, kl_coef)
rewards = rewards * mask
put("rewards.rewards", rewards)
put("rewards.kl", (logp - ref_logp) * mask)

for name, gamma, lam in [("lm", 1.0, 0.95), ("discounted", 0.9, 0.8)]:
    adv, ret = gae_on_response_tokens(values, rewards, mask, gamma, lam)
    trl_adv, trl_ret = compute_advantages(values, rewards, mask, gamma, lam)
    assert torch.allclose((trl_adv * mask)[contiguous], adv[contiguous], rtol=0, atol=1e-14)
    assert torch.allclose((trl_ret * mask)[contiguous], ret[contiguous], rtol=0, atol=1e-14)
    assert not torch.allclose((trl_adv * mask)[3], adv[3])  # the hole: chained through by TRL
    put(f"gae_{name}.gamma", [gamma])
    put(f"gae_{name}.lam", [lam])
    put(f"gae_{name}.advantages", adv)
    put(f"gae_{name}.returns", ret)

advantages, returns = gae_on_response_tokens(values, rewards, mask, 1.0, 0.95)
whitened = masked_whiten(advantages, mask) * mask
put("whiten.shifted", whitened)
put("whiten.unshifted", masked_whiten(advantages, mask, shift_mean=False) * mask)

# ---- the losses of one PPO minibatch, on the rollout above ----
clip_range, clip_range_value = 0.2, 0.2
put("clip_range", [clip_range])
put("clip_range_value", [clip_range_value])
logp_new = (logp + torch.randn(B, T, dtype=dt) * 0.3).requires_grad_(True)
put("logp_new", logp_new)
ratio = torch.exp(logp_new - logp)
pg_losses = -whitened * ratio
pg_losses2 = -whitened * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
pg_loss = masked_mean(torch.max(pg_losses, pg_losses2), mask)
pg_loss.backward()
put("policy.loss", pg_loss)
put("policy.clip_frac", masked_mean(torch.gt(pg_losses2, pg_losses).double(), mask))
put("policy.approx_kl", 0.5 * masked_mean((logp_new - logp) ** 2, mask))
put("policy.ratio_mean", masked_mean(ratio, mask))
put("policy.dlogp_new", logp_new.grad)

values_new = (values + torch.randn(B, T, dtype=dt) * 0.5).requires_grad_(True)
put("values_new", values_new)
vpredclipped = clip_by_value(values_new, values - clip_range_value, values + clip_range_value)
vf_losses1 = (values_new - returns) ** 2
vf_losses2 = (vpredclipped - returns) ** 2
vf_loss = 0.5 * masked_mean(torch.max(vf_losses1, vf_losses2), mask)
vf_loss.backward()
put("value.loss", vf_loss)
put("value.clip_frac", masked_mean(torch.gt(vf_losses2, vf_losses1).double(), mask))
put("value.dvalues_new", values_new.grad)

# ---- entropy: V = 11 is no multiple of a SIMD width ----
V = 11
logits = (torch.randn(B, T, V, dtype=dt) * 2.0).requires_grad_(True)
entropy = masked_mean(entropy_from_logits(logits), mask)
entropy.backward()
put("entropy.logits", logits)
put("entropy.value", entropy)
put("entropy.dlogits", logits.grad)

# ---- the adaptive KL controller over a few rollouts, both clipping sides included ----
ctl = AdaptiveKLController(0.2, 6.0, 10000.0)
kls = [3.0, 6.5, 12.0, 0.5, 6.0, 7.1]
n_steps = [256, 256, 512, 64, 256, 1000]
coefs = []
for kl, n in zip(kls, n_steps):
    ctl.update(kl, n)
    coefs.append(float(ctl.value))
put("kl_ctl.options", [0.2, 6.0, 10000.0])
put("kl_ctl.kls", kls)
put("kl_ctl.n_steps", [float(n) for n in n_steps])
put("kl_ctl.values", coefs)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ppo.txt")
with open(path, "w") as f:
    f.write(f"# Generated by tests/golden/make_ppo_goldens.py with torch {torch.__version__}; do not edit.\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} entries to {path}")
