#!/usr/bin/env bash
# The generate suite of scripts/bench: batched sampling (`forge generate --prompts`, K samples of
# every prompt through the KV cache) against the same loop in PyTorch (scripts/bench_generate.py),
# both from a randomly initialised GPT of a config's shape (Forge's trained for one step: its
# weights do not matter for speed), with the same prompts, batch size, temperature and top-k and no
# stop text, so both generate prompts x samples x new tokens tokens. Sides alternate; each keeps its
# fastest round. Prints
#   config=NAME prompts=P samples=K new_tokens=T batch=B forge_tok_s=X torch_tok_s=Y ratio=X/Y
# where tokens/s counts generated tokens over the sampling time (model loading excluded).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  cat <<'EOF2'
usage: scripts/bench generate [--rounds N] [--prompts P] [--samples K] [--new-tokens T]
                              [--batch-size B] [CONFIG]

  CONFIG          a Forge GPT config (GPT-2 flavour); default configs/gpt_shakespeare.yaml, its
                  context raised to the longest prompt (32 bytes) + T
  --prompts P     the first P non-blank lines of Tiny Shakespeare, cut at 32 bytes; default 64
  --samples K     samples per prompt; default 4
  --new-tokens T  tokens each sample generates; default 96
  --batch-size B  rows per forward; default 64
  --rounds N      alternate Forge and PyTorch N times (also FORGE_BENCH_ROUNDS=N); default 2
EOF2
}

log() { echo "bench_generate: $*" >&2; }
bad_usage() { log "$1"; usage >&2; exit 2; }
rounds="${FORGE_BENCH_ROUNDS:-2}" prompts=64 samples=4 new_tokens=96 batch=64 config=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --rounds | --prompts | --samples | --batch-size | --new-tokens)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad_usage "$1 wants N >= 1, got '$2'"
      case "$1" in
        --rounds) rounds="$2" ;; --prompts) prompts="$2" ;; --samples) samples="$2" ;;
        --batch-size) batch="$2" ;; --new-tokens) new_tokens="$2" ;;
      esac
      shift 2
      ;;
    -*) bad_usage "unknown argument '$1'" ;;
    *) [ -z "$config" ] || bad_usage "one CONFIG only"; config="$1"; shift ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || bad_usage "--rounds wants N >= 1, got '$rounds'"
config="$(realpath "${config:-$FORGE_ROOT/configs/gpt_shakespeare.yaml}")"
[ -f "$config" ] || bad_usage "no such config '$config'"
name="$(basename "$config" .yaml)"

forge_install_missing python3-torch python3-yaml libopenblas0
forge_build forge
cd "$FORGE_ROOT"  # data paths in configs are relative to the repository root
tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_generate.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

awk -v n="$prompts" 'NF { print substr($0, 1, 32); if (++c == n) exit }' \
  data/samples/tinyshakespeare.txt >"$tmp/prompts.txt"
head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
overrides=("model.context=$((32 + new_tokens))" "output_dir=$tmp/model" "train.max_steps=1"
           "schedule.warmup_steps=0" "train.eval_every=0" "train.save_every=0"
           "train.resume=never" "train.sample_tokens=1" "data.val=$tmp/val.txt")
"$FORGE_BUILD/forge" validate "$config" "${overrides[@]}" >"$tmp/probe.yaml" ||
  { log "$config does not validate"; exit 1; }
grep -v '^#' "$tmp/probe.yaml" >"$tmp/config.yaml"
forge_params="$(sed -n 's/^# parameters: //p' "$tmp/probe.yaml")"
torch_script="$FORGE_ROOT/scripts/bench_generate.py"
torch_params="$(/usr/bin/python3 "$torch_script" "$tmp/config.yaml" "$tmp/prompts.txt" --params-only |
                sed -n 's/^params=//p')"
[ "$forge_params" = "$torch_params" ] ||
  { log "the models differ: Forge has $forge_params parameters, PyTorch $torch_params"; exit 1; }
OMP_NUM_THREADS=2 "$FORGE_BUILD/forge" train "$config" "${overrides[@]}" >"$tmp/train.log" 2>&1 ||
  { log "forge train of the model failed:"; tail -20 "$tmp/train.log" >&2; exit 1; }

sampling=(--num-samples "$samples" --max-new-tokens "$new_tokens" --batch-size "$batch"
          --temperature 0.8 --top-k 200)
# Two threads on each side, each at its best (see scripts/bench): Forge with the short OpenMP spin
# its binary chooses, PyTorch with GOMP_SPINCOUNT=0 and glibc keeping freed memory.
run_forge() {
  OMP_NUM_THREADS=2 GOMP_SPINCOUNT=10000 "$FORGE_BUILD/forge" generate --checkpoint "$tmp/model" \
    --prompts "$tmp/prompts.txt" "${sampling[@]}" --output "$tmp/samples.jsonl" 2>"$tmp/forge.log" ||
    { log "forge generate failed:"; tail -5 "$tmp/forge.log" >&2; exit 1; }
  sed -n 's/.* samples of .* (\([0-9.]*\) tok\/s).*/\1/p' "$tmp/forge.log"
}
run_torch() {
  GOMP_SPINCOUNT=0 GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184 \
    /usr/bin/python3 "$torch_script" "$tmp/config.yaml" "$tmp/prompts.txt" "${sampling[@]}" \
    --threads 2 | sed -n 's/^tok_s=\([0-9.]*\) .*/\1/p'
}

log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
best_forge=0 best_torch=0
for ((round = 0; round < rounds; round++)); do
  f="$(run_forge)"
  t="$(run_torch)"
  [ -n "$f" ] && [ -n "$t" ] || { log "no tokens/s from one side (forge '$f', torch '$t')"; exit 1; }
  log "round $((round + 1)): forge $f tok/s, torch $t tok/s (load $(cut -d' ' -f1 /proc/loadavg))"
  awk -v a="$f" -v b="$best_forge" 'BEGIN { exit !(a > b) }' && best_forge="$f"
  awk -v a="$t" -v b="$best_torch" 'BEGIN { exit !(a > b) }' && best_torch="$t"
done
log "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); $forge_params parameters"
awk -v c="$name" -v p="$prompts" -v k="$samples" -v n="$new_tokens" -v b="$batch" \
  -v f="$best_forge" -v t="$best_torch" \
  'BEGIN { printf "config=%s prompts=%d samples=%d new_tokens=%d batch=%d forge_tok_s=%.0f torch_tok_s=%.0f ratio=%.2f\n",
           c, p, k, n, b, f, t, f / t }'
