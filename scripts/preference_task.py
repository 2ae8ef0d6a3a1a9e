#!/usr/bin/env python3
"""The positive-Shakespeare preference task (docs/recipes/preference.md): a task whose true
preference a program scores, so reward models and DPO can be trained and judged without human data.
A completion's score is its positive minus negative lexicon hits (data/samples/preference/); this
file extracts the prompts, scores `forge generate` samples, builds TRL-format pairs and compares two
models' samples. Python 3 standard library only, deterministic.

    python3 scripts/preference_task.py lexicon             # word counts in the train split, checks
    python3 scripts/preference_task.py prompts             # writes prompts_{train,val}.jsonl
    python3 scripts/preference_task.py score SAMPLES.jsonl
    python3 scripts/preference_task.py pairs SAMPLES.jsonl --output PAIRS.jsonl
    python3 scripts/preference_task.py winrate POLICY.jsonl REFERENCE.jsonl

Exit codes are Forge's: 2 a usage error, 3 a data error (one line naming file:line).
"""
import argparse
import collections
import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "samples" / "tinyshakespeare.txt"
TASK_DIR = ROOT / "data" / "samples" / "preference"
VAL_FRACTION = 0.1        # configs/gpt_shakespeare_policy.yaml's data.val_fraction
CONTEXT = 128             # the policy's context: prompt bytes + --max-new-tokens must fit
MAX_PROMPT_BYTES = 32     # leaves 96 completion bytes
MAX_PROMPT_WORDS = 4      # words of the speech after the speaker line
TRAIN_PROMPTS = 4000
VAL_PROMPTS = 500
MIN_WORD_COUNT = 10       # a lexicon word occurs at least this often in the train split's speech

WORD = re.compile(r"[A-Za-z]+")
SPEAKER = re.compile(r"[A-Z][A-Za-z' ]*:")
# Fields of a `forge generate --output` record (docs/generate.md), and the types each must have.
RECORD_FIELDS = {"prompt": str, "prompt_index": int, "sample_index": int, "completion": str,
                 "tokens": list, "logprob": (int, float), "finished": bool}
REQUIRED_FIELDS = ("prompt", "prompt_index", "sample_index", "completion")


class DataError(Exception):
    """Bad input data: main prints one line and exits 3."""


class UsageError(Exception):
    """Options that do not fit the data: main prints one line and exits 2."""


# --------------------------------------------------------------------------------------------
# The corpus split and the lexicon

def split_corpus(path=CORPUS, val_fraction=VAL_FRACTION):
    """(train, val) text, split as Forge's split_by_position (data/lm_data.cpp) splits the bytes:
    the last floor(n * val_fraction) bytes are the validation split."""
    data = path.read_bytes()
    n_val = int(len(data) * val_fraction)
    return data[:len(data) - n_val].decode("utf-8"), data[len(data) - n_val:].decode("utf-8")


def read_words(path):
    """A word list: one lowercase word a line; '#' starts a comment; blank lines skipped."""
    words = []
    seen = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read: {e}")
    for number, line in enumerate(lines, 1):
        word = line.split("#", 1)[0].strip()
        if not word:
            continue
        if not re.fullmatch(r"[a-z]+", word):
            raise DataError(f"{path}:{number}: {word!r} is not a word of lowercase letters a-z")
        if word in seen:
            raise DataError(f"{path}:{number}: {word!r} repeats line {seen[word]}")
        seen[word] = number
        words.append(word)
    if not words:
        raise DataError(f"{path}: no words")
    return words


