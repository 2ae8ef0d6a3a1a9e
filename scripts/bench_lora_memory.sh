#!/usr/bin/env bash
# `scripts/bench lora-memory`: what LoRA saves in Forge on a GPT-2 124M-sized model (d_model 768,
# 12 layers, 12 heads, the gpt2 tokenizer's 50257 ids, batch 1): full fine-tuning (lora.rank=0)
# against LoRA (lora.rank=8, alpha 16, attn.qkv, attn.proj, mlp.*), both for a few steps of recipe
# finetune from the same base, which gpt_pretrain trains for one step in a temporary directory.
# Prints key=value lines: each run's peak resident set size, the peak_mem_mb of its last train
# line, its median step time, the sizes in bytes of its last checkpoint (LoRA: the adapters only),
# and `forge validate`'s parameter lines for the LoRA config.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
source "$(dirname "${BASH_SOURCE[0]}")/bench_metrics.sh"

usage() {
  cat <<'EOF'
usage: scripts/bench lora-memory [--context N] [--steps N]

  --context N   sequence length; default 1024 (GPT-2's); 256 is about 5x faster
  --steps N     fine-tuning steps of each run; default 3
EOF
}
log() { echo "bench_lora_memory: $*" >&2; }
bad_usage() { log "$1"; usage >&2; exit 2; }
context=1024
steps=3
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --context | --steps)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done
[[ "$context" =~ ^[1-9][0-9]*$ ]] || bad_usage "--context wants N >= 1, got '$context'"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || bad_usage "--steps wants N >= 1, got '$steps'"

forge_install_missing time
forge_build forge
cd "$FORGE_ROOT"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_lora_memory.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# A small validation file: every run evaluates all of it (the finetune recipe at step 0 and at the
# end), a few windows of gpt2 tokens instead of the 10% split.
head -c 24000 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
config="configs/gpt_shakespeare.yaml"
common=("model.vocab_size=50257" "model.d_model=768" "model.n_layers=12" "model.n_heads=12"
        "model.context=$context" "model.dropout=0.0" "data.tokenizer=gpt2"
        "data.train=data/samples/tinyshakespeare.txt" "data.val=$tmp/val.txt"
        "train.batch_size=1" "train.grad_accum=1" "schedule.warmup_steps=0" "train.eval_every=0"
        "train.save_every=0" "train.resume=never" "train.sample_tokens=1" "train.log_every=1")

train() {  # name overrides...
  local name="$1"
  shift
  OMP_NUM_THREADS=2 /usr/bin/time -f %M -o "$tmp/$name.rss" \
    "$FORGE_BUILD/forge" train "$config" "${common[@]}" output_dir="$tmp/$name" "$@" \
    >"$tmp/$name.log" 2>&1 || { log "forge train ($name) failed:"; tail -20 "$tmp/$name.log" >&2; exit 1; }
}
checkpoint_bytes() { stat -c %s "$tmp/$1/checkpoints/$(cat "$tmp/$1/checkpoints/LATEST")"; }

log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); context $context, $steps steps"
train base "train.max_steps=1"
finetune=("recipe=finetune" "model.init_from=$tmp/base" "train.max_steps=$steps")
lora=("lora.rank=8" "lora.alpha=16" 'lora.targets=["*.attn.qkv","*.attn.proj","*.mlp.*"]')
"$FORGE_BUILD/forge" validate "$config" "${common[@]}" "${finetune[@]}" "${lora[@]}" \
  output_dir="$tmp/lora" >"$tmp/lora.probe.yaml"
"$FORGE_BUILD/forge" validate "$config" "${common[@]}" "${finetune[@]}" lora.rank=0 \
  output_dir="$tmp/full" >"$tmp/full.probe.yaml"
train full "${finetune[@]}" "lora.rank=0"
train lora "${finetune[@]}" "${lora[@]}"

echo "config=gpt2_124m_shape context=$context batch=1 steps=$steps"
echo "base_checkpoint_bytes=$(checkpoint_bytes base)"
for run in full lora; do
  echo "${run}_peak_rss_mb=$(awk '{ printf "%.1f", $1 / 1024 }' "$tmp/$run.rss")" \
       "${run}_peak_mem_mb=$(last_train_value "$tmp/$run/metrics.jsonl" peak_mem_mb)" \
       "${run}_step_s=$(median_step_s "$tmp/$run/metrics.jsonl")" \
       "${run}_checkpoint_bytes=$(checkpoint_bytes "$run")" \
       "${run}_estimate=\"$(sed -n 's/^# estimated peak training memory: \([0-9.]* [KMG]iB\).*/\1/p' "$tmp/$run.probe.yaml")\""
done
echo "lora_validate_params=\"$(sed -n 's/^# parameters: //p' "$tmp/lora.probe.yaml")\"" \
     "lora_validate_trainable=\"$(sed -n 's/^# trainable parameters: //p' "$tmp/lora.probe.yaml")\""
grep '^# trainable parameters' "$tmp/lora.probe.yaml"
log "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
