#!/usr/bin/env bash
# `scripts/bench frozen-memory`: what a bf16 frozen base saves (model.frozen_dtype, docs/core.md).
# LoRA fine-tunes (recipe finetune, rank 16, alpha 32 on every Linear of the blocks) of a random
# model of a published shape, default configs/bench/llama32_1b.yaml (Llama-3.2-1B), twice from the
# same base: with the base in fp32 under train.precision fp32, and in bf16 under train.precision
# auto (bf16 where this CPU multiplies it natively). The base is the config trained by
# gpt_pretrain for one step on ln_f.weight alone (as scripts/bench llama makes it: full AdamW
# state of a 1B model would take 20 GB). Prints key=value lines: each run's peak resident set size
# (the whole process, loading included), their ratio, forge validate's estimate for each, the
# median step time and the last train loss of each.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
source "$(dirname "${BASH_SOURCE[0]}")/bench_metrics.sh"

usage() {
  cat <<'EOF'
usage: scripts/bench frozen-memory [--config FILE] [--batch N] [--steps N] [--checkpointing]

  --config FILE    the model's shape; default configs/bench/llama32_1b.yaml
  --batch N        sequences of the config's context per step; default 1
  --steps N        fine-tuning steps of each run; default 3
  --checkpointing  train.activation_checkpointing true in both runs
EOF
}
log() { echo "bench_frozen_memory: $*" >&2; }
bad_usage() { log "$1"; usage >&2; exit 2; }
config=configs/bench/llama32_1b.yaml
batch=1
steps=3
checkpointing=false
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --config | --batch | --steps)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    --checkpointing) checkpointing=true; shift ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done
[ -f "$config" ] || bad_usage "--config: no such file '$config'"
[[ "$batch" =~ ^[1-9][0-9]*$ ]] || bad_usage "--batch wants N >= 1, got '$batch'"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || bad_usage "--steps wants N >= 1, got '$steps'"

forge_install_missing time
forge_build forge
cd "$FORGE_ROOT"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_frozen_memory.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
head -c 1200 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
common=("data.val=$tmp/val.txt" "schedule.warmup_steps=0" "train.eval_every=0"
        "train.save_every=0" "train.resume=never" "train.sample_tokens=1" "train.log_every=1" "train.max_steps=$steps"
        "train.batch_size=$batch" "train.activation_checkpointing=$checkpointing")
finetune=("recipe=finetune" "model.init_from=$tmp/base" "lora.rank=16" "lora.alpha=32"
          'lora.targets=["*.attn.q","*.attn.k","*.attn.v","*.attn.proj","*.mlp.gate","*.mlp.up","*.mlp.proj"]')

forge_run() {  # name args...: forge under /usr/bin/time, its peak RSS in $tmp/name.rss
  local name="$1"
  shift
  OMP_NUM_THREADS=2 /usr/bin/time -f %M -o "$tmp/$name.rss" "$FORGE_BUILD/forge" "$@" \
    >"$tmp/$name.log" 2>&1 || { log "forge $1 ($name) failed:"; tail -20 "$tmp/$name.log" >&2; exit 1; }
}

log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $config, batch $batch, $steps steps"
forge_run base train "$config" output_dir="$tmp/base" train.max_steps=1 train.batch_size=1 \
  train.save_every=1 train.eval_every=0 train.sample_tokens=1 schedule.warmup_steps=0 \
  "data.val=$tmp/val.txt" \
  'optimizer.freeze=["blocks.*","tok_emb.weight"]' --ignore-memory-check
declare -A settings=([fp32]="model.frozen_dtype=fp32 train.precision=fp32"
                     [bf16]="model.frozen_dtype=bf16 train.precision=auto")
for run in fp32 bf16; do
  read -ra these <<<"${settings[$run]}"
  "$FORGE_BUILD/forge" validate "$config" "${common[@]}" "${finetune[@]}" "${these[@]}" \
    output_dir="$tmp/$run" >"$tmp/$run.probe.yaml"
  forge_run "$run" train "$config" "${common[@]}" "${finetune[@]}" "${these[@]}" output_dir="$tmp/$run"
done

echo "config=$config context=$(sed -n 's/^  context: *\([0-9]*\).*/\1/p' "$config") batch=$batch" \
     "steps=$steps activation_checkpointing=$checkpointing" \
     "bf16_precision=\"$(sed -n 's/^precision: \([a-z0-9]*\).*/\1/p' "$tmp/bf16.log" | head -1)\""
for run in fp32 bf16; do
  echo "${run}_base_peak_rss_mb=$(awk '{ printf "%.1f", $1 / 1024 }' "$tmp/$run.rss")" \
       "${run}_step_s=$(median_step_s "$tmp/$run/metrics.jsonl")" \
       "${run}_last_loss=$(last_train_value "$tmp/$run/metrics.jsonl" loss)" \
       "${run}_estimate=\"$(sed -n 's/^# estimated peak training memory: \([0-9.]* [KMG]iB\).*/\1/p' "$tmp/$run.probe.yaml")\""
done
awk -v a="$(cat "$tmp/bf16.rss")" -v b="$(cat "$tmp/fp32.rss")" \
  'BEGIN { printf "bf16_over_fp32_peak_rss=%.3f\n", a / b }'
log "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
