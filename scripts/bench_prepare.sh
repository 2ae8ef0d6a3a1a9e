#!/usr/bin/env bash
# The prepare half of `scripts/bench data`: `forge prepare --tokenizer gpt2` on about 1 GB of text
# with OMP_NUM_THREADS=1 and 2 (the encoding threads, the main thread among them, which also
# writes; the reader is a thread of its own), each --repeats times alternately, and prints the
# median of each, then the ratio:
#   prepare threads=1 mb_s=X tokens_s=Y seconds=S max_rss_mb=M
#   prepare threads=2 mb_s=X tokens_s=Y seconds=S max_rss_mb=M
#   prepare speedup=X2/X1 target=1.8
# after a line with the CPU, the core count and the load average. The text is the paragraphs of
# data/samples (Tiny Shakespeare, the fortunes) shuffled with a fixed seed into 8 files of '%'
# records (--records percent), so documents vary in length and no file is one repeated block.
# MB/s = 1e6 input bytes per second of the whole command (reading, encoding, writing the .h5).
# The ratio means something only on an otherwise idle machine: a load above the core count is a
# warning line.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  cat <<'EOF'
usage: scripts/bench_prepare.sh [--repeats N] [--mb N] [--shard-tokens N]

  --repeats N       runs per thread count, the median reported; default 3
  --mb N            text size in MB (1e6 bytes); default 1000
  --shard-tokens N  write a shard directory (forge prepare --shard-tokens) instead of one file
EOF
}

bad_usage() { echo "bench_prepare: $1" >&2; usage >&2; exit 2; }
repeats=3
mb=1000
shard_tokens=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --repeats | --mb | --shard-tokens)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      v="${1#--}"
      declare "${v//-/_}=$2"
      shift 2
      ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || bad_usage "--repeats wants N >= 1, got '$repeats'"
[[ "$mb" =~ ^[1-9][0-9]*$ ]] || bad_usage "--mb wants N >= 1, got '$mb'"

forge_build forge
forge_install_missing time

tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_prepare.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$FORGE_ROOT/data/samples" "$tmp" "$mb" <<'PY'
import glob, os, random, sys
samples, out, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
paragraphs = []
with open(os.path.join(samples, "tinyshakespeare.txt"), encoding="utf-8") as f:
    paragraphs += [p.strip("\n") + "\n" for p in f.read().split("\n\n") if p.strip()]
for name in sorted(glob.glob(os.path.join(samples, "fortunes", "*.txt"))):
    with open(name, encoding="utf-8", errors="replace") as f:
        paragraphs += [p.strip("\n") + "\n" for p in f.read().split("\n%\n") if p.strip()]
rng = random.Random(35)
target = mb * 1000000
per_file = target // 8 + 1
written = 0
for k in range(8):
    with open(os.path.join(out, f"text{k}.txt"), "w", encoding="utf-8") as f:
        size = 0
        while size < per_file and written < target:
            rng.shuffle(paragraphs)
            block = "%\n".join(paragraphs) + "%\n"
            block = block[: min(per_file - size, target - written)]
            f.write(block)
            size += len(block.encode("utf-8"))
            written += len(block.encode("utf-8"))
PY
inputs=("$tmp"/text*.txt)
bytes="$(cat "${inputs[@]}" | wc -c)"

load() { cut -d' ' -f1 /proc/loadavg; }
echo "cpu=\"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\" cores=$(nproc) load=$(load)" \
  "input_mb=$((bytes / 1000000))"

shard_args=()
[ -n "$shard_tokens" ] && shard_args=(--shard-tokens "$shard_tokens")
run() {  # THREADS -> "seconds tokens max_rss_kb"
  local out="$tmp/out" start end tokens rss
  rm -rf "$out"
  start="$(date +%s.%N)"
  OMP_NUM_THREADS="$1" /usr/bin/time -f "%M" -o "$tmp/time" "$FORGE_BUILD/forge" prepare \
    --tokenizer gpt2 --records percent --input "${inputs[@]}" --output "$out" "${shard_args[@]}" \
    >"$tmp/stdout" 2>"$tmp/stderr" || { cat "$tmp/stderr" >&2; exit 1; }
  end="$(date +%s.%N)"
  tokens="$(sed -n 's/.* documents, \([0-9]*\) tokens from .*/\1/p' "$tmp/stdout")"
  rss="$(tail -1 "$tmp/time")"
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') $tokens $rss"
}
declare -A seconds rss_kb
for ((r = 0; r < repeats; r++)); do
  for t in 1 2; do
    read -r s tokens rss <<<"$(run "$t")"
    seconds[$t]+="$s "
    rss_kb[$t]="$rss"
    echo "bench_prepare: threads=$t run $((r + 1)): ${s}s load=$(load)" >&2
  done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for t in 1 2; do
  m="$(echo "${seconds[$t]}" | median)"
  declare "median_$t=$m"
  awk -v t="$t" -v s="$m" -v b="$bytes" -v n="$tokens" -v r="${rss_kb[$t]}" 'BEGIN {
    printf "prepare threads=%d mb_s=%.1f tokens_s=%.0f seconds=%.2f max_rss_mb=%.0f\n",
      t, b / s / 1e6, n / s, s, r / 1024 }'
done
awk -v a="$median_1" -v b="$median_2" 'BEGIN { printf "prepare speedup=%.2f target=1.8\n", a / b }'
if awk -v l="$(load)" -v c="$(nproc)" 'BEGIN { exit !(l > c) }'; then
  echo "warning: load $(load) on $(nproc) cores; the speedup is not meaningful"
fi
