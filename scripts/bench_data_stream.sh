#!/usr/bin/env bash
# The streaming-data bench (issue 35's target: training on a 20 GB token dataset with resident
# memory under 1 GB beyond the model's, and tokens/s within 5% of the in-memory loader on a small
# one). scripts/bench_data_stream_tool.cpp writes a synthetic dataset of random bytes-tokenizer ids
# (uint16, documents of 64 to 4095 ids) as a shard directory of --gb GB, and a small one (--small-mb)
# both as a .h5 file and as the same ids in a text file, which Forge holds in memory. A small GPT
# trains --steps steps on each (the same seed: the text and the .h5 runs draw the same batches), and
# the bench prints, one line each:
#   machine: CPU, cores, load average before the runs
#   open_20gb_s=S                    opening the 20 GB directory: the digest pass over every byte
#   rss_small_text_mb=A rss_small_stream_mb=B rss_20gb_mb=C rss_20gb_beyond_small_mb=C-A
#   tok_s_text=X tok_s_stream=Y stream_vs_text=Y/X   (median of --repeats alternating runs)
#   same_losses=yes|no               the text and .h5 runs logged the same losses
#   sample_small: stream_us=S memory_us=M   one training batch's windows drawn by the loaders
#   sample_20gb: stream_us=S                alone, on the small dataset and on the large one
# Resident memory is the peak (VmHWM, as /usr/bin/time reports it) of `forge train`. The dataset
# is written under $TMPDIR (default /tmp) and deleted at the end.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  cat <<'EOF'
usage: scripts/bench_data_stream.sh [--gb N] [--shard-gb N] [--small-mb N] [--steps N] [--repeats N]

  --gb N        size of the large dataset in GB (1e9 bytes, 2 per token); default 20
  --shard-gb N  size of each of its shards; default 1
  --small-mb N  size of the small dataset in MB; default 4 (it fits the reader's cache)
  --steps N     training steps per run; default 60
  --repeats N   runs on the small dataset per loader, alternating, median reported; default 3
EOF
}

bad_usage() { echo "bench_data_stream: $1" >&2; usage >&2; exit 2; }
gb=20
shard_gb=1
small_mb=4
steps=60
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --gb | --shard-gb | --small-mb | --steps | --repeats)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      v="${1#--}"
      declare "${v//-/_}=$2"
      shift 2
      ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done
for v in gb shard_gb small_mb steps repeats; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || bad_usage "--${v//_/-} wants N >= 1, got '${!v}'"
done

forge_build forge bench_data_stream_tool
tool="$FORGE_BUILD/bench_data_stream_tool"
[ -x /usr/bin/time ] || forge_install_missing time

tmp_root="${TMPDIR:-/tmp}"
need_kb=$(( (gb + 3) * 1000000 ))
free_kb="$(df -Pk "$tmp_root" | awk 'NR == 2 { print $4 }')"
if [ "$free_kb" -lt "$need_kb" ]; then
  echo "bench_data_stream: $tmp_root has $((free_kb / 1000000)) GB free, the bench needs $((need_kb / 1000000))" >&2
  exit 1
fi
tmp="$(mktemp -d "$tmp_root/forge_bench_data.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

small_tokens=$((small_mb * 500000))
"$tool" write "$tmp/small.h5" "$small_tokens"
"$tool" text "$tmp/small.txt" "$small_tokens"
# Validation for every run: its own small file, so that the final evaluation is the same size.
"$tool" write "$tmp/val.h5" 200000
"$tool" text "$tmp/val.txt" 200000

cat >"$tmp/run.yaml" <<YAML
recipe: gpt_pretrain
seed: 1337
model:     {arch: gpt, vocab_size: 256, context: 256, d_model: 128, n_layers: 4, n_heads: 4}
data:      {tokenizer: bytes, train: $tmp/small.txt, val: $tmp/val.txt}
optimizer: {name: adamw, lr: 1.0e-3}
train:     {batch_size: 8, max_steps: $steps, log_every: 10, eval_every: 0, save_every: 0,
            sample_tokens: 1, resume: never}
YAML

# Runs forge train with the overrides given; sets rss (peak resident MB), rate (tokens/s: the mean
# of the train lines after the first, whose window holds the start) and losses (the train lines').
train() {
  local run="$tmp/run-$RANDOM"
  /usr/bin/time -f "%M" -o "$tmp/time" "$FORGE_BUILD/forge" train "$tmp/run.yaml" \
    output_dir="$run" "$@" >/dev/null 2>"$tmp/err" ||
    { echo "bench_data_stream: forge train $* failed:" >&2; tail -3 "$tmp/err" >&2; exit 1; }
  read -r rss rate losses < <(/usr/bin/python3 - "$run/metrics.jsonl" "$(tail -1 "$tmp/time")" <<'PY'
import json, sys
train = [l for l in map(json.loads, open(sys.argv[1])) if l["split"] == "train"]
rates = [l["tokens_per_s"] for l in train[1:]]
print(f"{int(sys.argv[2]) / 1024:.0f} {sum(rates) / len(rates):.0f}",
      ",".join(f"{l['loss']:.6f}" for l in train))
PY
)
  rm -rf "$run"
}

text_rates=()
stream_rates=()
for ((i = 0; i < repeats; i++)); do
  train data.train="$tmp/small.txt" data.val="$tmp/val.txt"
  rss_text="$rss" text_losses="$losses"
  text_rates+=("$rate")
  train data.train="$tmp/small.h5" data.val="$tmp/val.h5"
  rss_stream="$rss" stream_losses="$losses"
  stream_rates+=("$rate")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
tok_text="$(median "${text_rates[@]}")"
tok_stream="$(median "${stream_rates[@]}")"

echo "bench_data_stream: writing $gb GB of tokens into $tmp/large (shards of $shard_gb GB)" >&2
"$tool" write "$tmp/large" $((gb * 500000000)) $((shard_gb * 500000000))
open_out="$("$tool" open "$tmp/large")"
train data.train="$tmp/large" data.val="$tmp/val.h5"
rss_large="$rss" rate_large="$rate"

echo "open_20gb_s=$(printf '%s\n' "$open_out" | tr ' ' '\n' | sed -n 's/^open_s=//p') ($gb GB, $(printf '%s\n' "$open_out" | tr ' ' '\n' | sed -n 's/^files=//p') files)"
echo "rss_small_text_mb=$rss_text rss_small_stream_mb=$rss_stream rss_20gb_mb=$rss_large" \
  "rss_20gb_beyond_small_mb=$((rss_large - rss_text)) tok_s_20gb=$rate_large"
awk -v t="$tok_text" -v s="$tok_stream" -v a="${text_rates[*]}" -v b="${stream_rates[*]}" \
  'BEGIN { printf "tok_s_text=%s tok_s_stream=%s stream_vs_text=%.3f (runs: text %s; stream %s)\n", t, s, s / t, a, b }'
if [ "$text_losses" = "$stream_losses" ]; then echo "same_losses=yes"; else echo "same_losses=no"; fi
echo "sample_small: $("$tool" sample "$tmp/small.h5" "$tmp/small.txt" 256 8 2000)"
echo "sample_20gb: $("$tool" sample "$tmp/large" - 256 8 2000)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
