"""PyTorch half of `scripts/bench distill`: the distillation step of a Forge distill config
(recipes/distill.cpp) with the GPT of scripts/bench_gpt.py or the BERT of scripts/bench_bert.py as
teacher and student: the frozen teacher's forward under torch.no_grad(), the student's forward and
backward of alpha_ce * hard-label CE + alpha_kd * T^2 KL(p_t || p_s) + alpha_cos * (1 - cos(h_s,
h_t)) as the config weights them (a term of weight 0 is left out), clipping and AdamW over the
student, with the same batch, context and schedule. GPT: every next-byte position is scored, from
random windows of data.train. BERT: CE is masked-LM plus next-sentence prediction, KL runs over the
masked positions and the cosine over the real (unpadded) ones, on the random pairs of
bench_bert.py. The teacher's sizes come from config.yaml in the run directory distill.teacher names
(scripts/bench_train.sh trains one for a step); its weights do not matter for speed, so it keeps
its random init and the student starts from its blocks as distill.init_from_teacher says. Prints
the line of bench_gpt.py; with --params-only "params=N trainable=M", N counting teacher and student
and M the student, as `forge validate` counts them. Run with /usr/bin/python3.
"""
import os
import sys

import torch
import torch.nn.functional as F
import yaml

import bench_bert
import bench_gpt
from bench_gpt import adamw, argument_parser, train_and_report, training_bytes, window_step_loss

# Forge's distill: defaults (recipes/distill.cpp, distill_section).
DISTILL_DEFAULTS = {"teacher": "", "init_from_teacher": "none", "teacher_blocks": [],
                    "temperature": 2.0, "alpha_ce": 0.5, "alpha_kd": 0.5, "alpha_cos": 0.0,
                    "kl": "forward"}


def load_configs(path):
    """The student's config as its family's bench script reads it, the distill: section, the
    teacher's config and the family's module (bench_gpt or bench_bert)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    family = bench_bert if (raw.get("model") or {}).get("arch") == "bert" else bench_gpt
    config = family.load_config(path)
    d = dict(DISTILL_DEFAULTS, **(raw.get("distill") or {}))
    teacher_yaml = os.path.join(d["teacher"], "config.yaml")
    if not os.path.isfile(teacher_yaml):
        sys.exit(f"bench_distill.py: {path}: distill.teacher {d['teacher']!r} is not a run "
                 "directory with a config.yaml")
    teacher = family.load_config(teacher_yaml)
    # Forge's learned projection for the cosine between unequal widths is not modelled here.
    if d["kl"] != "forward" or (d["alpha_cos"] > 0 and
                                config["model"]["d_model"] != teacher["model"]["d_model"]):
        sys.exit(f"bench_distill.py: {path}: only the forward KL, and the cosine term between "
                 "equal widths, are benchmarked")
    return config, d, teacher, family


def teacher_blocks(d, n_layers):
    """The teacher block each student block starts from (Forge's teacher_blocks_for_student)."""
    if d["init_from_teacher"] == "every_other":
        return [2 * s for s in range(n_layers)]
    if d["init_from_teacher"] == "blocks":
        return list(d["teacher_blocks"])
    return []


def init_from_teacher(student, teacher, blocks):
    """Forge's init_student_from_teacher: teacher block blocks[s] into student block s, every tensor
    outside the blocks (embeddings, final norm, heads) by its name."""
    source = teacher.state_dict()

    def teacher_name(name):
        if not name.startswith("blocks."):
            return name
        s, rest = name[len("blocks."):].split(".", 1)
        return f"blocks.{blocks[int(s)]}.{rest}"

    student.load_state_dict({name: source[teacher_name(name)] for name in student.state_dict()})


def weighted_loss(d, hard_sum, s_logits, t_logits, scored, s_hidden, t_hidden, real):
    """This micro-batch's share of the step's loss, as Forge's distill_loss over its trainer's
    division: alpha_ce * hard_sum and alpha_kd * T^2 KL summed over the rows, both divided by the
    `scored` rows of the step (with one micro-batch that is kl_div's batchmean; a sum over the step
    keeps it exact under accumulation), and alpha_cos * (1 - cos) over the `real` positions of the
    step."""
    T = d["temperature"]
    loss = 0.0
    if d["alpha_ce"] > 0:
        loss = loss + d["alpha_ce"] * hard_sum / scored
    if d["alpha_kd"] > 0:
        kd_sum = T * T * F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                                  log_target=True, reduction="sum")
        loss = loss + d["alpha_kd"] * kd_sum / scored
    if d["alpha_cos"] > 0:
        one_minus_cos = 1.0 - F.cosine_similarity(s_hidden, t_hidden, dim=-1)
        loss = loss + d["alpha_cos"] * one_minus_cos.sum() / real
    return loss


