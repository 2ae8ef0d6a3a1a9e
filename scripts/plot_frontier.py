#!/usr/bin/env python3
"""Reward-vs-KL frontier of the positive-Shakespeare task as a self-contained SVG.

The DPO paper's frontier figure, for this repository's preference task
(docs/recipes/preference.md): each point is one aligned policy, x its KL per token to the reference
(`kl_per_token` of `forge eval --prompts`, nats), y its lexicon win rate against the reference's
samples (`scripts/preference_task.py winrate`). The reference against itself wins half, ties
counting half, so 0.5 is drawn as a dashed line: the base's noise floor. Points of one method (dpo,
dpo-lora, ppo, ...) share a marker and colour and are joined in KL order; each is labelled with its
setting (e.g. "β=0.5", "kl=0.05").

Input: a tab-separated file with the header

    method  setting  kl_per_token  win_rate  text_loss

Lines starting with '#' are comments; text_loss may be empty (it only shows in a point's tooltip).

Python 3 standard library only:

    python3 scripts/plot_frontier.py [--input docs/recipes/frontier.tsv] [--output docs/recipes/frontier.svg]
"""

import argparse
import csv
import math
import sys
from xml.sax.saxutils import escape

COLUMNS = ["method", "setting", "kl_per_token", "win_rate", "text_loss"]

# Okabe-Ito colours (distinguishable with colour-blindness), one marker shape each.
STYLES = [
    ("#0072B2", "circle"),
    ("#D55E00", "square"),
    ("#009E73", "triangle"),
    ("#CC79A7", "diamond"),
    ("#E69F00", "triangle-down"),
    ("#56B4E9", "circle"),
    ("#000000", "square"),
]
# Fixed styles and legend names for the known methods, so a new method does not recolour them.
KNOWN = {
    "dpo": (0, "DPO (full fine-tune)"),
    "dpo-lora": (1, "DPO (LoRA)"),
    "ppo": (2, "PPO (fixed kl_coef)"),
    "ppo-adaptive": (3, "PPO (adaptive KL)"),
}

WIDTH, HEIGHT = 640, 420
LEFT, RIGHT, TOP, BOTTOM = 62, 20, 70, 50
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
CHAR_W = 6.2  # approximate advance of an 11 px sans-serif glyph, for label placement


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        lines = [l for l in f if l.strip() and not l.lstrip().startswith("#")]
    reader = csv.DictReader(lines, delimiter="\t")
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        sys.exit(f"{path}: missing column(s) {', '.join(missing)} (need {' '.join(COLUMNS)})")
    rows = []
    for n, r in enumerate(reader, start=2):
        try:
            kl = float(r["kl_per_token"])
            win = float(r["win_rate"])
        except (TypeError, ValueError):
            sys.exit(f"{path}: data row {n - 1}: kl_per_token and win_rate must be numbers")
        tl = (r.get("text_loss") or "").strip()
        rows.append({"method": r["method"].strip(), "setting": r["setting"].strip(),
                     "kl": kl, "win": win, "text_loss": tl})
    if not rows:
        sys.exit(f"{path}: no data rows")
    return rows


def nice_step(span, target=5):
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def ticks(lo, hi, step):
    out, k = [], math.ceil(lo / step - 1e-9)
    while k * step <= hi + 1e-9:
        out.append(round(k * step, 10))
        k += 1
    return out


def fmt(v, step):
    """v with as many decimals as the tick step needs (0.05 -> 2, 0.25 -> 2, 1 -> 0)."""
    decimals = len(f"{step:.6f}".rstrip("0").split(".")[1])
    return f"{v:.{decimals}f}"


def marker(shape, x, y, colour, r=5.0):
    a = f'fill="{colour}" stroke="white" stroke-width="1"'
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {a}/>'
    if shape == "square":
        s = r * 0.9
        return f'<rect x="{x - s:.1f}" y="{y - s:.1f}" width="{2 * s:.1f}" height="{2 * s:.1f}" {a}/>'
    if shape == "diamond":
        s = r * 1.25
        pts = [(x, y - s), (x + s, y), (x, y + s), (x - s, y)]
    elif shape == "triangle-down":
        s = r * 1.2
        pts = [(x - s, y - s * 0.8), (x + s, y - s * 0.8), (x, y + s)]
    else:  # triangle
        s = r * 1.2
        pts = [(x, y - s), (x + s, y + s * 0.8), (x - s, y + s * 0.8)]
    p = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
    return f'<polygon points="{p}" {a}/>'


