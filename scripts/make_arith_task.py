#!/usr/bin/env python3
"""The arithmetic task of the GRPO recipe (docs/recipes/grpo.md, Task and results): sums of two
3-digit numbers written "a+b=" with the answer after the "=", scored by exact match of the answer.

    python3 scripts/make_arith_task.py make [--out data/samples/arith]   # the data files (seeded)
    python3 scripts/make_arith_task.py score SAMPLES.jsonl [--answers FILE]  # exact-match accuracy
    python3 scripts/make_arith_task.py rft SAMPLES.jsonl OUT.jsonl [--answers FILE]  # RFT records
    python3 scripts/make_arith_task.py curve METHOD RUN ROWS_PER_STEP [--start BASE] >> curves.tsv
    python3 scripts/make_arith_task.py plot curves.tsv OUT.svg

`make` writes, from one seeded draw of distinct problems (a test problem never appears in the
training files, in either order of its operands):
  train.txt          pretraining text, one "a+b=c" a line (the base model's data), where c is the
                     reference answer: that of a sloppy solver, which drops the carry into the
                     hundreds (a % 100 + b % 100 >= 100) SLOPPY of the times it is due
  sft.jsonl          the first problems of train.txt as SFT records {"prompt": "a+b=",
                     "completion": "c"} with the same reference answers: the base's fine-tuning
                     data and the continued-SFT baseline's
  prompts.jsonl      the first of those as GRPO's prompts {"prompt": "a+b=", "answer": "c"} with
                     the exact sum, which the verifier checks (and the reference data miss)
  prompts.txt        their prompts alone, one a line, for `forge generate --prompts` (offline RFT)
  test.jsonl         held-out problems {"prompt", "answer"}, for GRPO's evaluation
  test_prompts.txt   the held-out prompts alone, one a line, for `forge generate --prompts`
`score` reads `forge generate --prompts test_prompts.txt` records and prints the share of samples
whose completion, up to its first newline, is the answer of its prompt (the answers from --answers,
default test.jsonl), overall and over the sums that carry into the hundreds and the others. `rft` keeps the correct samples as SFT records (offline rejection sampling;
--answers data/samples/arith/prompts.jsonl for samples of the training prompts). `curve` scores
every checkpoint of a run (and the run it started from, as step 0) greedily on the held-out prompts
(scripts/forge generate, temperature 0) and prints "METHOD<TAB>rows<TAB>exact_match" lines, rows =
step x ROWS_PER_STEP (the completions or records a step trains on); `plot` draws such lines as
accuracy curves (SVG).
"""
import argparse
import json
import pathlib
import random
import re
import subprocess
import sys
import tempfile
from xml.sax.saxutils import escape

from plot_frontier import STYLES, fmt, marker, nice_step, ticks

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "data" / "samples" / "arith"
SEED = 34
DIGITS = 3
N_TRAIN = 30000      # pretraining problems; sft.jsonl holds the first N_SFT, prompts.jsonl the
N_SFT = 10000        # first N_PROMPTS of those
N_PROMPTS = 4000
N_TEST = 1000
SLOPPY = 0.85        # share of due carries into the hundreds that the reference answers drop


def problems(n, rng, exclude):
    """n distinct (a, b) pairs of DIGITS-digit operands, none in `exclude` in either order."""
    lo, hi = 10 ** (DIGITS - 1), 10 ** DIGITS - 1
    out, seen = [], set(exclude)
    while len(out) < n:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if (a, b) in seen or (b, a) in seen:
            continue
        seen.add((a, b))
        out.append((a, b))
    return out


def carries_into_hundreds(a, b):
    return a % 100 + b % 100 >= 100