class Lexicon:
    """Positive and negative words; score = positive hits - negative hits."""

    def __init__(self, directory=TASK_DIR):
        directory = pathlib.Path(directory)
        self.positive = read_words(directory / "positive.txt")
        self.negative = read_words(directory / "negative.txt")
        both = sorted(set(self.positive) & set(self.negative))
        if both:
            raise DataError(f"{directory}: in both positive.txt and negative.txt: {', '.join(both)}")
        self.sign = {w: 1 for w in self.positive}
        self.sign.update({w: -1 for w in self.negative})

    def hits(self, prompt, completion):
        """(positive words, negative words) of completion, in order. A word counts when it lies
        wholly inside the completion: not one continuing the prompt's last word, not one reaching
        the completion's last byte (a sample cut at --max-new-tokens may end mid-word)."""
        pos, neg = [], []
        continues_prompt = bool(prompt) and prompt[-1].isascii() and prompt[-1].isalpha()
        for m in WORD.finditer(completion):
            if (m.start() == 0 and continues_prompt) or m.end() == len(completion):
                continue
            sign = self.sign.get(m.group().lower(), 0)
            if sign > 0:
                pos.append(m.group().lower())
            elif sign < 0:
                neg.append(m.group().lower())
        return pos, neg

    def score(self, prompt, completion):
        pos, neg = self.hits(prompt, completion)
        return len(pos) - len(neg)


def speech_words(text):
    """Lowercase words of text's speech, speaker lines ("ROMEO:") left out."""
    words = []
    for line in text.splitlines():
        if not SPEAKER.fullmatch(line):
            words.extend(w.lower() for w in WORD.findall(line))
    return words


# --------------------------------------------------------------------------------------------
# Prompts: openings of speaker turns

