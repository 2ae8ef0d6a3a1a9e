#!/usr/bin/env bash
# The training suites of scripts/bench (gpt, bert, lora, llama, distill, dpo, ppo, grpo): trains a config
# for a few steps with `forge train` and with the equal PyTorch model of scripts/bench_SUITE.py,
# alternating the two, and prints per config
#   config=NAME forge_tok_s=X torch_tok_s=Y ratio=X/Y forge_peak_mb=A torch_peak_mb=B forge_est_mb=E
# tokens/s = tokens per step / the median time of the steps after the warm-up ones (a median, as
# in scripts/bench, because other work on a shared machine lands on a few steps; the rate over all
# timed steps is printed to stderr too); peak = the process's peak resident set size. dpo counts
# preference pairs instead of tokens (forge_pairs_s=X torch_pairs_s=Y ratio=X/Y), ppo and grpo
# rollout rows (forge_rows_s=X ...); every suite adds the median step of each side (forge_step_ms=,
# torch_step_ms=). forge_est_mb is the peak training memory `forge validate` estimates for the run (MiB, as the
# peaks). The llama suite adds a line per config for greedy generation (see after_config there).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

# A suite: its default configs; what makes a config "large" (fewer steps: parameters x tokens per
# step above this); suite_overrides, which adds to `base` the overrides that keep Forge's run to
# the timed steps (run in the temporary directory $tmp, from the repository root);
# config_overrides, which sets `extra` to one config's own overrides (default: none); and `unit`,
# what a step's rate counts: tok (the default), batch_size x grad_accum x context tokens, pairs,
# batch_size x grad_accum preference pairs, or rows, the rollout's rows (ppo.rollout_batch, or
# grpo.prompts_per_step x grpo.num_generations).
suite="${1:-}"
config_overrides() { extra=(); }
# The preference suites' data: the synthetic pairs of scripts/bench_dpo.py --write-pairs in
# $tmp/pairs, and $tmp/val.txt, the validation text of their base's one-step run.
write_pairs() {
  /usr/bin/python3 "$FORGE_ROOT/scripts/bench_dpo.py" --write-pairs \
    data/samples/tinyshakespeare.txt "$tmp/pairs" || { log "bench_dpo.py --write-pairs failed"; exit 1; }
  head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
}
# The base a LoRA suite fine-tunes: the config itself trained for one step (its weights do not
# matter for speed) into $tmp/NAME.base, with the overrides after.
train_base() {  # config name overrides...
  local config="$1" name="$2"
  shift 2
  OMP_NUM_THREADS=2 "$FORGE_BUILD/forge" train "$config" output_dir="$tmp/$name.base" \
    train.max_steps=1 schedule.warmup_steps=0 train.eval_every=0 train.save_every=0 \
    train.resume=never train.sample_tokens=1 "data.val=$tmp/val.txt" "$@" >"$tmp/$name.base.log" 2>&1 ||
    { log "forge train of the base failed:"; tail -20 "$tmp/$name.base.log" >&2; exit 1; }
}
after_config() { :; }
unit=tok
large_steps=10 large_warmup=2
case "$suite" in
  gpt)
    family=GPT
    default_configs=(configs/gpt_shakespeare.yaml configs/gpt_shakespeare_medium.yaml)
    large_at=1e9 large_note="(the medium one)"
    # A small validation file: the run always ends with a full evaluation, which on the real 10%
    # split takes longer than the timed steps. Training then reads all of data.train, on both sides.
    suite_overrides() {
      head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
      base+=("data.val=$tmp/val.txt" "train.sample_tokens=1")
    }
    ;;
  bert)
    family=BERT
    default_configs=(configs/bert_shakespeare.yaml)
    large_at=1e11 large_note="(BERT-base)"
    # The final evaluation scores one batch of fixed validation pairs instead of eval_pairs.
    suite_overrides() { base+=("bert.eval_pairs=32"); }
    ;;
  lora)
    # LoRA fine-tuning (recipe finetune, rank 8, alpha 16, the default targets attn.qkv, attn.proj,
    # mlp.*) of the GPT configs, from a base that gpt_pretrain trains for one step in $tmp.
    family=GPT
    default_configs=(configs/gpt_shakespeare.yaml configs/gpt_shakespeare_medium.yaml)
    large_at=1e9 large_note="(the medium one)"
    # The fortunes as record files. The recipe evaluates at step 0 and at the end, over the whole
    # 10% split (260k bytes, longer than the timed steps): a small record directory as data.val
    # instead, so training reads every record of data.train, on both sides.
    suite_overrides() {
      mkdir -p "$tmp/val_records"
      head -c 4096 data/samples/fortunes/art.txt >"$tmp/val_records/art.txt"
      head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
      base+=("recipe=finetune" "data.train=data/samples/fortunes" "data.val=$tmp/val_records"
             'finetune.end_of_text="%\n"' "lora.rank=8" "lora.alpha=16"
             'lora.targets=["*.attn.qkv","*.attn.proj","*.mlp.*"]' "train.sample_tokens=1")
    }
    # The base: the config itself, gpt_pretrain for one step.
    config_overrides() {  # config name
      train_base "$1" "$2"
      extra=("model.init_from=$tmp/$2.base")
    }
    ;;
  llama)
    # LoRA fine-tuning (recipe finetune, rank 16, alpha 32 on every Linear of the blocks: attn.q,
    # attn.k, attn.v, attn.proj, mlp.gate, mlp.up, mlp.proj) of random models of published Llama
    # shapes, batch 4 x 256 tokens, against scripts/bench_llama.py.
    family=Llama
    default_configs=(configs/bench/smollm2_135m.yaml configs/bench/llama32_1b.yaml)
    large_at=5e11 large_note="(Llama-3.2-1B)" large_steps=3 large_warmup=1
    suite_overrides() {
      head -c 1200 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
      base+=("recipe=finetune" "data.val=$tmp/val.txt" "lora.rank=16" "lora.alpha=32"
             'lora.targets=["*.attn.q","*.attn.k","*.attn.v","*.attn.proj","*.mlp.gate","*.mlp.up","*.mlp.proj"]'
             "train.sample_tokens=1")
    }
    # The base trains ln_f.weight alone on one row: a 1B model's weights with full AdamW's
    # gradients and moments would take 20 GB. The memory check counts those, hence its flag.
    config_overrides() {  # config name
      train_base "$1" "$2" train.batch_size=1 'optimizer.freeze=["blocks.*","tok_emb.weight"]' \
        --ignore-memory-check
      extra=("model.init_from=$tmp/$2.base")
    }
    # Greedy generation from the base (forge generate, batch 1) against bench_llama.py --generate,
    # its own key/value cache: a 16-byte prompt, 128 new tokens, sides alternating, each its best.
    after_config() {  # config name
      local prompt="$tmp/prompt.txt" f t best_f=0 best_t=0 round
      { head -c 16 data/samples/tinyshakespeare.txt | tr '\n' ' '; echo; } >"$prompt"
      for ((round = 0; round < rounds; round++)); do
        OMP_NUM_THREADS=2 GOMP_SPINCOUNT=10000 "$FORGE_BUILD/forge" generate \
          --checkpoint "$tmp/$2.base" --prompts "$prompt" --batch-size 1 --temperature 0 \
          --max-new-tokens 128 --output "$tmp/$2.samples.jsonl" 2>"$tmp/$2.generate.log" ||
          { log "forge generate failed:"; tail -5 "$tmp/$2.generate.log" >&2; exit 1; }
        f="$(sed -n 's/.* \([0-9]*\) tokens in \([0-9.]*\) s .*/\1 \2/p' "$tmp/$2.generate.log" |
             awk '{ printf "%.2f", $1 / $2 }')"
        t="$(GOMP_SPINCOUNT=0 GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184 \
             /usr/bin/python3 "$torch_script" "$tmp/$2.yaml" --generate "$prompt" --max-new-tokens 128 \
             --threads 2 | sed -n 's/^tok_s=\([0-9.]*\) .*/\1/p')"
        [ -n "$f" ] && [ -n "$t" ] || { log "no tokens/s from one side (forge '$f', torch '$t')"; exit 1; }
        log "$2 generate round $((round + 1)): forge $f tok/s, torch $t tok/s (load $(cut -d' ' -f1 /proc/loadavg))"
        awk -v a="$f" -v b="$best_f" 'BEGIN { exit !(a > b) }' && best_f="$f"
        awk -v a="$t" -v b="$best_t" 'BEGIN { exit !(a > b) }' && best_t="$t"
      done
      awk -v c="$2" -v f="$best_f" -v t="$best_t" 'BEGIN {
        printf "config=%s generate prompt_tokens=16 new_tokens=128 batch=1 greedy forge_tok_s=%.1f" \
               " torch_tok_s=%.1f ratio=%.2f\n", c, f, t, f / t }'
    }
    ;;
  distill)
    # Knowledge distillation (recipe distill) of a GPT and a BERT student, each from a teacher that
    # the config in configs/ whose output_dir is its distill.teacher trains for one step in $tmp
    # (its weights do not matter for speed); the student starts as its config says.
    family=distill
    default_configs=(configs/distill_gpt_shakespeare.yaml configs/distill_bert_shakespeare.yaml)
    large_at=1e11 large_note="(none of the defaults)"
    suite_overrides() { head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"; }
    config_overrides() {  # config name
      local family_overrides
      # The gpt and bert suites' overrides, for the teacher's run and the student's: the final
      # evaluation (and GPT sample) of each stays short.
      if [ "$(config_key "$1" model arch)" = bert ]; then
        family_overrides=("bert.eval_pairs=32")
      else
        family_overrides=("data.val=$tmp/val.txt" "train.sample_tokens=1")
      fi
      train_source "$1" distill teacher "$tmp/$2.teacher" "${family_overrides[@]}"
      extra=("distill.teacher=$tmp/$2.teacher" "${family_overrides[@]}")
    }
    ;;
  dpo)
    # DPO (recipe dpo) of a GPT policy from a base that the config in configs/ whose output_dir is
    # the DPO config's model.init_from trains for one step in $tmp (its weights do not matter for
    # speed); the reference is a frozen copy of that base. The pairs are synthetic, written into
    # $tmp by scripts/bench_dpo.py --write-pairs: slices of the Shakespeare text whose chosen rows
    # all have the same length, so every batch has the same shape on both sides whatever pairs the
    # two loaders draw. The recipe evaluates at step 0 and at the end: a small data.val, no
    # dpo.eval_text and a one-token sample keep those short.
    family=DPO
    unit=pairs
    default_configs=(configs/dpo_shakespeare_positive.yaml)
    large_at=1e11 large_note="(none of the defaults)"
    suite_overrides() {
      write_pairs
      base+=("data.train=$tmp/pairs/train.jsonl" "data.val=$tmp/pairs/val.jsonl"
             'dpo.eval_text=""' "train.sample_tokens=1")
    }
    config_overrides() {  # config name
      train_source "$1" model init_from "$tmp/$2.base" train.sample_tokens=1 "data.val=$tmp/val.txt"
      extra=("model.init_from=$tmp/$2.base")
    }
    ;;
  ppo)
    # PPO (recipe ppo) of a GPT policy, each step a rollout of ppo.rollout_batch prompts, its
    # scoring by the policy, the frozen reference, the value model and the reward model, and
    # ppo_epochs passes of minibatch updates of the policy and the value model. The base (the
    # policy's start and its reference) and the reward model are trained for one step in $tmp by
    # the configs in configs/ whose output_dir are the PPO config's model.init_from and
    # ppo.reward_model, the reward model from that base on dpo's synthetic pairs (their weights do
    # not matter for speed). The recipe evaluates at step 0 and at the end, sampling held-out
    # prompts with the policy and the reference: four of them as data.val, no ppo.eval_text and a
    # one-token sample keep those short.
    family=PPO
    unit=rows
    default_configs=(configs/ppo_shakespeare_positive.yaml)
    large_at=0 large_note="(all: a step is a rollout and ppo_epochs passes over it)"
    suite_overrides() {
      write_pairs
      head -4 data/samples/preference/prompts_val.jsonl >"$tmp/val_prompts.jsonl"
      base+=("data.val=$tmp/val_prompts.jsonl" 'ppo.eval_text=""' "train.sample_tokens=1")
    }
    config_overrides() {  # config name
      train_source "$1" model init_from "$tmp/$2.base" train.sample_tokens=1 "data.val=$tmp/val.txt"
      train_source "$1" ppo reward_model "$tmp/$2.reward" "model.init_from=$tmp/$2.base" \
        "data.train=$tmp/pairs/train.jsonl" "data.val=$tmp/pairs/val.jsonl"
      extra=("model.init_from=$tmp/$2.base" "ppo.reward_model=$tmp/$2.reward")
    }
    ;;
  grpo)
    # GRPO (recipe grpo) of a GPT policy, each step a rollout of grpo.num_generations completions
    # of each of grpo.prompts_per_step prompts, the answer verifier's rewards, group-relative
    # advantages, the reference's log-probabilities (grpo.beta > 0) and the updates. The base (the
    # policy's start and its reference) is configs/gpt_arith.yaml, the shape of the arithmetic
    # task's models, trained for one step in $tmp (its weights do not matter for speed: the
    # answers are wrong on both sides, so completions run to max_new_tokens). The recipe
    # evaluates at step 0 and at the end: four held-out sums as data.val keep those short.
    family=GRPO
    unit=rows
    default_configs=(configs/grpo_arith.yaml)
    large_at=1e11 large_note="(none of the defaults)"
    suite_overrides() {
      head -c 4096 data/samples/tinyshakespeare.txt >"$tmp/val.txt"
      head -4 data/samples/arith/test.jsonl >"$tmp/val_prompts.jsonl"
      base+=("data.val=$tmp/val_prompts.jsonl" "train.sample_tokens=1")
    }
    config_overrides() {  # config name
      train_base configs/gpt_arith.yaml "$2"
      extra=("model.init_from=$tmp/$2.base")
    }
    ;;
  *)
    echo "bench_train: unknown suite '$suite' (gpt, bert, lora, llama, distill, dpo, ppo or grpo)" >&2
    exit 2
    ;;