def sloppy_sum(a, b, slips):
    """The reference answer: a + b, less the carry into the hundreds SLOPPY of the times it is
    due (draws from `slips` only then), so the reference data teach a systematic mistake that an
    exact verifier does not make."""
    if carries_into_hundreds(a, b) and slips.random() < SLOPPY:
        return a + b - 100
    return a + b


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def make(out):
    rng = random.Random(SEED)
    test = problems(N_TEST, rng, set())
    train = problems(N_TRAIN, rng, set(test))
    slips = random.Random(SEED + 1)
    reference = [sloppy_sum(a, b, slips) for a, b in train]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.txt", "w", encoding="utf-8") as f:
        f.writelines(f"{a}+{b}={c}\n" for (a, b), c in zip(train, reference))
    write_jsonl(out / "prompts.jsonl",
                ({"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in train[:N_PROMPTS]))
    write_jsonl(out / "sft.jsonl",
                ({"prompt": f"{a}+{b}=", "completion": str(c)}
                 for (a, b), c in zip(train[:N_SFT], reference)))
    with open(out / "prompts.txt", "w", encoding="utf-8") as f:
        f.writelines(f"{a}+{b}=\n" for a, b in train[:N_PROMPTS])
    write_jsonl(out / "test.jsonl", ({"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in test))
    with open(out / "test_prompts.txt", "w", encoding="utf-8") as f:
        f.writelines(f"{a}+{b}=\n" for a, b in test)


def graded(samples, answers):
    """(sample record, correct?) for every record of a forge generate output file."""
    with open(answers, encoding="utf-8") as f:
        answer = {r["prompt"]: r["answer"] for r in map(json.loads, f)}
    with open(samples, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["prompt"] not in answer:
                sys.exit(f"make_arith_task.py: {samples}: prompt {r['prompt']!r} is not in {answers}")
            yield r, r["completion"].split("\n", 1)[0] == answer[r["prompt"]]


def exact_match(samples, answers):
    results = [ok for _, ok in graded(samples, answers)]
    return sum(results) / max(len(results), 1), sum(results), len(results)


def carry_split(samples, answers):
    """Exact match of the sums that carry into the hundreds (the reference data's mistake) and
    of the others."""
    split = {True: [], False: []}
    for r, ok in graded(samples, answers):
        a, b = map(int, r["prompt"].rstrip("=").split("+"))
        split[carries_into_hundreds(a, b)].append(ok)
    return [sum(v) / max(len(v), 1) for v in (split[True], split[False])]


def curve(method, run, per_step, start):
    """The greedy held-out accuracy of every checkpoint of `run` (and of the run `start` as step
    0), one TSV line each."""
    checkpoints = sorted(pathlib.Path(run, "checkpoints").glob("step-*.h5"))
    if not checkpoints:
        sys.exit(f"make_arith_task.py: {run}: no checkpoints/step-*.h5")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp, "samples.jsonl")
        if start:
            checkpoints.insert(0, max(pathlib.Path(start, "checkpoints").glob("step-*.h5")))
        for i, c in enumerate(checkpoints):
            subprocess.run([str(ROOT / "scripts" / "forge"), "generate", "--checkpoint", str(c),
                            "--prompts", str(DEFAULT_DIR / "test_prompts.txt"), "--temperature",
                            "0", "--max-new-tokens", "6", "--stop", "\n", "--output", str(out)],
                           check=True, stderr=subprocess.DEVNULL)
            step = int(re.search(r"step-(\d+)", c.name).group(1)) if i or not start else 0
            accuracy = exact_match(out, DEFAULT_DIR / "test.jsonl")[0]
            print(f"{method}\t{step * per_step}\t{accuracy:.4f}", flush=True)


def plot(tsv, svg):
    """Held-out exact match against training samples, one line per method, as an SVG."""
    series = {}
    with open(tsv, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                method, samples, accuracy = line.rstrip("\n").split("\t")
                series.setdefault(method, []).append((int(samples), float(accuracy)))
    W, H, left, right, top, bottom = 640, 400, 62, 170, 40, 50
    xhi = max(x for pts in series.values() for x, _ in pts)
    xstep = nice_step(xhi)
    xhi = -(-xhi // xstep) * xstep
    ys = [y for pts in series.values() for _, y in pts]
    ystep = 0.05
    ylo = max(0.0, int((min(ys) - 0.02) / ystep) * ystep)
    yhi = min(1.0, -(-(max(ys) + 0.02) // ystep) * ystep)
    X = lambda v: left + v / xhi * (W - left - right)
    Y = lambda v: H - bottom - (v - ylo) / (yhi - ylo) * (H - top - bottom)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{(W - right + left) / 2}" y="22" text-anchor="middle" font-size="14" '
         f'font-weight="bold">Held-out exact match (greedy, 1000 sums)</text>', '<g font-size="11">']
    for v in ticks(0, xhi, xstep):
        o.append(f'<line x1="{X(v):.1f}" y1="{top}" x2="{X(v):.1f}" y2="{H - bottom}" stroke="#e6e6e6"/>'
                 f'<text x="{X(v):.1f}" y="{H - bottom + 16}" text-anchor="middle">{fmt(v, xstep)}</text>')
    for v in ticks(ylo, yhi, ystep):
        o.append(f'<line x1="{left}" y1="{Y(v):.1f}" x2="{W - right}" y2="{Y(v):.1f}" stroke="#e6e6e6"/>'
                 f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{fmt(v, ystep)}</text>')
    o.append(f'<text x="{(W - right + left) / 2}" y="{H - 12}" text-anchor="middle">rows trained on '
             f'(completions or records)</text></g>')
    for i, (method, pts) in enumerate(series.items()):
        colour, shape = STYLES[i % len(STYLES)]
        pts.sort()
        path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
        o.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        o += [marker(shape, X(x), Y(y), colour, 3.5) for x, y in pts]
        ly = top + 10 + 18 * i
        o.append(marker(shape, W - right + 14, ly, colour, 4.5))
        o.append(f'<text x="{W - right + 24}" y="{ly + 4}" font-size="11">{escape(method)}</text>')
    o.append("</svg>")
    pathlib.Path(svg).write_text("\n".join(o) + "\n", encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_DIR)
    for name in ("score", "rft"):
        p = sub.add_parser(name)
        p.add_argument("samples")
        if name == "rft":
            p.add_argument("output")
        p.add_argument("--answers", default=str(DEFAULT_DIR / "test.jsonl"))
    p = sub.add_parser("curve")
    p.add_argument("method")
    p.add_argument("run")
    p.add_argument("per_step", type=int)
    p.add_argument("--start", help="the run it started from, scored as step 0")
    p = sub.add_parser("plot")
    p.add_argument("tsv")
    p.add_argument("svg")
    args = parser.parse_args()
    if args.command == "make":
        make(args.out)
    elif args.command == "score":
        accuracy, correct, samples = exact_match(args.samples, args.answers)
        carry, other = carry_split(args.samples, args.answers)
        print(f"exact_match={accuracy:.4f} correct={correct} samples={samples} "
              f"carry_into_hundreds={carry:.4f} other={other:.4f}")
    elif args.command == "curve":
        curve(args.method, args.run, args.per_step, args.start)
    elif args.command == "plot":
        plot(args.tsv, args.svg)
    else:
        kept = [{"prompt": r["prompt"], "completion": r["completion"].split("\n", 1)[0]}
                for r, ok in graded(args.samples, args.answers) if ok]
        write_jsonl(args.output, kept)
        print(f"rft: kept {len(kept)} correct samples", file=sys.stderr)


if __name__ == "__main__":
    main()