def overlap(a, b):
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


def place_label(text, x, y, taken, box):
    """Greedy placement: the first of a few offsets whose box stays in the plot and clears the
    boxes already taken (labels and markers); else the least-overlapping one."""
    w, h = len(text) * CHAR_W, 11.0
    candidates = [  # (dx, dy of the text's anchor point, anchor)
        (8, -7, "start"), (8, 12, "start"), (-8, -7, "end"), (-8, 12, "end"),
        (0, -11, "middle"), (0, 19, "middle"), (10, 3, "start"), (-10, 3, "end"),
    ]
    best = None
    for dx, dy, anchor in candidates:
        x0 = x + dx - (w if anchor == "end" else w / 2 if anchor == "middle" else 0)
        b = (x0, y + dy - h + 2, x0 + w, y + dy + 2)
        inside = b[0] >= box[0] and b[2] <= box[2] and b[1] >= box[1] and b[3] <= box[3]
        hits = sum(overlap(b, t) for t in taken) + (0 if inside else 10)
        if best is None or hits < best[0]:
            best = (hits, x + dx, y + dy, anchor, b)
        if hits == 0:
            break
    taken.append(best[4])
    return best[1], best[2], best[3]


def plot(rows, title, subtitle):
    # Axes: x from 0 (the reference itself) or below, y spans 0.5 and the data.
    xs, ys = [r["kl"] for r in rows], [r["win"] for r in rows]
    xlo, xhi = min(0.0, min(xs)), max(xs)
    xstep = nice_step(max(xhi - xlo, 1e-3))
    xlo = math.floor(xlo / xstep) * xstep
    xhi = math.ceil(xhi * 1.08 / xstep) * xstep
    ylo, yhi = min(0.5, min(ys)), max(0.5, max(ys))
    ystep = nice_step(max(yhi - ylo, 0.1))
    ylo = max(0.0, math.floor((ylo - 0.02) / ystep) * ystep)
    yhi = min(1.0, math.ceil((yhi + 0.02) / ystep) * ystep)
    px0, px1, py0, py1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP

    def X(v):
        return px0 + (v - xlo) / (xhi - xlo) * (px1 - px0)

    def Y(v):
        return py0 - (v - ylo) / (yhi - ylo) * (py0 - py1)

    methods = []
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    # A method not in KNOWN takes the next style no known method owns.
    style, name = {}, {}
    free = [i for i in range(len(STYLES)) if i not in {k[0] for k in KNOWN.values()}]
    for m in methods:
        if m in KNOWN:
            idx, name[m] = KNOWN[m]
        else:
            idx, name[m] = (free.pop(0) if free else len(style) % len(STYLES)), m
        style[m] = STYLES[idx]

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
         f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}">',
         f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
         f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold" '
         f'fill="#222">{escape(title)}</text>']
    if subtitle:
        o.append(f'<text x="{WIDTH / 2}" y="39" text-anchor="middle" font-size="11" '
                 f'fill="#555">{escape(subtitle)}</text>')

    # Grid, ticks, tick labels.
    o.append('<g font-size="11" fill="#333">')
    for v in ticks(xlo, xhi, xstep):
        x = X(v)
        o.append(f'<line x1="{x:.1f}" y1="{py1}" x2="{x:.1f}" y2="{py0}" stroke="#e6e6e6"/>')
        o.append(f'<line x1="{x:.1f}" y1="{py0}" x2="{x:.1f}" y2="{py0 + 5}" stroke="#333"/>')
        o.append(f'<text x="{x:.1f}" y="{py0 + 18}" text-anchor="middle">{fmt(v, xstep)}</text>')
    for v in ticks(ylo, yhi, ystep):
        y = Y(v)
        o.append(f'<line x1="{px0}" y1="{y:.1f}" x2="{px1}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        o.append(f'<line x1="{px0 - 5}" y1="{y:.1f}" x2="{px0}" y2="{y:.1f}" stroke="#333"/>')
        o.append(f'<text x="{px0 - 8}" y="{y + 4:.1f}" text-anchor="end">{fmt(v, ystep)}</text>')
    o.append('</g>')
    o.append(f'<rect x="{px0}" y="{py1}" width="{px1 - px0}" height="{py0 - py1}" fill="none" '
             f'stroke="#333"/>')
    o.append(f'<text x="{(px0 + px1) / 2}" y="{HEIGHT - 12}" text-anchor="middle" font-size="12" '
             f'fill="#222">KL per token to the reference (nats)</text>')
    o.append(f'<text transform="translate(16 {(py0 + py1) / 2}) rotate(-90)" text-anchor="middle" '
             f'font-size="12" fill="#222">lexicon win rate against the reference</text>')

    taken = []  # boxes labels must avoid
    if ylo <= 0.5 <= yhi:
        y = Y(0.5)
        o.append(f'<line x1="{px0}" y1="{y:.1f}" x2="{px1}" y2="{y:.1f}" stroke="#777" '
                 f'stroke-width="1.2" stroke-dasharray="6 4"/>')
        t = "base = reference (0.5)"
        o.append(f'<text x="{px1 - 6}" y="{y - 5:.1f}" text-anchor="end" font-size="10.5" '
                 f'fill="#666">{t}</text>')
        taken.append((px1 - 6 - len(t) * 5.9, y - 15, px1 - 6, y - 2))

    # Lines first, then markers, then labels, so nothing hides a marker.
    pts = {m: sorted((r for r in rows if r["method"] == m), key=lambda r: r["kl"]) for m in methods}
    for m in methods:
        if len(pts[m]) > 1:
            p = " ".join(f"{X(r['kl']):.1f},{Y(r['win']):.1f}" for r in pts[m])
            o.append(f'<polyline points="{p}" fill="none" stroke="{style[m][0]}" '
                     f'stroke-width="1.6" stroke-opacity="0.7"/>')
    for m in methods:
        for r in pts[m]:
            x, y = X(r["kl"]), Y(r["win"])
            taken.append((x - 6, y - 6, x + 6, y + 6))
            tip = (f"{name[m]} {r['setting']}: KL/token {r['kl']:g}, win rate {r['win']:g}"
                   + (f", text loss {r['text_loss']}" if r["text_loss"] else ""))
            o.append(f'<g><title>{escape(tip)}</title>{marker(style[m][1], x, y, style[m][0])}</g>')
    box = (px0 + 2, py1 + 2, px1 - 2, py0 - 2)
    for m in methods:
        for r in pts[m]:
            lx, ly, anchor = place_label(r["setting"], X(r["kl"]), Y(r["win"]), taken, box)
            o.append(f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}" font-size="11" '
                     f'fill="{style[m][0]}" stroke="white" stroke-width="3" paint-order="stroke">'
                     f'{escape(r["setting"])}</text>')

    # Legend: one row above the plot, centred.
    items = [(m, name[m]) for m in methods]
    widths = [26 + len(n) * 6.3 + 16 for _, n in items]
    x = (WIDTH - sum(widths)) / 2
    y = TOP - 14
    for (m, n), w in zip(items, widths):
        c, shape = style[m]
        o.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x + 20:.1f}" y2="{y}" stroke="{c}" '
                 f'stroke-width="1.6"/>')
        o.append(marker(shape, x + 10, y, c, 4.5))
        o.append(f'<text x="{x + 26:.1f}" y="{y + 4}" font-size="11.5" fill="#222">{escape(n)}</text>')
        x += w
    o.append('</svg>')
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", default="docs/recipes/frontier.tsv")
    ap.add_argument("--output", default="docs/recipes/frontier.svg")
    ap.add_argument("--title", default="Positive Shakespeare: win rate vs KL to the reference")
    ap.add_argument("--subtitle", default="500 held-out prompts x 8 samples of 96 bytes, "
                    "temperature 1, seed 2; win rate by lexicon score, ties half")
    args = ap.parse_args()
    svg = plot(read_rows(args.input), args.title, args.subtitle)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
