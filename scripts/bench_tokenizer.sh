#!/usr/bin/env bash
# The `tokenizer` suite of scripts/bench: encodes the same 10 MB of text (data/samples/
# tinyshakespeare.txt repeated) with Forge's `gpt2` tokenizer and with the npm packages `tiktoken`
# (Rust compiled to WASM) and `js-tiktoken` under node, each single-threaded in its own process, and
# prints
#   forge_mb_s=X tiktoken_mb_s=Y ratio=X/Y js_tiktoken_mb_s=Z
#   forge_load_ms=A tiktoken_load_ms=B js_tiktoken_load_ms=C
#   forge_tokens=N tiktoken_tokens=N js_tiktoken_tokens=N
# then against Hugging Face's `tokenizers` (npm, its Rust library as a native module), both sides
# encoding the text in 4 KB chunks (cut at line ends; the size at which tokenizers was fastest,
# twice its rate on 64 KB) one after another, one line per vocabulary:
#   hf_gpt2 forge_tokens_s=X hf_tokens_s=Y ratio=X/Y tokens=N
#   hf_gpt2_json forge_tokens_s=X hf_tokens_s=Y ratio=X/Y tokens=N
#   hf_llama3 forge_tokens_s=X hf_tokens_s=Y ratio=X/Y tokens=N
# hf_gpt2 is Forge's gpt2 files against GPT-2's tokenizer.json as the hub publishes it,
# hf_gpt2_json Forge reading that same file, hf_llama3 both reading tests/golden/tokenizers/llama3.
# forge_tokens_s=unsupported when this Forge cannot read the tokenizer.json.
# MB/s = 1e6 bytes per second, tokens/s = tokens per second, of the median of --repeats encodes;
# load = the vocabulary (and for node the module) loading once. Token counts that differ are a
# warning line and exit status 1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

usage() {
  cat <<'EOF'
usage: scripts/bench_tokenizer.sh [--repeats N] [--mb N]

  --repeats N   encodes of the whole text per encoder, the median reported; default 3
  --mb N        text size in MB (1e6 bytes); default 10

The npm packages are installed once into ${XDG_CACHE_HOME:-$HOME/.cache}/forge-bench-npm.
EOF
}

bad_usage() { echo "bench_tokenizer: $1" >&2; usage >&2; exit 2; }
repeats=3
mb=10
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --repeats | --mb)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || bad_usage "--repeats wants N >= 1, got '$repeats'"
[[ "$mb" =~ ^[1-9][0-9]*$ ]] || bad_usage "--mb wants N >= 1, got '$mb'"

command -v node >/dev/null || forge_install_missing nodejs
command -v npm >/dev/null || forge_install_missing npm
npm_dir="${XDG_CACHE_HOME:-$HOME/.cache}/forge-bench-npm"
if [ ! -f "$npm_dir/node_modules/tiktoken/package.json" ] ||
  [ ! -f "$npm_dir/node_modules/js-tiktoken/package.json" ] ||
  [ ! -f "$npm_dir/node_modules/tokenizers/package.json" ]; then
  echo "bench_tokenizer: installing npm tiktoken, js-tiktoken and tokenizers into $npm_dir" >&2
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund tiktoken js-tiktoken tokenizers >&2 ||
    { echo "bench_tokenizer: npm install failed" >&2; exit 1; }
fi
for p in tiktoken js-tiktoken tokenizers; do
  echo "bench_tokenizer: $p $(node -p "require('$npm_dir/node_modules/$p/package.json').version")" >&2
done

forge_build bench_tokenizer_forge
forge_bin="$FORGE_BUILD/bench_tokenizer_forge"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/forge_bench_tokenizer.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# tinyshakespeare is ASCII, so cutting at any byte leaves valid UTF-8 for node's string.
text="$tmp/text.txt"
size=$((mb * 1000000))
: >"$text"
while [ "$(stat -c %s "$text")" -lt "$size" ]; do cat "$FORGE_ROOT/data/samples/tinyshakespeare.txt" >>"$text"; done
truncate -s "$size" "$text"