esac
shift

usage() {
  cat <<EOF
usage: scripts/bench $suite [--rounds N] [--steps N] [--warmup N] [--precision P] [CONFIG...]

  CONFIG...     Forge $family configs; default $(printf '%s' "${default_configs[0]}"
                  for c in "${default_configs[@]:1}"; do printf ' and\n                %s' "$c"; done)
  --rounds N    alternate Forge and PyTorch N times per config, keeping each side's fastest round
                (also FORGE_BENCH_ROUNDS=N); default 2
  --steps N     timed training steps; default 30, or $large_steps for a config of over $large_at
                parameter-tokens per step $large_note
  --warmup N    untimed steps before them; default 5, or $large_warmup for those large configs
  --precision P train.precision of both sides: fp32 (default), or bf16 (gpt suite only: Forge's
                bf16 matrix products; PyTorch's CPU autocast to bfloat16 around forward and loss)
EOF
}

log() { echo "bench_$suite: $*" >&2; }
bad_usage() { log "$1"; usage >&2; exit 2; }
rounds="${FORGE_BENCH_ROUNDS:-2}"
precision=fp32
steps=""
warmup=""
configs=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --rounds | --steps | --warmup | --precision)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    -*) bad_usage "unknown argument '$1'" ;;
    *) configs+=("$1"); shift ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || bad_usage "--rounds wants N >= 1, got '$rounds'"