def gpt_micro_loss(student, teacher, d):
    """The mean loss of one batch of windows, for bench_gpt.window_step_loss (which divides by the
    micro-batches): every position is scored and real."""
    def loss(ids, targets):
        with torch.no_grad():
            t_hidden = teacher.hidden(ids)
            t_logits = teacher.logits(t_hidden)
        s_hidden = student.hidden(ids)
        s_logits = student.logits(s_hidden)
        C = s_hidden.size(-1)
        rows = ids.numel()
        hard_sum = F.cross_entropy(s_logits, targets.view(-1), reduction="sum")
        return weighted_loss(d, hard_sum, s_logits, t_logits, rows, s_hidden.view(-1, C),
                             t_hidden.view(-1, C), rows)

    return loss


def bert_step_loss(student, teacher, config, d):
    """One step over grad_accum random pair batches. The hard loss is bert_pretrain's (mean MLM
    over the step's chosen positions plus mean NSP over its pairs), so the step's batches are drawn
    first, as in Forge."""
    m, tc = config["model"], config["train"]
    B, T, accum, V = tc["batch_size"], m["context"], tc["grad_accum"], m["vocab_size"]
    n_special = max(4, len(config["data"]["special_tokens"]))

    def step_loss(step):
        batches = [bench_bert.random_batch(B, T, V, n_special, config["bert"]["mask_prob"])
                   for _ in range(accum)]
        chosen = sum(b[3].numel() for b in batches)
        # Real positions as rows b*T + t: those whose key bias is 0 (padding has -inf).
        real_rows = [(b[2].view(-1) == 0).nonzero().squeeze(1) for b in batches]
        real = sum(r.numel() for r in real_rows)
        for batch, rows in zip(batches, real_rows):
            with torch.no_grad():
                _, _, t_hidden, t_logits = teacher.pair_losses(*batch)
            mlm_sum, nsp_sum, s_hidden, s_logits = student.pair_losses(*batch)
            C = s_hidden.size(-1)
            hard_sum = mlm_sum + nsp_sum * (chosen / (B * accum))
            loss = weighted_loss(d, hard_sum, s_logits, t_logits, chosen,
                                 s_hidden.reshape(-1, C)[rows], t_hidden.reshape(-1, C)[rows],
                                 real)
            loss.backward()
        return loss.detach()

    return step_loss


def main():
    args = argument_parser(__doc__, "distill").parse_args()
    torch.set_num_threads(args.threads)
    config, d, teacher_config, family = load_configs(args.config)
    m, tc = config["model"], config["train"]
    torch.manual_seed(config["seed"])
    if family is bench_gpt:
        teacher, student = bench_gpt.GPT(teacher_config["model"]), bench_gpt.GPT(m)
    else:
        teacher, student = (bench_bert.Bert(c["model"], c["bert"]["type_vocab_size"])
                            for c in (teacher_config, config))
    teacher.requires_grad_(False)
    teacher.eval()
    blocks = teacher_blocks(d, m["n_layers"])
    if blocks:
        init_from_teacher(student, teacher, blocks)
    params = list(student.parameters())  # tied weights counted once
    if args.params_only:
        trainable = sum(p.numel() for p in params)
        print(f"params={trainable + sum(p.numel() for p in teacher.parameters())} "
              f"trainable={trainable}")
        return
    optimizer = adamw(params, config["optimizer"], args.foreach)

    B, T, accum = tc["batch_size"], m["context"], tc["grad_accum"]
    if family is bench_gpt:
        step_loss = window_step_loss(gpt_micro_loss(student, teacher, d), training_bytes(config),
                                     B, T, accum)
    else:
        step_loss = bert_step_loss(student, teacher, config, d)
    student.train()
    train_and_report(args, config, params, optimizer, step_loss, B * T * accum)


if __name__ == "__main__":
    main()