def turn_openings(text, max_bytes, max_words):
    """The opening of each speaker turn of text: the speaker line "NAME:\\n" and the first words
    (at most max_words, whole words split at spaces) of the speech's first line that keep it within
    max_bytes. A turn is a speaker line after a blank line (or at the text's start) followed by a
    non-blank line. Returns the prompts in text order."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if i + 1 >= len(lines) or not SPEAKER.fullmatch(line) or not lines[i + 1].strip():
            continue
        if i > 0 and lines[i - 1] != "":
            continue
        prompt = line + "\n"
        if len(prompt.encode("utf-8")) > max_bytes:
            continue
        taken = 0
        for word in lines[i + 1].split(" "):
            if not word or taken == max_words:
                break
            longer = prompt + ("" if taken == 0 else " ") + word
            if len(longer.encode("utf-8")) > max_bytes:
                break
            prompt, taken = longer, taken + 1
        out.append(prompt)
    return out


def choose(items, count):
    """count items spread evenly over the list (all of them when there are no more)."""
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def cmd_prompts(args):
    train, val = split_corpus(args.corpus, args.val_fraction)
    out_dir = pathlib.Path(args.out_dir)
    for name, text, count in (("train", train, args.train_count), ("val", val, args.val_count)):
        openings = turn_openings(text, args.max_prompt_bytes, args.max_words)
        unique, seen = [], set()
        for prompt in openings:
            if prompt not in seen:
                seen.add(prompt)
                unique.append(prompt)
        chosen = choose(unique, count)
        path = out_dir / f"prompts_{name}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for prompt in chosen:
                f.write(json.dumps({"prompt": prompt}, ensure_ascii=False) + "\n")
        lengths = [len(p.encode("utf-8")) for p in chosen]
        print(f"{name}: {len(openings)} speaker turns, {len(unique)} distinct openings, "
              f"{len(chosen)} written to {path} (prompt bytes {min(lengths)}..{max(lengths)}, "
              f"mean {sum(lengths) / len(lengths):.1f}; --max-new-tokens up to "
              f"{CONTEXT - max(lengths)} fits context {CONTEXT})")


def cmd_lexicon(args):
    lex = Lexicon(args.lexicon)
    train, _ = split_corpus(args.corpus, args.val_fraction)
    counts = collections.Counter(speech_words(train))
    bad = False
    for name, words in (("positive", lex.positive), ("negative", lex.negative)):
        ranked = sorted(words, key=lambda w: (-counts[w], w))
        total = sum(counts[w] for w in words)
        print(f"{name}: {len(words)} words, {total} occurrences in the train split's speech")
        print("  " + ", ".join(f"{w} {counts[w]}" for w in ranked))
        rare = [w for w in words if counts[w] < args.min_count]
        if rare:
            bad = True
            print(f"  below --min-count {args.min_count}: {', '.join(rare)}")
    # The same score on real text: windows of the train split's speech as long as a completion.
    lines = [l for l in train.split("\n") if not SPEAKER.fullmatch(l)]
    speech = "\n".join(lines)
    n = args.window
    scores = [lex.score("", speech[i:i + n]) for i in range(0, len(speech) - n, n)]
    hit = sum(1 for i in range(0, len(speech) - n, n) if any(lex.hits("", speech[i:i + n])))
    print(f"train speech in {len(scores)} windows of {n} bytes: mean score "
          f"{sum(scores) / len(scores):+.3f}, {hit / len(scores):.1%} with a lexicon word")
    print("  score histogram: " + histogram(scores))
    if bad:
        raise DataError(f"{args.lexicon}: words below --min-count {args.min_count}")


# --------------------------------------------------------------------------------------------
# Reading `forge generate` output

def reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def object_pairs(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise ValueError(f"duplicate field {k!r}")
    return dict(pairs)


def read_samples(path):
    """The records of a `forge generate --output` file, checked: returns a list of prompts, each
    (prompt text, [completion of sample 0, ..., sample K-1]). Every prompt must have the same K
    samples 0..K-1 and prompt indices must run 0..P-1."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8")
    prompts = {}      # prompt_index -> (prompt, {sample_index: completion}, first line)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"{path}: empty file (no samples)")
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        if not line.strip():
            raise DataError(f"{where}: blank line (a sample record is one JSON object a line)")
        try:
            record = json.loads(line, object_pairs_hook=object_pairs,
                                parse_constant=reject_constant)
        except ValueError as e:
            raise DataError(f"{where}: not valid JSON: {e}")
        if not isinstance(record, dict):
            raise DataError(f"{where}: not a JSON object")
        for key in record:
            if key not in RECORD_FIELDS:
                raise DataError(f"{where}: unknown field {key!r} (a forge generate record has "
                                f"{', '.join(RECORD_FIELDS)})")
        for key in REQUIRED_FIELDS:
            if key not in record:
                raise DataError(f"{where}: missing field {key!r}")
        for key, kind in RECORD_FIELDS.items():
            value = record.get(key)
            if key in record and (not isinstance(value, kind) or
                                  (kind is int and isinstance(value, bool))):
                raise DataError(f"{where}: field {key!r} is {json.dumps(value)[:40]}, "
                                f"not {getattr(kind, '__name__', 'a number')}")
        p, s = record["prompt_index"], record["sample_index"]
        if p < 0 or s < 0:
            raise DataError(f"{where}: negative {'prompt_index' if p < 0 else 'sample_index'}")
        if not record["prompt"]:
            raise DataError(f"{where}: empty prompt")
        entry = prompts.setdefault(p, (record["prompt"], {}, number))
        if entry[0] != record["prompt"]:
            raise DataError(f"{where}: prompt_index {p} has another prompt than on line {entry[2]}")
        if s in entry[1]:
            raise DataError(f"{where}: prompt {p} sample {s} appears twice")
        entry[1][s] = record["completion"]
    out = []
    k = None
    for p in range(len(prompts)):
        if p not in prompts:
            raise DataError(f"{path}: prompt_index {p} has no samples (indices must run 0.."
                            f"{len(prompts) - 1})")
        prompt, samples, first = prompts[p]
        if k is None:
            k = len(samples)
        if sorted(samples) != list(range(k)):
            raise DataError(f"{path}:{first}: prompt {p} has samples {sorted(samples)[:10]}, "
                            f"expected 0..{k - 1} like prompt 0")
        out.append((prompt, [samples[s] for s in range(k)]))
    return out


# --------------------------------------------------------------------------------------------
# Scores, pairs, win rates

def histogram(values):
    counts = collections.Counter(values)
    return " ".join(f"{v:+d}:{counts[v]}" for v in range(min(values), max(values) + 1))