[[ -z "$steps" || "$steps" =~ ^[1-9][0-9]*$ ]] || bad_usage "--steps wants N >= 1, got '$steps'"
[[ -z "$warmup" || "$warmup" =~ ^[1-9][0-9]*$ ]] || bad_usage "--warmup wants N >= 1, got '$warmup'"
[[ "$precision" == fp32 || "$precision" == bf16 ]] ||
  bad_usage "--precision wants fp32 or bf16, got '$precision'"
# Only bench_gpt.py runs its side under autocast so far: another suite would compare bf16 with fp32.
[[ "$precision" == fp32 || "$suite" == gpt ]] ||
  bad_usage "--precision bf16 is benchmarked in the gpt suite only"
[ ${#configs[@]} -gt 0 ] || configs=("${default_configs[@]/#/$FORGE_ROOT/}")

for i in "${!configs[@]}"; do
  [ -f "${configs[$i]}" ] || bad_usage "no such config '${configs[$i]}'"
  configs[i]="$(realpath "${configs[$i]}")"
done
torch_script="$FORGE_ROOT/scripts/bench_$suite.py"
forge_install_missing python3-torch python3-yaml libopenblas0 time
forge_build forge
cd "$FORGE_ROOT"  # data paths in configs are relative to the repository root, as in the README

tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_$suite.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
base=("train.eval_every=0" "train.save_every=0" "train.resume=never" "train.precision=$precision")
suite_overrides

# Two threads on each side, each at its best: Forge with the short OpenMP spin its binary chooses
# by itself (cli/main.cpp), PyTorch with GOMP_SPINCOUNT=0 (a short spin measured slower for it)
# and glibc keeping freed memory instead of page-faulting it back in every step.
run_forge() {  # config dir overrides...
  local config="$1" dir="$2"
  shift 2
  OMP_NUM_THREADS=2 /usr/bin/time -f %M -o "$dir.rss" \
    "$FORGE_BUILD/forge" train "$config" output_dir="$dir" "$@" >"$dir.log" 2>&1 ||
    { log "forge train failed:"; tail -20 "$dir.log" >&2; exit 1; }
}
run_torch() {  # resolved-config out-file
  GOMP_SPINCOUNT=0 GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184 \
    /usr/bin/python3 "$torch_script" "$1" --steps "$n_steps" --warmup "$n_warmup" --threads 2 \
    >"$2" || { log "scripts/bench_$suite.py failed"; exit 1; }
}
stored_params() { "$FORGE_BUILD/forge" inspect "$1" | sed -n 's/^parameters: \([0-9]*\).*/\1/p'; }
field() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p"; }  # key=value from a one-line file
config_key() {  # config section key: the value of section.key in a config, comments left out
  sed -n "/^$2:/,/^[a-z]/s/^  $3: *\([^ #]*\).*/\1/p" "$1"
}

# Trains for one step into DIR the config in configs/ whose output_dir is the run that CONFIG's
# SECTION.KEY names (the base a fine-tune starts from, a teacher, a reward model: their weights do
# not matter for speed), with the overrides after.
train_source() {  # config section key dir overrides...
  local config="$1" section="$2" key="$3" dir="$4" run from
  shift 4
  run="$(config_key "$config" "$section" "$key")"
  from="$(grep -lE "^output_dir: $run *(#.*)?\$" configs/*.yaml | head -1)"
  [ -n "$from" ] ||
    { log "$config: no config in configs/ has output_dir: $run, its $section.$key"; exit 1; }
  OMP_NUM_THREADS=2 "$FORGE_BUILD/forge" train "$from" output_dir="$dir" train.max_steps=1 \
    schedule.warmup_steps=0 train.eval_every=0 train.save_every=0 train.resume=never "$@" \
    >"$dir.log" 2>&1 ||
    { log "forge train of $from (the $section.$key) failed:"; tail -20 "$dir.log" >&2; exit 1; }
}

# "median-rate total-rate" over steps (warmup, warmup + steps] of a metrics.jsonl with a train
# line every step, from the differences of its elapsed_s.
forge_rate() {  # metrics units-per-step
  awk -v w="$n_warmup" -v n="$n_steps" -v per_step="$2" -v who="bench_$suite" '
    /"split": "train"/ {
      step = $0; sub(/.*"step": /, "", step); sub(/,.*/, "", step)
      t = $0; sub(/.*"elapsed_s": /, "", t); sub(/[,}].*/, "", t)
      if (step + 0 >= w && step + 0 <= w + n) at[step - w] = t + 0
    }
    END {
      for (i = 0; i <= n; i++)
        if (!(i in at)) { print who ": step " w + i " missing in metrics.jsonl" > "/dev/stderr"; exit 1 }
      for (i = 1; i <= n; i++) {  # insertion sort of the step times
        d = at[i] - at[i - 1]
        for (j = i - 1; j >= 1 && dt[j] > d; j--) dt[j + 1] = dt[j]
        dt[j + 1] = d
      }
      median = n % 2 ? dt[(n + 1) / 2] : (dt[n / 2] + dt[n / 2 + 1]) / 2
      printf "%.1f %.1f\n", per_step / median, n * per_step / (at[n] - at[0])
    }' "$1"
}

log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for config in "${configs[@]}"; do
  name="$(basename "$config" .yaml)"
  config_overrides "$config" "$name"
  "$FORGE_BUILD/forge" validate "$config" "${base[@]}" "${extra[@]}" >"$tmp/$name.probe.yaml" ||
    { log "$config does not validate"; exit 1; }
  forge_params="$(sed -n 's/^# parameters: //p' "$tmp/$name.probe.yaml")"
  forge_trainable="$(sed -n 's/^# trainable parameters: \([0-9]*\).*/\1/p' "$tmp/$name.probe.yaml")"
  forge_est_mb="$(sed -n 's/^# estimated peak training memory: \([0-9.]*\) MiB.*/\1/p' "$tmp/$name.probe.yaml")"
  batch="$(config_key "$tmp/$name.probe.yaml" train batch_size)"
  accum="$(config_key "$tmp/$name.probe.yaml" train grad_accum)"
  context="$(config_key "$tmp/$name.probe.yaml" model context)"
  tokens_per_step=$((batch * accum * context))
  case "$unit" in
    tok) per_step="$tokens_per_step" ;;
    pairs) per_step=$((batch * accum)) ;;
    rows)
      if [ "$suite" = grpo ]; then
        per_step=$(($(config_key "$tmp/$name.probe.yaml" grpo prompts_per_step) *
                    $(config_key "$tmp/$name.probe.yaml" grpo num_generations)))
      else
        per_step="$(config_key "$tmp/$name.probe.yaml" ppo rollout_batch)"
      fi
      ;;
  esac
  if awk -v n="$((forge_params * tokens_per_step))" -v at="$large_at" 'BEGIN { exit !(n > at) }'; then
    n_steps="${steps:-$large_steps}" n_warmup="${warmup:-$large_warmup}"
  else
    n_steps="${steps:-30}" n_warmup="${warmup:-5}"
  fi
  # The schedule only has to validate: warm-up over the untimed steps, then its decay.
  overrides=("${base[@]}" "${extra[@]}" "train.max_steps=$((n_warmup + n_steps))" "train.log_every=1"
             "schedule.warmup_steps=$n_warmup")
  "$FORGE_BUILD/forge" validate "$config" "${overrides[@]}" | grep -v '^#' >"$tmp/$name.yaml"

  torch_counts="$(/usr/bin/python3 "$torch_script" "$tmp/$name.yaml" --params-only)"
  torch_params="$(printf '%s\n' "$torch_counts" | tr ' ' '\n' | sed -n 's/^params=//p')"
  if [ "$forge_params" != "$torch_params" ]; then
    log "$name: the models differ: Forge has $forge_params parameters, PyTorch $torch_params"
    exit 1
  fi
  # Suites that train part of the model (lora, distill: the student, not the teacher) also print
  # trainable=N: those must agree too.
  torch_trainable="$(printf '%s\n' "$torch_counts" | tr ' ' '\n' | sed -n 's/^trainable=//p')"
  if [ -n "$torch_trainable" ]; then
    if [ "$forge_trainable" != "$torch_trainable" ]; then
      log "$name: Forge trains $forge_trainable parameters, PyTorch $torch_trainable"
      exit 1
    fi
    log "$name: trainable parameters forge=$forge_trainable torch=$torch_trainable"
  fi
  best_forge=0 best_torch=0 forge_mb="" torch_mb=""
  for ((round = 0; round < rounds; round++)); do
    dir="$tmp/$name.forge$round"
    run_forge "$config" "$dir" "${overrides[@]}"
    read -r f f_total < <(forge_rate "$dir/metrics.jsonl" "$per_step")
    mb="$(awk '{ printf "%.1f", $1 / 1024 }' "$dir.rss")"
    run_torch "$tmp/$name.yaml" "$tmp/$name.torch$round"
    t="$(field "$tmp/$name.torch$round" "${unit}_s")"
    log "$name round $((round + 1)): forge $f $unit/s (overall $f_total) ${mb} MB," \
        "torch $t $unit/s (overall $(field "$tmp/$name.torch$round" "${unit}_s_total"))" \
        "$(field "$tmp/$name.torch$round" peak_mb) MB (load $(cut -d' ' -f1 /proc/loadavg))"
    awk -v a="$f" -v b="$best_forge" 'BEGIN { exit !(a > b) }' && best_forge="$f"
    awk -v a="$t" -v b="$best_torch" 'BEGIN { exit !(a > b) }' && best_torch="$t"
    [ -z "$forge_mb" ] && forge_mb="$mb" torch_mb="$(field "$tmp/$name.torch$round" peak_mb)"
  done
  # The parameters Forge actually trained, from its checkpoint (tied weights stored once).
  stored="$(stored_params "$tmp/$name.forge0")"
  log "$name: parameters forge=$forge_params (checkpoint $stored) torch=$torch_params;" \
      "$n_steps timed steps after $n_warmup, $per_step $unit each"
  awk -v c="$name" -v f="$best_forge" -v t="$best_torch" -v fm="$forge_mb" -v tm="$torch_mb" \
      -v u="$unit" -v per_step="$per_step" -v est="$forge_est_mb" '
    BEGIN {
      if (u == "tok") rates = sprintf("forge_tok_s=%.0f torch_tok_s=%.0f ratio=%.2f", f, t, f / t)
      else rates = sprintf("forge_%s_s=%.1f torch_%s_s=%.1f ratio=%.2f", u, f, u, t, f / t)
      printf "config=%s %s forge_step_ms=%.1f torch_step_ms=%.1f forge_peak_mb=%s torch_peak_mb=%s" \
             " forge_est_mb=%s\n", c, rates, 1000 * per_step / f, 1000 * per_step / t, fm, tm, est
    }'
  after_config "$config" "$name"
done
log "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
