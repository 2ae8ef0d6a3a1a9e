"""Writes tests/golden/preference.txt: PyTorch 1.13 (float64) values and gradients of the preference
losses of nn/preference.h, read by tests/nn/test_preference.cpp. Run from the repository root with
Debian's torch:  /usr/bin/python3 tests/golden/make_preference_goldens.py
Lines are "name n v1 ... vn". The formulas are written as TRL writes them (DPOTrainer.dpo_loss,
_get_batch_logps and concatenated_forward, RewardTrainer.compute_loss, TRL 0.8-0.11): per-pair
losses, and gradients of TRL's batch loss, their mean, with respect to the policy's log-probabilities
(or logits) and the rewards. Targets are already shifted (targets[t] is the token after position t),
as Forge's batches hold them, so the logits are not shifted here.
"""
import os

import torch
import torch.nn.functional as F

torch.manual_seed(2024)
dt = torch.float64
lines = []


def put(name, t):
    if isinstance(t, list):  # hyper-parameters: as written, not rounded to torch's float32 default
        t = torch.tensor(t, dtype=dt)
    v = t.detach().reshape(-1).tolist()
    lines.append(f"{name} {len(v)} " + " ".join(repr(float(x)) for x in v))


def batch_logps(logits, labels, average):
    """TRL's _get_batch_logps without the shift: masked sum (or mean) of the targets' log-probs."""
    loss_mask = labels != -100
    labels = labels.clone()
    labels[~loss_mask] = 0
    per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    if average:
        return (per_token * loss_mask).sum(-1) / loss_mask.sum(-1)
    return (per_token * loss_mask).sum(-1)


def dpo_losses(pc, pr, rc, rr, beta, ls, loss_type):
    """TRL's DPOTrainer.dpo_loss for sigmoid, hinge and ipo."""
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    return losses, beta * (pc - rc).detach(), beta * (pr - rr).detach()


# ---- sequence log-probabilities: V = 11 is no multiple of a SIMD width ----
N, T, V = 3, 6, 11
logits = (torch.randn(N, T, V, dtype=dt) * 2.0).requires_grad_(True)
targets = torch.randint(0, V, (N, T))
targets[0, :2] = -100  # a prompt
targets[1, 4:] = -100  # padding
targets[2, :] = -100  # nothing scored: 0
put("seq.logits", logits)
put("seq.targets", targets)
out = batch_logps(logits, targets, average=False)
r = torch.randn(N, dtype=dt)
(out * r).sum().backward()
put("seq.r", r)
put("seq.out", out)
put("seq.dlogits", logits.grad)

# ---- DPO on given log-probabilities: B pairs, sums of a few tokens each ----
B = 8
counts_c = torch.randint(1, 12, (B,)).to(dt)
counts_r = torch.randint(1, 12, (B,)).to(dt)
pc0 = -(counts_c * 2.0 + torch.randn(B, dtype=dt) * 4.0)
pr0 = -(counts_r * 2.0 + torch.randn(B, dtype=dt) * 4.0)
rc = pc0 + torch.randn(B, dtype=dt) * 3.0
rr = pr0 + torch.randn(B, dtype=dt) * 3.0
for k, t in [("pc", pc0), ("pr", pr0), ("rc", rc), ("rr", rr), ("nc", counts_c), ("nr", counts_r)]:
    put(f"dpo.{k}", t)

# hinge with beta 0.5 so that some pairs sit past the hinge (zero loss and gradient).
variants = [("sigmoid", 0.1, 0.0), ("sigmoid_ls", 0.1, 0.2), ("ipo", 0.1, 0.0), ("hinge", 0.5, 0.0)]
for name, beta, ls in variants:
    loss_type = name.split("_")[0]
    pc = pc0.clone().requires_grad_(True)
    pr = pr0.clone().requires_grad_(True)
    if loss_type == "ipo":  # concatenated_forward: all_logps / size_completion
        losses, cr, rj = dpo_losses(pc / counts_c, pr / counts_r, rc / counts_c, rr / counts_r,
                                    beta, ls, loss_type)
    else:
        losses, cr, rj = dpo_losses(pc, pr, rc, rr, beta, ls, loss_type)
    loss = losses.mean()
    loss.backward()
    put(f"dpo_{name}.beta", [beta])
    put(f"dpo_{name}.label_smoothing", [ls])
    put(f"dpo_{name}.losses", losses)
    put(f"dpo_{name}.loss", loss)
    put(f"dpo_{name}.chosen_rewards", cr)
    put(f"dpo_{name}.rejected_rewards", rj)
    put(f"dpo_{name}.dpc", pc.grad)
    put(f"dpo_{name}.dpr", pr.grad)

# ---- DPO from logits: one concatenated [2B, T, V] batch, chosen rows first ----
B2, T2, V2 = 2, 5, 7
policy = (torch.randn(2 * B2, T2, V2, dtype=dt) * 1.5).requires_grad_(True)
reference = policy.detach() + torch.randn(2 * B2, T2, V2, dtype=dt) * 0.5
labels = torch.randint(0, V2, (2 * B2, T2))
labels[:, 0] = -100  # the prompt's positions
labels[1, :2] = -100
labels[2, 3:] = -100  # padding of a short row
put("e2e.policy", policy)
put("e2e.reference", reference)
put("e2e.targets", labels)
for name, beta in [("sigmoid", 0.1), ("ipo", 0.1)]:
    policy.grad = None
    average = name == "ipo"
    p = batch_logps(policy, labels, average)
    ref = batch_logps(reference, labels, average)
    losses, _, _ = dpo_losses(p[:B2], p[B2:], ref[:B2], ref[B2:], beta, 0.0, name)
    losses.mean().backward()
    put(f"e2e_{name}.loss", losses.mean())
    put(f"e2e_{name}.dpolicy", policy.grad)

# ---- Bradley-Terry reward loss ----
chosen0 = torch.randn(B, dtype=dt) * 2.0
rejected0 = torch.randn(B, dtype=dt) * 2.0
margin = torch.rand(B, dtype=dt) * 2.0
put("bt.chosen", chosen0)
put("bt.rejected", rejected0)
put("bt.margin", margin)
for name, use_margin, coef in [("plain", False, None), ("margin_center", True, 0.01)]:
    chosen = chosen0.clone().requires_grad_(True)
    rejected = rejected0.clone().requires_grad_(True)
    if use_margin:
        loss = -F.logsigmoid(chosen - rejected - margin).mean()
    else:
        loss = -F.logsigmoid(chosen - rejected).mean()
    if coef is not None:
        loss += coef * torch.mean((chosen + rejected) ** 2)
    loss.backward()
    put(f"bt_{name}.coefficient", [coef or 0.0])
    put(f"bt_{name}.loss", loss)
    put(f"bt_{name}.dchosen", chosen.grad)
    put(f"bt_{name}.drejected", rejected.grad)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preference.txt")
with open(path, "w") as f:
    f.write(f"# Generated by tests/golden/make_preference_goldens.py with torch {torch.__version__}; do not edit.\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} entries to {path}")