def summary(name, lex, prompts):
    """Mean score and hit statistics of a sample file, as lines of text."""
    scores, pos, neg, any_hit, replaced = [], 0, 0, 0, 0
    for prompt, completions in prompts:
        for c in completions:
            p, n = lex.hits(prompt, c)
            scores.append(len(p) - len(n))
            pos, neg = pos + len(p), neg + len(n)
            any_hit += bool(p or n)
            replaced += "\ufffd" in c
    total = len(scores)
    return [
        f"{name}: {len(prompts)} prompts x {total // len(prompts)} samples",
        f"  mean score {sum(scores) / total:+.3f} (positive hits {pos / total:.3f}, negative "
        f"{neg / total:.3f} a sample); {any_hit / total:.1%} of samples hit a lexicon word"
        + (f"; {replaced} hold U+FFFD (bytes that were not UTF-8)" if replaced else ""),
        f"  score histogram: {histogram(scores)}",
    ]


def cmd_score(args):
    """The TSV of every sample's score to --output or stdout, then the summary (to stderr when the
    TSV is on stdout, so that it can be piped)."""
    lex = Lexicon(args.lexicon)
    prompts = read_samples(args.samples)
    lines = summary(args.samples, lex, prompts)
    if args.summary:
        print("\n".join(lines))
        return
    out = open(args.output, "w", encoding="utf-8", newline="\n") if args.output else sys.stdout
    print("prompt_index\tsample_index\tscore\tpositive\tnegative", file=out)
    for p, (prompt, completions) in enumerate(prompts):
        for s, c in enumerate(completions):
            pos, neg = lex.hits(prompt, c)
            print(f"{p}\t{s}\t{len(pos) - len(neg)}\t{','.join(pos)}\t{','.join(neg)}", file=out)
    if out is sys.stdout:
        print("\n".join(lines), file=sys.stderr)
    else:
        out.close()
        print("\n".join(lines))


