"""Writes tests/golden/preference.txt: PyTorch 1.13 (float64) values and gradients of the preference
losses of nn/preference.h, read by tests/nn/test_preference.cpp. Run from the repository root with
Debian's torch:  /usr/bin/python3 tests/golden/make_preference_goldens.py
Lines are "name n v1 ... vn". The formulas are written as TRL writes them (DPOTrainer.dpo_loss,
_get_batch_logps and concatenated_forward, RewardTrainer.compute_loss, TRL 0.8-0.11; ORPO as
ORPOTrainer.odds_ratio_loss and concatenated_forward, SimPO as CPOTrainer.cpo_loss with loss_type
"simpo" and cpo_alpha 0, trl/experimental of 2026): per-pair
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


def put_result(key, losses, chosen_rewards, rejected_rewards, pc, pr):
    """Backward of the pairs' mean loss; the losses, that mean, the rewards and pc's, pr's grads."""
    loss = losses.mean()
    loss.backward()
    put(f"{key}.losses", losses)
    put(f"{key}.loss", loss)
    put(f"{key}.chosen_rewards", chosen_rewards)
    put(f"{key}.rejected_rewards", rejected_rewards)
    put(f"{key}.dpc", pc.grad)
    put(f"{key}.dpr", pr.grad)


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
    put(f"dpo_{name}.beta", [beta])
    put(f"dpo_{name}.label_smoothing", [ls])
    put_result(f"dpo_{name}", losses, cr, rj, pc, pr)

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

def log1mexp(x):
    """TRL's ORPO log(1 - exp(x)), branching at -log 2."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)),
                       torch.log(-torch.expm1(x)))


def orpo_losses(ac, ar, nll, beta):
    """ORPOTrainer.odds_ratio_loss on averaged log-probs. Its batch loss is
    nll - mean(beta * ratio), here per pair nll - beta * ratio, whose mean is that loss."""
    log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar))
    ratio = F.logsigmoid(log_odds)
    return nll - beta * ratio, beta * ac.detach(), beta * ar.detach(), log_odds


def simpo_losses(ac, ar, beta, gamma, ls):
    """CPOTrainer.cpo_loss, loss_type "simpo", on averaged log-probs."""
    logits = (ac - ar) - gamma / beta
    losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    return losses, beta * ac.detach(), beta * ar.detach()


# ---- ORPO and SimPO on given summed log-probabilities: every average below 0, one near 0 and one
# far below (both branches of TRL's log1mexp) ----
opc0 = -counts_c * (torch.rand(B, dtype=dt) * 2.5 + 0.05)
opr0 = -counts_r * (torch.rand(B, dtype=dt) * 2.5 + 0.05)
opc0[2] = -counts_c[2] * 2e-4
opr0[5] = -counts_r[5] * 6.0
nll = torch.tensor(1.7, dtype=dt)
put("ref_free.pc", opc0)
put("ref_free.pr", opr0)
put("ref_free.nll", nll)
for name, beta, gamma, ls in [("orpo", 0.1, 0.0, 0.0), ("simpo", 2.0, 1.2, 0.0),
                              ("simpo_ls", 2.5, 0.5, 0.1)]:
    pc = opc0.clone().requires_grad_(True)
    pr = opr0.clone().requires_grad_(True)
    n = nll.clone().requires_grad_(True)
    if name == "orpo":
        losses, cr, rj, log_odds = orpo_losses(pc / counts_c, pr / counts_r, n, beta)
        put(f"{name}.log_odds", log_odds)
    else:
        losses, cr, rj = simpo_losses(pc / counts_c, pr / counts_r, beta, gamma, ls)
    put(f"{name}.beta", [beta])
    put(f"{name}.gamma", [gamma])
    put(f"{name}.label_smoothing", [ls])
    put_result(name, losses, cr, rj, pc, pr)
    if name == "orpo":
        put(f"{name}.dnll", n.grad)

# ---- ORPO and SimPO from the logits above. ORPO's NLL scores the chosen rows' whole rows
# (ORPOTrainer: labels are the input ids wherever the attention mask is 1, prompt included), their
# mean over the batch's tokens (CrossEntropyLoss).
row_labels = labels.clone()
row_labels[:, 0] = torch.randint(0, V2, (2 * B2,))  # the prompt's tokens, scored by the NLL
row_labels[1, :2] = torch.randint(0, V2, (2,))
put("e2e.row_targets", row_labels[:B2])
for name in ["orpo", "simpo"]:
    policy.grad = None
    p = batch_logps(policy, labels, True)
    if name == "orpo":
        nll = F.cross_entropy(policy[:B2].reshape(-1, V2), row_labels[:B2].reshape(-1))
        losses = orpo_losses(p[:B2], p[B2:], nll, 0.1)[0]
    else:
        losses = simpo_losses(p[:B2], p[B2:], 2.0, 1.2, 0.0)[0]
    losses.mean().backward()
    put(f"e2e_{name}.loss", losses.mean())
    put(f"e2e_{name}.dpolicy", policy.grad)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preference.txt")
with open(path, "w") as f:
    f.write(f"# Generated by tests/golden/make_preference_goldens.py with torch {torch.__version__}; do not edit.\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} entries to {path}")