cd "$FORGE_ROOT"  # scripts/bench_tokenizer.mjs below is named relative to it
forge_out="$(OMP_NUM_THREADS=1 "$forge_bin" "$text" "$repeats")"
tiktoken_out="$(NODE_PATH="$npm_dir/node_modules" node scripts/bench_tokenizer.mjs tiktoken "$text" "$repeats")"
js_out="$(NODE_PATH="$npm_dir/node_modules" node scripts/bench_tokenizer.mjs js-tiktoken "$text" "$repeats")"

field() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
awk -v f="$(field "$forge_out" mb_s)" -v t="$(field "$tiktoken_out" mb_s)" \
  -v j="$(field "$js_out" mb_s)" \
  'BEGIN { printf "forge_mb_s=%.2f tiktoken_mb_s=%.2f ratio=%.2f js_tiktoken_mb_s=%.2f\n", f, t, f / t, j }'
echo "forge_load_ms=$(field "$forge_out" load_ms) tiktoken_load_ms=$(field "$tiktoken_out" load_ms)" \
  "js_tiktoken_load_ms=$(field "$js_out" load_ms)"
forge_tokens="$(field "$forge_out" tokens)"
tiktoken_tokens="$(field "$tiktoken_out" tokens)"
js_tokens="$(field "$js_out" tokens)"
echo "forge_tokens=$forge_tokens tiktoken_tokens=$tiktoken_tokens js_tiktoken_tokens=$js_tokens"
status=0
if [ "$forge_tokens" != "$tiktoken_tokens" ] || [ "$forge_tokens" != "$js_tokens" ]; then
  echo "warning: token counts differ; the encoders disagree on this text"
  status=1
fi

# Hugging Face's tokenizers. A directory holding only tokenizer.json makes Forge read that file.
chunk=4096
mkdir -p "$tmp/gpt2_json"
NODE_PATH="$npm_dir/node_modules" node scripts/bench_tokenizer.mjs gpt2-json \
  data/tokenizers/gpt2/encoder.json data/tokenizers/gpt2/vocab.bpe "$tmp/gpt2_json/tokenizer.json"
hf_row() {  # NAME TOKENIZER.JSON FORGE_TOKENIZER
  local hf_out hf_tokens forge_row
  hf_out="$(RAYON_NUM_THREADS=1 NODE_PATH="$npm_dir/node_modules" \
    node scripts/bench_tokenizer.mjs tokenizers "$2" "$text" "$repeats" "$chunk")"
  hf_tokens="$(field "$hf_out" tokens)"
  if ! forge_row="$(OMP_NUM_THREADS=1 "$forge_bin" "$text" "$repeats" "$3" "$chunk" 2>"$tmp/err")"
  then
    echo "$1 forge_tokens_s=unsupported hf_tokens_s=$(field "$hf_out" tokens_s)" \
      "tokens=$hf_tokens ($(head -c 200 "$tmp/err"))"
    return
  fi
  awk -v n="$1" -v f="$(field "$forge_row" tokens_s)" -v h="$(field "$hf_out" tokens_s)" \
    -v t="$hf_tokens" 'BEGIN {
      printf "%s forge_tokens_s=%.0f hf_tokens_s=%.0f ratio=%.2f tokens=%s\n", n, f, h, f / h, t
    }'
  if [ "$(field "$forge_row" tokens)" != "$hf_tokens" ]; then
    echo "warning: $1: forge gives $(field "$forge_row" tokens) tokens, tokenizers $hf_tokens"
    status=1
  fi
}
hf_row hf_gpt2 "$tmp/gpt2_json/tokenizer.json" gpt2
hf_row hf_gpt2_json "$tmp/gpt2_json/tokenizer.json" "$tmp/gpt2_json"
hf_row hf_llama3 tests/golden/tokenizers/llama3/tokenizer.json tests/golden/tokenizers/llama3
exit "$status"
