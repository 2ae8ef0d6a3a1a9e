#!/usr/bin/env python3
"""Builds data/samples/fortunes_chat.jsonl, the multi-turn SFT sample: conversations
{"messages": [...]} made of the fortunes of data/samples/fortunes_sft.jsonl. A conversation asks
for a category ("u: science"), is answered with a fortune of it and, when the two fit, asks for
"another" and gets the next fortune of the category; every fourth one opens with a system
message. data/samples/fortunes_chat.jinja renders them (a user turn "u: TEXT\\n", a system one
"s: TEXT\\n", a reply "TEXT\\n%\\n", the fortune files' separator), and a conversation is kept
only when its render fits 129 bytes, a row of the byte-level GPT with context 128 that
configs/gpt_fortunes_chat.yaml fine-tunes (configs/gpt_shakespeare_policy.yaml). At most
PER_CATEGORY conversations a category.
Deterministic: run it again and the file is byte-identical.

    python3 scripts/make_fortunes_chat.py            # from the repository root
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "data" / "samples" / "fortunes_sft.jsonl"
OUTPUT = ROOT / "data" / "samples" / "fortunes_chat.jsonl"
ROW_BYTES = 129
PER_CATEGORY = 40
SYSTEM = "Fortunes only."


def rendered_bytes(messages):
    """The length of data/samples/fortunes_chat.jinja's render of `messages`."""
    size = 0
    for m in messages:
        if m["role"] == "assistant":
            text = m["content"] + "\n%\n"
        else:
            text = m["role"][0] + ": " + m["content"] + "\n"
        size += len(text.encode())
    return size


def main():
    by_category = {}
    for line in SOURCE.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        by_category.setdefault(record["prompt"].rstrip(": "), []).append(record["completion"])
    conversations = []
    for category, fortunes in by_category.items():
        kept, i = 0, 0
        while kept < PER_CATEGORY and i < len(fortunes):
            ask = [{"role": "user", "content": category}]
            if len(conversations) % 4 == 3:
                ask.insert(0, {"role": "system", "content": SYSTEM})
            one = ask + [{"role": "assistant", "content": fortunes[i]}]
            two = one[:]
            if i + 1 < len(fortunes):
                two += [{"role": "user", "content": "another"},
                        {"role": "assistant", "content": fortunes[i + 1]}]
            chosen = two if len(two) > len(one) and rendered_bytes(two) <= ROW_BYTES else one
            i += len(chosen) // 2
            if rendered_bytes(chosen) <= ROW_BYTES:
                conversations.append({"messages": chosen})
                kept += 1
    with open(OUTPUT, "w", encoding="utf-8", newline="\n") as out:
        for c in conversations:
            out.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"{OUTPUT.relative_to(ROOT)}: {len(conversations)} conversations")


if __name__ == "__main__":
    main()
