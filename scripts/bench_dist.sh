#!/usr/bin/env bash
# The dist suite of scripts/bench: data parallelism on this machine. Trains the medium GPT config
# (or CONFIG) for a few steps six ways, one after the other, and prints one line each,
#   mode=NAME tok_s=X allreduce_wait_ms=Y allreduce_exposed_ms=Z peak_mb=P rss_mb=R
# tok_s being the median of the train lines' tokens_per_s after the first (warm-up) line,
# allreduce_wait_ms the mean time a step waited for the gradients' all-reduce after its backward,
# and allreduce_exposed_ms the part of it after the slower rank's backward ended (the rest is the
# ranks' imbalance, which the machine's other work makes vary from run to run), peak_mb the
# allocator's peak on rank 0 at the last train line (before the final checkpoint), rss_mb each
# process's peak resident memory (VmHWM, by /usr/bin/time, final checkpoint included):
#   single         one process, 2 threads, the config's batch in one micro-batch
#   single-accum2  one process, 2 threads, the same global batch as 2 micro-batches of half size
#                  (the micro-batches the ranks run)
#   mpi            mpirun -np 2, 1 thread per rank, each running one micro-batch of half size,
#                  all-reduce overlapped with backward
#   mpi-no-overlap the same, every bucket reduced after backward (train.allreduce_overlap=false)
#   mpi-sharded    as mpi, with AdamW's state sharded over the ranks (train.shard_optimizer=true)
#   mpi-sgd        as mpi, with SGD without momentum: no optimizer state, the memory baseline
# and then the all-reduce time (mpi-no-overlap's exposed time), the fraction of it the overlap
# hides (1 - mpi's exposed time / mpi-no-overlap's), the optimizer state on rank 0 sharded and not
# (peak_mb above mpi-sgd's), its sharded fraction, and mpi-sharded's step time over mpi's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  echo "usage: scripts/bench dist [--config CONFIG] [--steps N] [key=value ...]"
  echo "  (default: configs/gpt_shakespeare_medium.yaml, 40 steps; the config's train.batch_size"
  echo "  must be even, and the overrides go to every run)"
}
config=configs/gpt_shakespeare_medium.yaml
steps=40
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --config) config="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *=*) overrides+=("$1"); shift ;;
    *) echo "bench dist: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
forge_build forge
cd "$FORGE_ROOT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A small validation file: the final evaluation of the real split would take longer than the steps.
head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
batch="$("$FORGE_BUILD/forge" validate "$config" "${overrides[@]}" | awk '$1 == "batch_size:" { print $2; exit }')"
half=$((batch / 2))
common=("data.val=$tmp/val.txt" "train.max_steps=$steps" "schedule.warmup_steps=$((steps / 4))"
        "train.log_every=5" "train.eval_every=0"
        "train.save_every=0" "train.sample_every=0" "train.sample_tokens=1" "train.resume=never"
        "train.grad_accum=1" "${overrides[@]}")
mpirun_cmd=(mpirun --allow-run-as-root -np 2)

summary() {  # mode run_dir stderr
  /usr/bin/python3 - "$1" "$2/metrics.jsonl" "$3" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[2])]
train = [l for l in lines if l["split"] == "train"]
peak = train[-1]["peak_mem_mb"]
train = train[1:]
tok = statistics.median(l["tokens_per_s"] for l in train)
wait = statistics.mean(l.get("allreduce_wait_s", 0.0) for l in train) * 1000
exposed = statistics.mean(l.get("allreduce_exposed_s", 0.0) for l in train) * 1000
rss = [int(l.split("=")[1]) // 1024 for l in open(sys.argv[3]) if l.startswith("maxrss_kb=")]
print(f"mode={sys.argv[1]} tok_s={tok:.0f} allreduce_wait_ms={wait:.2f} "
      f"allreduce_exposed_ms={exposed:.2f} peak_mb={peak:.0f} rss_mb={'/'.join(map(str, rss))}")
PY
}

run() {  # mode command...
  local mode="$1"
  shift
  "$@" /usr/bin/time -f "maxrss_kb=%M" "$FORGE_BUILD/forge" train "$config" "${common[@]}" \
    "output_dir=$tmp/$mode" "${extra[@]}" >/dev/null 2>"$tmp/$mode.err" ||
    { cat "$tmp/$mode.err" >&2; echo "bench dist: the $mode run failed" >&2; exit 1; }
  summary "$mode" "$tmp/$mode" "$tmp/$mode.err" | tee -a "$tmp/summary"
}

extra=()
OMP_NUM_THREADS=2 run single
halves=("train.batch_size=$half" "train.grad_accum=2")
extra=("${halves[@]}")
OMP_NUM_THREADS=2 run single-accum2
OMP_NUM_THREADS=1 run mpi "${mpirun_cmd[@]}"
extra=("${halves[@]}" "train.allreduce_overlap=false")
OMP_NUM_THREADS=1 run mpi-no-overlap "${mpirun_cmd[@]}"
extra=("${halves[@]}" "train.shard_optimizer=true")
OMP_NUM_THREADS=1 run mpi-sharded "${mpirun_cmd[@]}"
extra=("${halves[@]}" "optimizer.name=sgd")
OMP_NUM_THREADS=1 run mpi-sgd "${mpirun_cmd[@]}"
awk '
  { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    tok[v["mode"]] = v["tok_s"]; ms[v["mode"]] = v["allreduce_exposed_ms"]; mb[v["mode"]] = v["peak_mb"] }
  END {
    hidden = ms["mpi-no-overlap"] > 0 ? 1 - ms["mpi"] / ms["mpi-no-overlap"] : 0
    printf "speedup_mpi_vs_single=%.2f allreduce_ms=%.2f hidden_fraction=%.2f\n",
           tok["mpi"] / tok["single"], ms["mpi-no-overlap"], hidden
    state = mb["mpi"] - mb["mpi-sgd"]; sharded = mb["mpi-sharded"] - mb["mpi-sgd"]
    fraction = state > 0 ? sharded / state : 0
    printf "optimizer_state_mb=%.0f sharded_state_mb=%.0f sharded_state_fraction=%.2f ",
           state, sharded, fraction
    printf "sharded_step_time_ratio=%.3f\n", tok["mpi"] / tok["mpi-sharded"]
  }' "$tmp/summary"
