#!/usr/bin/python3
"""Runs the cases scripts/make_hostile_cases.py wrote and checks forge's behaviour on each.

usage: run_hostile_cases.py FORGE BASE OUT [CATEGORY...]
A case passes when forge ends by itself within its timeout (no signal, no hang), with an exit code
the case allows (never 1: that is an internal error), with stderr holding exactly one error line
("forge: ..."; "forge: warning: ..." lines may precede it; none of it with control characters),
with every file the case names byte-identical afterwards, and the directories it names holding the
same files (no temp file left behind). A case that works on a copy of BASE/run may plant a FIFO or a
symlink in place of one of its files, or remove one, first. Prints a summary per category and
exits 1 when any case failed.
"""
import collections
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys

FORGE, BASE, OUT = sys.argv[1:4]
only = set(sys.argv[4:])
MAX_LINE = 2000


def digest(p):
    # Only regular files: opening a FIFO to hash it would block the runner itself.
    if not os.path.isfile(p):
        return "not a regular file"
    try:
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        return "unreadable: " + e.strerror


def check_stderr(code, err, config_lines):
    lines = [line for line in err.decode("utf-8", "replace").split("\n") if line != ""]
    errors = [line for line in lines if not line.startswith("forge: warning: ")]
    if code == 0:
        return None  # progress lines of a successful command go to stderr too
    # A config's errors are all reported at once, one line each (README.md); every other error
    # is one line, and so is a config error that one bad path caused (config_lines false).
    if (config_lines and len(errors) > 1
            and all(e.startswith("forge: config error: ") for e in errors)):
        errors = errors[-1:]
    if len(errors) != 1:
        return f"stderr has {len(errors)} error lines, expected 1"
    line = errors[0]
    if not line.startswith("forge: "):
        return "error line does not start with 'forge: '"
    if len(line) > MAX_LINE:
        return f"error line is {len(line)} characters"
    if any(ord(c) < 32 and c != "\t" or c == "\x7f" for c in line) or "\ufffd" in line:
        return "error line holds control characters or invalid UTF-8"
    return None


def limit_memory():
    # An input that makes forge read /dev/zero into memory must fail inside forge (bad_alloc, a
    # finding), not wake the kernel's OOM killer, which may pick any process on the machine.
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def plant(p, kind):
    """Puts something else in place of a file of the copied run: "absent" (removed), "fifo", or
    "symlink:TARGET"."""
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind.startswith("symlink:"):
        os.symlink(kind[len("symlink:"):], p)


def run_case(c, scratch):
    argv = [FORGE if a == "FORGE" else a for a in c["argv"]]
    unchanged = list(c["unchanged"])
    copy_root = None
    if c["copy_run"]:
        copy_root = os.path.join(scratch, "copy")
        shutil.rmtree(copy_root, ignore_errors=True)
        shutil.copytree(os.path.join(BASE, "run"), os.path.join(copy_root, "run"), symlinks=True)
        for rel, src in c["copy_run"]["replace"].items():
            shutil.copyfile(src, os.path.join(copy_root, rel))
        for rel, kind in c["copy_run"].get("plant", {}).items():
            plant(os.path.join(copy_root, rel), kind)
        unchanged += [os.path.join(copy_root, rel) for rel in c["copy_run"]["keep"]]
        argv = [os.path.join(BASE, "run.yaml") if a == "RUN.yaml" else a for a in argv]
        argv.append("output_dir=" + os.path.join(copy_root, "run"))
    metrics = os.path.join(copy_root, "run", "metrics.jsonl") if copy_root else None
    before = {p: digest(p) for p in unchanged + ([metrics] if metrics else [])}
    listings = {d: sorted(os.listdir(d)) for d in c.get("same_listing", [])}
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=c["timeout"], cwd=scratch,
                           preexec_fn=limit_memory)
        code, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        return f"timeout after {c['timeout']} s", (e.stderr or b"")
    problems = []
    if code < 0:
        problems.append(f"killed by signal {-code}")
    elif code not in c["allowed"]:
        problems.append(f"exit {code}, allowed {c['allowed']}")
    if code >= 0:
        s = check_stderr(code, err, c.get("config_lines", True))
        if s:
            problems.append(s)
    for path, d in before.items():
        if path == metrics and code == 0:
            continue  # a successful resume appends to its metrics
        if digest(path) != d:
            problems.append(f"modified: {path}")
    for d, names in listings.items():
        if sorted(os.listdir(d)) != names:
            problems.append(f"files added or removed in {d}")
    return ("; ".join(problems) or None), err


def main():
    cases = [json.loads(line) for line in open(os.path.join(OUT, "manifest.jsonl"))]
    if only:
        cases = [c for c in cases if c["category"] in only]
    scratch = os.path.join(OUT, "scratch")
    os.makedirs(scratch, exist_ok=True)
    stats = collections.OrderedDict()
    failures = collections.defaultdict(list)
    for c in sorted(cases, key=lambda c: c["category"]):
        problem, err = run_case(c, scratch)
        s = stats.setdefault(c["category"], [0, 0])
        s[0] += 1
        if problem:
            s[1] += 1
            first = err.decode("utf-8", "replace").strip().split("\n")[-3:]
            failures[c["category"]].append(f"{c['name']}: {problem} | stderr: {' / '.join(first)[:300]}")
    total = sum(s[0] for s in stats.values())
    failed = sum(s[1] for s in stats.values())
    print(f"{'category':28} {'cases':>6} {'passed':>7} {'failed':>7}")
    for cat, (n, f) in stats.items():
        print(f"{cat:28} {n:6} {n - f:7} {f:7}")
    print(f"{'total':28} {total:6} {total - failed:7} {failed:7}")
    with open(os.path.join(OUT, "failures.txt"), "w") as f:
        for cat, lines in failures.items():
            f.write("".join(f"{cat}: {line}\n" for line in lines))
    print(f"(every failure: {os.path.join(OUT, 'failures.txt')})")
    for cat, lines in failures.items():
        print(f"\n{cat}: {len(lines)} failed; first ones:")
        for line in lines[:5]:
            print("  " + line)
    sys.exit(1 if failed else 0)


main()
