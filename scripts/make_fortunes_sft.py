#!/usr/bin/env python3
"""Builds data/samples/fortunes_sft.jsonl, the instruction (SFT) sample: one record per fortune,
{"prompt": "<category>: ", "completion": "<fortune>"}, from data/samples/fortunes/*.txt.

The model it fine-tunes is a byte-level GPT with context 64, so a record is kept only when its
prompt bytes + completion bytes + 1 (the end-of-text "\\n") fit in 64. Categories with fewer than
MIN_PER_CATEGORY such records are dropped, except those in THRESHOLD_OVERRIDES; each category keeps
at most MAX_PER_CATEGORY records (the first ones in file order). Deterministic: run it again and the
file is byte-identical.

    python3 scripts/make_fortunes_sft.py            # from the repository root
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "data" / "samples" / "fortunes"
OUTPUT = ROOT / "data" / "samples" / "fortunes_sft.jsonl"
CONTEXT = 64
END_OF_TEXT = b"\n"
MIN_PER_CATEGORY = 40
MAX_PER_CATEGORY = 150
# Categories kept with a lower minimum (none needed: science passes the default one).
THRESHOLD_OVERRIDES = {}


def records(text):
    """Records of a fortune file: text between lines holding only '%', blank ones dropped."""
    current = []
    for line in text.split("\n"):
        if line == "%":
            yield "\n".join(current)
            current = []
        else:
            current.append(line)
    yield "\n".join(current)


def main():
    kept = {}
    for path in sorted(SOURCE.glob("*.txt")):
        category = path.stem
        prompt = category + ": "
        rows = []
        for record in records(path.read_text(encoding="utf-8", errors="strict")):
            completion = record.rstrip()
            if not completion.strip():
                continue
            size = len(prompt.encode()) + len(completion.encode()) + len(END_OF_TEXT)
            if size <= CONTEXT:
                rows.append({"prompt": prompt, "completion": completion})
        if len(rows) >= THRESHOLD_OVERRIDES.get(category, MIN_PER_CATEGORY):
            kept[category] = rows[:MAX_PER_CATEGORY]

    with open(OUTPUT, "w", encoding="utf-8", newline="\n") as out:
        for rows in kept.values():
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")

    total = sum(len(rows) for rows in kept.values())
    print(f"{OUTPUT.relative_to(ROOT)}: {total} records in {len(kept)} categories")
    for category, rows in kept.items():
        print(f"  {category:20s} {len(rows):4d}")
    if "science" not in kept:
        print("warning: no science category", file=sys.stderr)


if __name__ == "__main__":
    main()