def cmd_pairs(args):
    """For each prompt: its samples ranked by score, highest first (equal scores by sample index);
    pair i is (the i-th from the top as chosen, the i-th from the bottom as rejected), for i below
    --per-prompt, kept when its scores differ by at least --min-margin. With the default 1 pair a
    prompt that is its best sample against its worst, and a prompt whose samples all score the same
    (a tie) gives none. --all-pairs instead keeps every two samples whose scores differ by at least
    --min-margin, higher as chosen (InstructGPT's K-choose-2 comparisons a prompt), in sample
    order."""
    lex = Lexicon(args.lexicon)
    prompts = read_samples(args.samples)
    k = len(prompts[0][1])
    if not args.all_pairs and args.per_prompt > k // 2:
        raise UsageError(f"{args.samples}: --per-prompt {args.per_prompt} needs at least "
                        f"{2 * args.per_prompt} samples a prompt, the file has {k}")
    lines = summary(args.samples, lex, prompts)
    pairs, ties, short, margins = [], 0, 0, []
    for prompt, completions in prompts:
        s = [lex.score(prompt, c) for c in completions]
        ranked = sorted(range(k), key=lambda i: (-s[i], i))
        if s[ranked[0]] == s[ranked[-1]]:
            ties += 1
            continue
        if args.rankings:
            pairs.append({"prompt": prompt, "completions": completions, "scores": s})
            margins.extend(abs(s[i] - s[j]) for i in range(k) for j in range(i + 1, k)
                           if abs(s[i] - s[j]) >= args.min_margin)
            continue
        if args.all_pairs:
            for i in range(k):
                for j in range(i + 1, k):
                    if abs(s[i] - s[j]) < args.min_margin:
                        continue
                    hi, lo = (i, j) if s[i] > s[j] else (j, i)
                    pairs.append({"prompt": prompt, "chosen": completions[hi],
                                  "rejected": completions[lo]})
                    margins.append(s[hi] - s[lo])
            continue
        for i in range(args.per_prompt):
            hi, lo = ranked[i], ranked[k - 1 - i]
            if s[hi] - s[lo] < args.min_margin:    # pairs further in are no wider
                short += i == 0
                break
            pairs.append({"prompt": prompt, "chosen": completions[hi],
                          "rejected": completions[lo]})
            margins.append(s[hi] - s[lo])
    tmp = pathlib.Path(str(args.output) + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    tmp.replace(args.output)
    written = (f"ranked records: {len(pairs)} ({len(margins)} pairs)" if args.rankings
               else f"pairs: {len(pairs)}")
    lines.append(f"  {written} written to {args.output}; {ties} prompts dropped as ties "
                 f"(all samples score the same)"
                 + (f", {short} whose best and worst differ by less than {args.min_margin}"
                    if short else ""))
    if margins:
        lines.append(f"  pair margin (chosen - rejected): mean {sum(margins) / len(margins):.2f}, "
                     f"histogram {histogram(margins)}")
    print("\n".join(lines))


def distinct2(completions):
    """(bytes, words) distinct-2. Words: Li et al. (2016)'s corpus-level ratio, distinct bigrams of
    whitespace-separated words over all bigrams of all completions (bigrams do not cross
    completions). Bytes: the mean over completions of each one's distinct byte bigrams / byte
    bigrams, which falls when a sample repeats itself (over a whole file byte bigrams saturate:
    the base policy's 4000 validation samples hold nearly every bigram Shakespeare uses, 0.005)."""
    word_bigrams, byte_ratios = [], []
    for c in completions:
        b = c.encode("utf-8")
        if len(b) > 1:
            byte_ratios.append(len(set(zip(b, b[1:]))) / (len(b) - 1))
        w = c.split()
        word_bigrams.extend(zip(w, w[1:]))
    words = len(set(word_bigrams)) / len(word_bigrams) if word_bigrams else math.nan
    return (sum(byte_ratios) / len(byte_ratios) if byte_ratios else math.nan), words


def cmd_winrate(args):
    lex = Lexicon(args.lexicon)
    policy = read_samples(args.policy)
    reference = read_samples(args.reference)
    if len(policy) != len(reference):
        raise DataError(f"{args.policy} has {len(policy)} prompts, {args.reference} "
                        f"{len(reference)}: sample the same prompt file")
    win = tie = loss = 0
    for p, ((pp, pc), (rp, rc)) in enumerate(zip(policy, reference)):
        if pp != rp:
            raise DataError(f"prompt {p} differs: {args.policy} has {json.dumps(pp)[:40]}, "
                            f"{args.reference} {json.dumps(rp)[:40]}")
        if len(pc) != len(rc):
            raise DataError(f"{args.policy} has {len(pc)} samples a prompt, {args.reference} "
                            f"{len(rc)}: sample both with the same --num-samples")
        for a, b in zip(pc, rc):
            sa, sb = lex.score(pp, a), lex.score(rp, b)
            win, tie, loss = win + (sa > sb), tie + (sa == sb), loss + (sa < sb)
    n = win + tie + loss
    result = {"prompts": len(policy), "samples": n, "win": win, "tie": tie, "loss": loss,
              "win_rate": (win + 0.5 * tie) / n}
    for name, prompts in (("policy", policy), ("reference", reference)):
        scores = [lex.score(prompt, c) for prompt, cs in prompts for c in cs]
        d_bytes, d_words = distinct2([c for _, cs in prompts for c in cs])
        result[name] = {"mean_score": sum(scores) / len(scores), "distinct2_bytes": d_bytes,
                        "distinct2_words": d_words}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{n} sample pairs over {len(policy)} prompts (sample i of a prompt against sample i)")
    print(f"win rate of policy over reference {result['win_rate']:.3f} (win {win}, tie {tie} "
          f"counting half, loss {loss})")
    for name in ("policy", "reference"):
        r = result[name]
        print(f"{name:9s}: mean score {r['mean_score']:+.3f}, distinct-2 bytes "
              f"{r['distinct2_bytes']:.3f}, words {r['distinct2_words']:.3f}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Commands and the numbers they gave: docs/recipes/preference.md.")
    parser.add_argument("--lexicon", default=TASK_DIR, type=pathlib.Path,
                        help="directory holding positive.txt and negative.txt (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)

    def corpus_args(p):
        p.add_argument("--corpus", default=CORPUS, type=pathlib.Path,
                       help="the text the policy was trained on (default %(default)s)")
        p.add_argument("--val-fraction", default=VAL_FRACTION, type=float,
                       help="the last floor(bytes x this) bytes are validation (default "
                            "%(default)s, as data.val_fraction)")

    p = sub.add_parser("lexicon", help="each lexicon word's count in the train split's speech, "
                       "and the score of real text")
    corpus_args(p)
    p.add_argument("--min-count", type=int, default=MIN_WORD_COUNT,
                   help="fail (exit 3) if a word occurs fewer times (default %(default)s)")
    p.add_argument("--window", type=int, default=CONTEXT - MAX_PROMPT_BYTES,
                   help="bytes of real text to score at a time (default %(default)s)")
    p.set_defaults(run=cmd_lexicon)

    p = sub.add_parser("prompts", help="write prompts_train.jsonl and prompts_val.jsonl: "
                       "openings of speaker turns of each split")
    corpus_args(p)
    p.add_argument("--out-dir", default=TASK_DIR, type=pathlib.Path,
                   help="default %(default)s")
    p.add_argument("--max-prompt-bytes", type=int, default=MAX_PROMPT_BYTES,
                   help="default %(default)s (prompt + --max-new-tokens must fit the context)")
    p.add_argument("--max-words", type=int, default=MAX_PROMPT_WORDS,
                   help="words of the speech after the speaker line (default %(default)s)")
    p.add_argument("--train-count", type=int, default=TRAIN_PROMPTS,
                   help="train prompts, spread evenly over the split (default %(default)s)")
    p.add_argument("--val-count", type=int, default=VAL_PROMPTS, help="default %(default)s")
    p.set_defaults(run=cmd_prompts)

    p = sub.add_parser("score", help="each sample's score: prompt_index, sample_index, score, "
                       "positive and negative words (TSV), then a summary")
    p.add_argument("samples", help="a forge generate --output file")
    p.add_argument("--output", help="write the TSV here instead of stdout")
    p.add_argument("--summary", action="store_true", help="print only the summary")
    p.set_defaults(run=cmd_score)

    p = sub.add_parser("pairs", help="TRL pairs {prompt, chosen, rejected}: per prompt its best "
                       "sample against its worst, ties dropped")
    p.add_argument("samples", help="a forge generate --output file")
    p.add_argument("--output", required=True, type=pathlib.Path, help="the pairs JSONL")
    p.add_argument("--per-prompt", type=int, default=1,
                   help="pairs a prompt at most, each sample in one pair (default %(default)s: "
                        "best against worst)")
    p.add_argument("--all-pairs", action="store_true",
                   help="every two samples of a prompt that score differently (InstructGPT's "
                        "K-choose-2 comparisons) instead of --per-prompt")
    p.add_argument("--rankings", action="store_true",
                   help="one ranked record {prompt, completions, scores} a prompt that is not a "
                        "tie, which Forge reads as the --all-pairs pairs (a quarter of the size)")
    p.add_argument("--min-margin", type=int, default=1,
                   help="drop pairs whose scores differ by less (default %(default)s)")
    p.set_defaults(run=cmd_pairs)

    p = sub.add_parser("winrate", help="policy against reference samples of the same prompts: "
                       "mean scores, win rate (ties half), distinct-2")
    p.add_argument("policy", help="forge generate --output of the policy")
    p.add_argument("reference", help="forge generate --output of the reference, same prompts "
                   "and --num-samples")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=cmd_winrate)

    args = parser.parse_args()
    if getattr(args, "min_margin", 1) < 1:
        parser.error(f"--min-margin must be at least 1, got {args.min_margin}")
    for name in ("max_prompt_bytes", "max_words", "train_count", "val_count", "window",
                 "per_prompt"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0 <= getattr(args, "val_fraction", 0) < 1:
        parser.error(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    try:
        args.run(args)
    except DataError as e:
        print(f"preference_task.py: data error: {e}", file=sys.stderr)
        sys.exit(3)
    except UsageError as e:
        print(f"preference_task.py: usage error: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
