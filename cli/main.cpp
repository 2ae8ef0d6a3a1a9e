// The forge command line: parses the subcommand and its options, dispatches to the recipe the
// config names through the registry (registry.h), and turns every forge::Error into one line on
// stderr and the exit code of README.md. Nothing here knows how a recipe trains.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <sched.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/comm.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/kernels/isa.h"
#include "core/output_path.h"
#include "data/bpe_train.h"
#include "data/chat_sft.h"
#include "data/jsonl.h"
#include "data/prepare.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "formats/gguf_export.h"
#include "formats/hf_model.h"
#include "recipes/catalog.h"
#include "recipes/lm_objective.h"
#include "runtime/registry.h"
#include "runtime/report.h"
#include "runtime/run_directory.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: forge COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [key.path=value ...]   run the recipe a YAML config names (resumes from the\n"
    "                                      run directory's latest checkpoint)\n"
    "  validate CONFIG [key.path=value ...]  check a config, print it resolved with the parameter\n"
    "                                      count and a peak-memory estimate; trains nothing\n"
    "  eval CONFIG-or-RUN-DIR-or-CHECKPOINT   validation metrics of the latest checkpoint\n"
    "                                      (loss, perplexity and the recipe's task accuracies)\n"
    "  eval MODEL-DIR --data FILE          a Hugging Face model directory scored on FILE\n"
    "  generate --checkpoint RUN-DIR-or-FILE --prompt TEXT [--max-new-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop TEXT]\n"
    "  generate --checkpoint RUN-DIR-or-FILE --prompts FILE [--num-samples K] [--batch-size N]\n"
    "           [--output FILE.jsonl] [sampling options]   JSONL samples with log-probabilities\n"
    "  generate --checkpoint RUN-DIR-or-FILE (--chat FILE.json | --user TEXT [--system TEXT])\n"
    "           [sampling options]       the assistant's reply, by the model's chat template\n"
    "  predict --checkpoint RUN --input FILE   a classifier's label and probability per line or\n"
    "                                      JSONL record of FILE\n"
    "  inspect CHECKPOINT                  print step, config and parameters; verify integrity\n"
    "  report RUN-DIR... --output FILE.html   runs' curves overlaid on one page (bf16 beside fp32)\n"
    "  export --checkpoint RUN --merge --output FILE.h5   a LoRA run merged into a plain checkpoint\n"
    "  export --checkpoint RUN --format hf|peft --output DIR   Hugging Face model or PEFT adapters\n"
    "  export --checkpoint RUN --format gguf --output FILE.gguf   a GPT for llama.cpp\n"
    "  tokenize --tokenizer NAME-or-DIR (--text STR | --input FILE) [--decode]\n"
    "  prepare --tokenizer NAME-or-DIR --input FILE... --output FILE.h5-or-DIR [--records FORMAT]\n"
    "          [--shard-tokens N] [--force]   a token dataset, one file or a shard directory\n"
    "  tokenizer train --vocab-size N --input FILE... --output DIR   learn a GPT-2-style BPE\n";

constexpr const char* kUsageTail =
    "\n"
    "forge COMMAND --help prints the usage of one command; forge --version the version and the\n"
    "instruction sets the kernels run with. Exit codes: 0 ok, 1 internal error,\n"
    "2 usage or config error, 3 data error, 4 checkpoint error, 5 non-finite loss or gradient,\n"
    "130/143 stopped by SIGINT/SIGTERM after writing a checkpoint.\n"
    "\n"
    "recipes (the config's `recipe` key):\n";

// kUsage, the recipes' own commands, kUsageTail and one line per recipe of the registry.
std::string usage_text() {
  std::string out = kUsage;
  for (const RecipeSpec& recipe : recipe_registry())
    for (const RecipeCommand& command : recipe.commands)
      out += "  " + command.name + " " + command.summary + "\n";
  out += kUsageTail;
  for (const RecipeSpec& recipe : recipe_registry()) {
    std::string name = "  " + recipe.name;
    out += name + std::string(name.size() < 38 ? 38 - name.size() : 1, ' ') + recipe.doc + "\n";
  }
  return out;
}

const std::map<std::string, std::string> kCommandUsage = {
    {"train",
     "usage: forge train CONFIG [key.path=value ...] [--ignore-memory-check]\n"
     "                  [--use-existing-dir]\n"
     "Trains the recipe CONFIG names. Overrides use dotted paths (optimizer.lr=3e-4, a list as\n"
     "[a,b]). The run directory (output_dir) receives config.yaml, metrics.jsonl, checkpoints/ and\n"
     "report.html; a second run resumes from its latest checkpoint unless train.resume=never.\n"
     "An output_dir that exists, is not empty and is not a run directory (no .forge-run) is\n"
     "refused with exit 2; --use-existing-dir trains into it anyway, marking it as a run.\n"
     "Before building models the memory estimate of forge validate is compared with the\n"
     "machine's memory (MemAvailable, the cgroup's memory.max); a run that would not fit stops\n"
     "with exit 2 unless given --ignore-memory-check.\n"},
    {"validate",
     "usage: forge validate CONFIG [key.path=value ...]\n"
     "Checks every key, file and shape, prints the resolved config, the parameter count and an\n"
     "estimate of peak training memory. Trains nothing.\n"},
    {"eval",
     "usage: forge eval CONFIG-or-RUN-DIR-or-CHECKPOINT [--ignore-memory-check]\n"
     "       forge eval MODEL-DIR --data FILE\n"
     "Validation metrics of the run's latest checkpoint as its recipe defines them: loss and\n"
     "perplexity over the validation split, and the recipe's task metrics (docs/recipes/). A\n"
     "run directory is scored on its own checkpoints, a checkpoint file (.h5, e.g. an export\n"
     "--merge) with the config stored in it, a config on the latest checkpoint of its\n"
     "output_dir. A Hugging Face model directory (config.json + model.safetensors) is scored on\n"
     "all of FILE.\n"},
    {"generate",
     "usage: forge generate --checkpoint RUN-DIR-or-FILE --prompt TEXT [options]\n"
     "       forge generate --checkpoint RUN-DIR-or-FILE --prompts FILE [--num-samples K]\n"
     "                      [--batch-size N] [--output FILE.jsonl] [options]\n"
     "       forge generate --checkpoint RUN-DIR-or-FILE --chat FILE.json [options]\n"
     "       forge generate --checkpoint RUN-DIR-or-FILE --user TEXT [--system TEXT] [options]\n"
     "  --max-new-tokens N   tokens to generate (default 200)\n"
     "  --temperature T      0 = greedy (default 0.8)\n"
     "  --top-k K            keep the K most likely tokens, 0 = all (default 200)\n"
     "  --top-p P            nucleus sampling, 1 = off (default 1)\n"
     "  --seed S             the same seed gives the same text (default 0)\n"
     "  --stop TEXT          end the sample after the first TEXT it generates (e.g. an SFT\n"
     "                       run's finetune.end_of_text)\n"
     "--prompt prints the prompt and its sample; past the model context it slides a window.\n"
     "--prompts FILE samples every prompt of FILE (one a line, or a .jsonl file of\n"
     "{\"prompt\": \"...\"} objects) K times (--num-samples, default 1), N rows a forward\n"
     "(--batch-size, default 64), and writes one JSON object a sample to stdout or to --output\n"
     "(replaced whole at the end): {\"prompt\", \"prompt_index\", \"sample_index\",\n"
     "\"completion\", \"tokens\", \"logprob\", \"finished\"}. logprob sums the completion\n"
     "tokens' log-probabilities under the model (temperature 1, no top-k/top-p), the stop text's\n"
     "tokens included; finished says it ended at the stop text. A sample depends on (seed,\n"
     "prompt index, sample index), not on the batch size. Every prompt plus --max-new-tokens\n"
     "must fit the model context; that, and the completions and one batch fitting memory, are\n"
     "checked before the model loads. Progress and tokens/s go to stderr. A model whose\n"
     "vocabulary is padded past its tokenizer's samples only ids the tokenizer decodes.\n"
     "RUN-DIR-or-FILE may be a LoRA run: its base is loaded and the adapters applied.\n"
     "--chat FILE.json answers a conversation {\"messages\": [{\"role\": \"system\"|\"user\"|\n"
     "\"assistant\", \"content\": \"...\"}, ...]} (a line of multi-turn SFT data); --user TEXT\n"
     "is one user message, after --system TEXT when given. The conversation is rendered by the\n"
     "model's chat template (data.chat_template, else the tokenizer_config.json of its tokenizer\n"
     "or hub directory) with the generation prompt, and only the reply is printed: it ends at\n"
     "the text the template writes after an assistant turn, the template's eos_token or an\n"
     "eos_token_id of the hub directory's generation_config.json, none of which is printed.\n"},
    {"tokenize",
     "usage: forge tokenize --tokenizer NAME-or-DIR (--text STR | --input FILE) [--decode]\n"
     "Prints the token ids of the text separated by spaces; with --decode the text (or file) holds\n"
     "ids and the decoded text is printed. NAME is bytes or gpt2, or a directory holding\n"
     "encoder.json + vocab.bpe or vocab.json + merges.txt (byte-level BPE) or vocab.txt (BERT's\n"
     "WordPiece, which decodes to its tokens joined by spaces rather than the original text).\n"},
    {"prepare",
     "usage: forge prepare --tokenizer NAME-or-DIR --input FILE [FILE...] --output FILE.h5-or-DIR\n"
     "                     [--records file|percent|lines] [--shard-tokens N] [--force]\n"
     "Tokenizes text files into an HDF5 token dataset (docs/data-format.md). Documents are whole\n"
     "files (default), '%'-separated records (the fortunes format) or lines. Inputs are read in\n"
     "blocks, so they may be larger than memory, and encoded on every core (OMP_NUM_THREADS);\n"
     "any thread count gives the same dataset. --shard-tokens N (suffixes k, M, G) writes a\n"
     "directory of shards instead of one file, each ending at the first document boundary at or\n"
     "past N tokens. The output appears only when complete; an existing one is replaced only with\n"
     "--force (a directory only if it is a shard directory prepare wrote), never when it is or\n"
     "holds an input. Progress goes to stderr, a summary with tokens/s and MB/s at the end.\n"},
    {"tokenizer",
     "usage: forge tokenizer train --vocab-size N --input FILE [FILE...] --output DIR\n"
     "Learns byte-level BPE merges with GPT-2's pre-tokenisation and writes encoder.json and\n"
     "vocab.bpe to DIR; the result loads wherever a tokenizer is named (--tokenizer DIR). The same\n"
     "vocabulary also goes to DIR/tokenizer.json, which Hugging Face's tokenizers library loads\n"
     "and which gives the same ids. The same input gives the same files.\n"},
    {"export",
     "usage: forge export --checkpoint RUN-DIR-or-FILE --merge --output FILE.h5\n"
     "       forge export --checkpoint RUN-DIR-or-FILE --format hf|peft [--dtype f32|bf16|f16]\n"
     "                    --output DIR\n"
     "       forge export --checkpoint RUN-DIR-or-FILE --format gguf --output FILE.gguf\n"
     "--merge writes a LoRA run's model with the adapters merged into the base weights\n"
     "(W + alpha/r B A) as a plain checkpoint that generate, eval, inspect and model.init_from\n"
     "take like any other. --format hf writes config.json, model.safetensors and the tokenizer's\n"
     "files as transformers loads a GPT-2, a Llama (a rotary GPT; Qwen2 with q/k/v biases) or a\n"
     "BERT (a LoRA run merged), in the dtype of the hub weights the run started from (f32 if\n"
     "none) or --dtype's; --format peft writes a LoRA run's adapters as PEFT's\n"
     "adapter_config.json and adapter_model.safetensors (f32 unless --dtype); --format gguf\n"
     "writes a GPT (a LoRA run merged) as GGUF for llama.cpp's gpt2, llama or qwen2 architecture,\n"
     "in f32, with the run's vocabulary (bytes as a byte-level BPE without merges): llama-cli -m\n"
     "FILE.gguf -p TEXT. See docs/interop.md.\n"},
    {"predict",
     "usage: forge predict --checkpoint RUN-DIR-or-FILE --input FILE\n"
     "Runs a trained model of a recipe that predicts (classify) on FILE: one text per non-blank\n"
     "line, or a .jsonl file of {\"text\": ...} records (a \"label\" field is allowed and ignored).\n"
     "Prints one line per text: the predicted label, a tab, and its probability.\n"},
    {"report",
     "usage: forge report RUN-DIR [RUN-DIR ...] --output FILE.html\n"
     "Writes one self-contained page comparing the runs: a summary row per run (recipe,\n"
     "train.precision, steps, final and best losses, tokens/s, wall time), the train and the\n"
     "validation loss of every run on shared axes, and every other metric with a line per run.\n"
     "Reads each run's metrics.jsonl and config.yaml; FILE.html may not lie inside a run\n"
     "directory. Each run's own report.html is written by forge train.\n"},
    {"inspect",
     "usage: forge inspect CHECKPOINT\n"
     "Prints the step, the resolved config and every parameter with its shape, and verifies the\n"
     "checksum of every tensor. CHECKPOINT is a .h5 file, a run directory or a Hugging Face\n"
     "model directory (config.json + model.safetensors).\n"},
};

[[noreturn]] void usage_error(const std::string& message) { throw Error(ExitCode::usage, message); }

// Splits `args` into positionals and --name value options; `flags` lists the allowed options.
// An option given twice is refused: which of the two was meant (a second --output, a second
// --prompt) cannot be guessed, and keeping either silently drops the other.
struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
};
ParsedArgs parse_args(const std::string& command, const std::vector<std::string>& args,
                      const std::vector<std::string>& flags) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      parsed.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      usage_error(detail::concat(command, ": option --", name, " needs a value"));
    }
    if (std::find(flags.begin(), flags.end(), name) == flags.end())
      usage_error(detail::concat(command, ": unknown option --", name, " (see forge ", command,
                                 " --help)"));
    if (!parsed.options.emplace(name, value).second)
      usage_error(detail::concat(command, ": option --", name, " given twice"));
  }
  return parsed;
}

double number_option(const ParsedArgs& p, const std::string& name, double fallback) {
  return CommandOptions{p.options}.number(name, fallback);
}

int64_t integer_option(const ParsedArgs& p, const std::string& name, int64_t fallback) {
  return CommandOptions{p.options}.integer(name, fallback);
}

RunConfig config_from_args(const std::string& command, const std::vector<std::string>& args) {
  if (args.empty()) usage_error(command + ": missing CONFIG (see forge " + command + " --help)");
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i].find('=') == std::string::npos || args[i].rfind("--", 0) == 0)
      usage_error(detail::concat(command, ": expected key.path=value, got '", args[i], "'"));
  return load_config(args[0], {args.begin() + 1, args.end()});
}

// Removes `flag` (an option without a value, e.g. --force) from args; whether it was there. Given
// twice, it is refused as parse_args refuses a repeated option.
bool take_flag(std::vector<std::string>& args, const std::string& flag) {
  const size_t count = std::erase(args, flag);
  if (count > 1) usage_error(detail::concat("option ", flag, " given twice"));
  return count > 0;
}

int cmd_train(const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  const bool ignore_memory = take_flag(rest, "--ignore-memory-check");
  const bool use_existing_dir = take_flag(rest, "--use-existing-dir");
  RunConfig config = config_from_args("train", rest);
  const std::vector<std::string> named = config_input_paths(config);
  check_output_path("train: output_dir", config.output_dir, {named.begin(), named.end()},
                    OutputShape::directory);
  resolve_precision(config.train);  // refused before anything is written or built
  claim_output_dir(config.output_dir, use_existing_dir);
  const RecipeSpec& recipe = find_recipe(config.recipe);
  std::optional<MemoryLimit> limit = machine_memory();
  // Ranks that share a machine share its memory.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (limit && local && std::atol(local) > 1) {
    limit->bytes /= double(std::atol(local));
    limit->source += detail::concat(", shared by ", local, " ranks on this machine");
  }
  MemoryEstimate estimate = recipe.estimate(config);
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (world && config.train.shard_optimizer)
    estimate = sharded_optimizer_estimate(estimate, std::atol(world));
  check_memory(estimate, limit, ignore_memory);
  return recipe.train(config);
}

int cmd_validate(const std::vector<std::string>& args) {
  RunConfig c = config_from_args("validate", args);
  MemoryEstimate e = find_recipe(c.recipe).estimate(c);
  double total = total_bytes(e);
  std::fputs(to_yaml(c).c_str(), stdout);
  std::printf("# parameters: %lld\n", (long long)e.parameters);
  std::printf("# trainable parameters: %lld (%.2f%%)\n", (long long)e.trainable_parameters,
              e.parameters ? 100.0 * double(e.trainable_parameters) / double(e.parameters) : 0.0);
  if (c.model.arch == "gpt" && c.model.moe_every > 0)
    std::printf("# parameters a token passes through (MoE: its router and top_k experts): %lld\n",
                (long long)nn::gpt_active_parameters(gpt_config(c.model)));
  std::printf("# estimated peak training memory: %.1f MiB (weights+grads+optimizer %.1f, "
              "activations %.1f, logits %.1f)\n",
              total / 1048576.0, e.state_bytes / 1048576.0, e.activation_bytes / 1048576.0,
              e.logits_bytes / 1048576.0);
  if (is_hf_directory(c.model.init_from))
    std::printf("# model.init_from %s: %s\n", c.model.init_from.c_str(),
                hf_load_summary(c.model.init_from).c_str());
  if (std::optional<MemoryLimit> limit = machine_memory())
    std::printf("# machine memory: %.1f MiB (%s); the estimate %s\n", limit->bytes / 1048576.0,
                limit->source.c_str(),
                total <= limit->bytes ? "fits" : "exceeds it: forge train stops unless given "
                                                 "--ignore-memory-check");
  return 0;
}

int cmd_eval(const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  const bool ignore_memory = take_flag(rest, "--ignore-memory-check");
  std::vector<std::string> names = {"data"};
  for (const RecipeSpec& r : recipe_registry())
    for (const auto& [name, help] : r.eval_options)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  ParsedArgs p = parse_args("eval", rest, names);
  if (p.positional.size() != 1)
    usage_error("eval: expected one CONFIG, RUN-DIR or MODEL-DIR (see forge eval --help)");
  fs::path target = p.positional[0];
  RunConfig config;
  fs::path file;
  if (is_hf_directory(target)) {
    // A model from elsewhere has no validation split of its own: the whole --data file is one.
    if (!p.options.count("data"))
      usage_error("eval: " + target.string() +
                  " is a Hugging Face model directory: name the text to score with --data FILE");
    // The file is checked once, as data.train, and then serves as data.val too: an override of
    // each would report one bad --data path twice.
    config = load_config_string(read_checkpoint_info(target).config_yaml, target.string(),
                                {"data.train=" + p.options.at("data")});
    config.data.val = config.data.train;
    file = target;
  } else {
    if (p.options.count("data"))
      usage_error("eval: --data is for a Hugging Face model directory; a run is scored on its "
                  "own validation split");
    if (is_checkpoint_file(target)) {
      // A checkpoint file (an exported merge, a step of a run) carries the config it was
      // trained with.
      config = load_config_string(read_checkpoint_info(target).config_yaml, target.string(), {});
      file = target;
    } else if (std::error_code ec; fs::is_directory(target, ec)) {
      // The run directory named, not the output_dir its config.yaml names: a copied or moved run
      // is scored on its own checkpoints.
      config = load_config((target / "config.yaml").string());
      file = resolve_checkpoint(target);
    } else {
      config = load_config(target.string());
    }
  }
  // The training estimate bounds evaluation's memory from above: a config whose training fits
  // evaluates too.
  const RecipeSpec& recipe = find_recipe(config.recipe);
  check_memory(recipe.estimate(config), machine_memory(), ignore_memory);
  CommandOptions options;
  for (const auto& [name, value] : p.options) {
    if (name == "data") continue;
    bool known = false;
    for (const auto& option : recipe.eval_options) known = known || option.first == name;
    if (!known)
      usage_error(detail::concat("eval: --", name, " is not an option of a ", config.recipe,
                                 " run (see forge eval --help)"));
    options.values[name] = value;
  }
  if (file.empty()) file = resolve_checkpoint(config.output_dir);
  return recipe.eval(config, file, options);
}

int cmd_predict(const std::vector<std::string>& args) {
  ParsedArgs p = parse_args("predict", args, {"checkpoint", "input"});
  if (!p.positional.empty()) usage_error("predict: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("checkpoint")) usage_error("predict: --checkpoint is required");
  if (!p.options.count("input")) usage_error("predict: --input is required");
  const fs::path file = resolve_checkpoint(p.options.at("checkpoint"));
  const RunConfig stored = stored_config(file);
  const RecipeSpec& recipe = find_recipe(stored.recipe);
  if (!recipe.predict)
    usage_error("predict: " + file.string() + " is a " + stored.recipe +
                " checkpoint; predict takes a model of a recipe that predicts labels (classify)");
  return recipe.predict(stored, file, p.options.at("input"));
}


// forge generate --prompts: K samples of every prompt in batches, one JSON record a sample on
// stdout or, written atomically at the end, in --output.
int generate_batched(const ParsedArgs& p, nn::SamplingOptions sampling, nn::BatchOptions options) {
  const fs::path file = resolve_checkpoint(p.options.at("checkpoint"));
  if (p.options.count("output")) {
    std::vector<fs::path> inputs = checkpoint_inputs(p.options.at("checkpoint"), file);
    inputs.push_back(p.options.at("prompts"));
    check_output_path("generate: --output", p.options.at("output"), inputs, OutputShape::file);
  }
  const std::vector<std::string> prompts =
      read_texts(p.options.at("prompts"), {"prompt", "a prompt record", {"prompt"}}, "prompt");
  // The flags are checked against the prompts and the stored config before the model loads: a
  // sample count, batch or length that cannot fit fails at once, not after the load.
  const RunConfig stored = stored_config(file);
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(stored.data.tokenizer, stored.data.special_tokens);
  sampling.vocab_limit = tokenizer->vocab_size();
  const std::vector<std::vector<int64_t>> ids = encode_prompts(prompts, *tokenizer);
  nn::check_prompts(ids, stored.model.context, stored.model.vocab_size, sampling);
  check_generation_memory(stored.model, ids, sampling, options, machine_memory(), "generate");
  LoadedGPT loaded = load_gpt(file);
  if (auto stop = p.options.find("stop"); stop != p.options.end()) {
    std::vector<int32_t> eot = end_of_text_ids(*tokenizer, stop->second);
    options.end_of_text.assign(eot.begin(), eot.end());
  }
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double last_report = 0;
  options.progress = [&](int64_t done, int64_t total, int64_t tokens) {
    const double t = seconds();
    if (done < total && t - last_report < 2.0) return;
    last_report = t;
    std::fprintf(stderr, "generate: %lld/%lld samples, %lld tokens, %.0f tok/s\n",
                 (long long)done, (long long)total, (long long)tokens, t > 0 ? tokens / t : 0.0);
  };
  const std::vector<nn::Completion> completions =
      nn::generate_batch(*loaded.model, ids, sampling, options);
  const double elapsed = seconds();
  const std::string jsonl = completion_records(prompts, completions, *tokenizer);
  int64_t tokens = 0, finished = 0;
  for (const nn::Completion& c : completions) {
    tokens += int64_t(c.tokens.size());
    finished += c.finished;
  }
  if (p.options.count("output"))
    write_file_atomic(p.options.at("output"), jsonl, ExitCode::usage);
  else
    std::fwrite(jsonl.data(), 1, jsonl.size(), stdout);
  std::fprintf(stderr,
               "generate: %zu samples of %zu prompts, %lld tokens in %.2f s (%.0f tok/s), %lld "
               "ended at the stop text\n",
               completions.size(), prompts.size(), (long long)tokens, elapsed,
               elapsed > 0 ? double(tokens) / elapsed : 0.0, (long long)finished);
  return 0;
}

// forge generate --chat FILE, or --user TEXT [--system TEXT]: the conversation rendered by the
// model's chat template with the generation prompt, sampled until the template's end-of-turn
// text or an end-of-turn id, and only the reply printed (without the end-of-turn).
int generate_chat(const ParsedArgs& p, nn::SamplingOptions o) {
  std::vector<ChatMessage> messages;
  if (p.options.count("chat")) {
    messages = read_chat_json(p.options.at("chat"));
  } else {
    if (auto system = p.options.find("system"); system != p.options.end())
      messages.push_back({"system", system->second});
    messages.push_back({"user", p.options.at("user")});
  }
  const fs::path file = resolve_checkpoint(p.options.at("checkpoint"));
  LoadedGPT loaded = load_gpt(file);
  const DataConfig& data = loaded.config.data;
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(data.tokenizer, data.special_tokens);
  o.vocab_limit = tokenizer->vocab_size();
  // The hub directory the model came from holds its template and generation_config.json.
  const fs::path& init_from = loaded.config.model.init_from;
  const fs::path hub = is_hf_directory(file)        ? file
                       : is_hf_directory(init_from) ? init_from
                                                    : fs::path();
  const ChatTemplate chat_template =
      find_chat_template(data.chat_template, {data.tokenizer, hub}, "data.chat_template");
  const ReplyEnd end = reply_end(chat_template, *tokenizer, hub);
  const std::vector<int32_t> ids = tokenizer->encode(chat_template.render(messages, true));
  // Generation slides its window past a long prompt, which here would drop the conversation's
  // start (its system message) without a word; so the prompt must fit, and the reply stops where
  // the context is full.
  const int64_t context = loaded.config.model.context;
  if (int64_t(ids.size()) >= context)
    throw Error(ExitCode::data,
                detail::concat("generate --chat: the conversation renders to ", ids.size(),
                               " tokens, but the model's context holds ", context,
                               " (the reply needs room after it)"));
  o.max_new_tokens = std::min<int64_t>(o.max_new_tokens, context - int64_t(ids.size()));
  std::vector<int64_t> reply;
  auto ends = [&](int64_t token) {
    reply.push_back(token);
    if (std::find(end.ids.begin(), end.ids.end(), token) != end.ids.end()) {
      reply.pop_back();
      return true;
    }
    return !end.text.empty() &&
           tokenizer->decode({reply.begin(), reply.end()}).find(end.text) != std::string::npos;
  };
  nn::generate(*loaded.model, {ids.begin(), ids.end()}, o, ends);
  std::string text = tokenizer->decode({reply.begin(), reply.end()});
  if (!end.text.empty()) text = text.substr(0, text.find(end.text));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int cmd_generate(const std::vector<std::string>& args) {
  ParsedArgs p = parse_args("generate", args,
                            {"checkpoint", "prompt", "prompts", "num-samples", "batch-size",
                             "output", "max-new-tokens", "temperature", "top-k", "top-p", "seed",
                             "stop", "chat", "user", "system"});
  if (!p.positional.empty()) usage_error("generate: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("checkpoint")) usage_error("generate: --checkpoint is required");
  const bool batched = p.options.count("prompts") > 0;
  const bool chat = p.options.count("chat") || p.options.count("user");
  if (int(batched) + int(p.options.count("prompt") > 0) + int(p.options.count("chat") > 0) +
          int(p.options.count("user") > 0) > 1)
    usage_error("generate: give one of --prompt TEXT, --prompts FILE, --chat FILE, --user TEXT");
  if (p.options.count("system") && !p.options.count("user"))
    usage_error("generate: --system goes with --user TEXT");
  if (chat && p.options.count("stop"))
    usage_error("generate: a chat reply stops at the template's end of turn; --stop goes with "
                "--prompt or --prompts");
  for (const char* name : {"num-samples", "batch-size", "output"})
    if (!batched && p.options.count(name))
      usage_error(detail::concat("generate: --", name, " goes with --prompts FILE"));
  nn::SamplingOptions o;
  o.max_new_tokens = integer_option(p, "max-new-tokens", 200);
  o.temperature = number_option(p, "temperature", 0.8);
  o.top_k = integer_option(p, "top-k", 200);
  o.top_p = number_option(p, "top-p", 1.0);
  o.seed = uint64_t(integer_option(p, "seed", 0));
  nn::check_sampling(o);
  if (batched) {
    nn::BatchOptions b;
    b.num_samples = integer_option(p, "num-samples", 1);
    b.batch_size = integer_option(p, "batch-size", 64);
    nn::check_batch(b);
    return generate_batched(p, o, b);
  }
  if (chat) return generate_chat(p, o);
  std::string prompt = p.options.count("prompt") ? p.options.at("prompt") : "\n";
  LoadedGPT loaded = load_gpt(resolve_checkpoint(p.options.at("checkpoint")));
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(loaded.config.data.tokenizer, loaded.config.data.special_tokens);
  o.vocab_limit = tokenizer->vocab_size();  // a padded vocabulary's extra ids do not decode
  std::vector<int32_t> ids = tokenizer->encode(prompt);
  std::vector<int64_t> out = nn::generate(*loaded.model, {ids.begin(), ids.end()}, o);
  std::string text = tokenizer->decode_continuation(ids, {out.begin(), out.end()});
  // The sample ends at the first stop text (kept), as an SFT run's end-of-text marks a completion.
  if (auto stop = p.options.find("stop"); stop != p.options.end() && !stop->second.empty())
    if (size_t at = text.find(stop->second); at != std::string::npos)
      text.resize(at + stop->second.size());
  text = prompt + text;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int cmd_inspect(const std::vector<std::string>& args) {
  if (args.size() != 1) usage_error("inspect: expected one CHECKPOINT (see forge inspect --help)");
  fs::path file = resolve_checkpoint(args[0]);
  CheckpointInfo info = read_checkpoint_info(file);
  std::printf("checkpoint: %s\nstep: %lld\nformat_version: %lld\nforge_version: %s\n",
              file.c_str(), (long long)info.step, (long long)info.format_version,
              info.forge_version.c_str());
  if (is_hf_directory(file)) std::printf("%s\n", hf_load_summary(file).c_str());
  std::printf("parameters: %lld in %zu tensors\n", (long long)info.model_numel(), info.model.size());
  for (const TensorSpec& t : info.model)
    std::printf("  %-40s %-16s %s %lld\n", t.name.c_str(), shape_str(t.shape).c_str(),
                dtype_name(t.dtype), (long long)shape_numel(t.shape));
  std::printf("optimizer state: %lld values in %zu tensors\n", (long long)info.optim_numel(),
              info.optim.size());
  for (const auto& [name, ref] : info.references)
    std::printf("references %s: %s (%s)%s\n", name.c_str(), ref.path.c_str(), ref.digest.c_str(),
                name == "model" ? " - the base under these adapters" : "");
  for (const std::string& name : info.auxiliary)
    std::printf("auxiliary %s: trained beside the model (tensors %s.*)\n", name.c_str(),
                name.c_str());
  verify_checkpoint(file);
  std::printf("integrity: ok (every checksum verified)\n--- config ---\n%s", info.config_yaml.c_str());
  return 0;
}

int cmd_report(const std::vector<std::string>& args) {
  ParsedArgs p = parse_args("report", args, {"output"});
  if (p.positional.empty()) usage_error("report: expected one or more RUN-DIRs (see forge report --help)");
  if (!p.options.count("output")) usage_error("report: --output is required");
  const std::vector<fs::path> runs(p.positional.begin(), p.positional.end());
  check_output_path("report: --output", p.options.at("output"), runs, OutputShape::file);
  write_comparison(runs, p.options.at("output"));
  std::printf("%s\n", p.options.at("output").c_str());
  return 0;
}

int cmd_export(const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  const bool merge = take_flag(rest, "--merge");
  ParsedArgs p = parse_args("export", rest, {"checkpoint", "output", "format", "dtype"});
  if (!p.positional.empty()) usage_error("export: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("checkpoint")) usage_error("export: --checkpoint is required");
  if (!p.options.count("output")) usage_error("export: --output is required");
  const std::string format = p.options.count("format") ? p.options.at("format") : "";
  if (merge == !format.empty())
    usage_error("export: give either --merge or --format hf|peft|gguf (see forge export --help)");
  const bool into_directory = format == "hf" || format == "peft";
  std::optional<StoredFloat> dtype;
  if (p.options.count("dtype")) {
    const std::string& d = p.options.at("dtype");
    if (!into_directory) usage_error("export: --dtype is for --format hf and peft");
    if (d == "f32") dtype = StoredFloat::f32;
    else if (d == "bf16") dtype = StoredFloat::bf16;
    else if (d == "f16") dtype = StoredFloat::f16;
    else usage_error("export: unknown --dtype '" + d + "' (f32, bf16 or f16)");
  }
  fs::path file = resolve_checkpoint(p.options.at("checkpoint"));
  fs::path output = p.options.at("output");
  // The tokenizer's files are copied into a Hugging Face export: an input like the weights.
  std::vector<fs::path> inputs = checkpoint_inputs(p.options.at("checkpoint"), file);
  inputs.push_back(stored_config(file).data.tokenizer);
  check_output_path("export: --output", output, inputs,
                    into_directory ? OutputShape::directory : OutputShape::file);
  if (merge) {
    export_merged(file, output);
    std::printf("%s: %s with its adapters merged (a plain checkpoint)\n", output.c_str(),
                file.c_str());
  } else if (format == "hf") {
    const StoredFloat written = export_hf(file, output, dtype);
    std::printf("%s: %s as a Hugging Face model (config.json, model.safetensors in %s)\n",
                output.c_str(), file.c_str(), stored_float_name(written));
  } else if (format == "peft") {
    const StoredFloat written = export_peft(file, output, dtype);
    std::printf("%s: the LoRA adapters of %s as PEFT's adapter_config.json and "
                "adapter_model.safetensors (%s)\n", output.c_str(), file.c_str(),
                stored_float_name(written));
  } else if (format == "gguf") {
    const std::string arch = export_gguf(file, output);
    std::printf("%s: %s as GGUF (llama.cpp %s, f32)\n", output.c_str(), file.c_str(), arch.c_str());
  } else {
    usage_error("export: unknown --format '" + format + "' (hf, peft or gguf)");
  }
  return 0;
}

// Options that take several values (--input a b c) are collected until the next --option; the
// option itself is given once, as every other.
std::vector<std::string> multi_option(std::vector<std::string>& args, const std::string& command,
                                      const std::string& name) {
  std::vector<std::string> values, rest;
  bool seen = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--" + name) {
      rest.push_back(args[i]);
      continue;
    }
    if (seen)
      usage_error(detail::concat(command, ": option --", name, " given twice (it takes several "
                                 "files after one --", name, ")"));
    seen = true;
    while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) values.push_back(args[++i]);
  }
  args = rest;
  return values;
}

std::string read_text(const std::string& path) {
  return read_input_file(path, kCorpusInput);
}

int cmd_tokenize(const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  const bool decode = take_flag(rest, "--decode");
  ParsedArgs p = parse_args("tokenize", rest, {"tokenizer", "text", "input"});
  if (!p.positional.empty()) usage_error("tokenize: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("tokenizer")) usage_error("tokenize: --tokenizer is required");
  if (p.options.count("text") == p.options.count("input"))
    usage_error("tokenize: give exactly one of --text and --input");
  std::string text = p.options.count("text") ? p.options.at("text") : read_text(p.options.at("input"));
  std::unique_ptr<Tokenizer> tok = make_tokenizer(p.options.at("tokenizer"));
  if (decode) {
    std::vector<int32_t> ids;
    std::istringstream in(text);
    for (std::string word; in >> word;) {
      char* end = nullptr;
      long long v = std::strtoll(word.c_str(), &end, 10);
      if (*end || v < INT32_MIN || v > INT32_MAX)
        throw Error(ExitCode::data, "tokenize --decode: '" + word + "' is not a token id");
      ids.push_back(int32_t(v));
    }
    std::string out = tok->decode(ids);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  std::vector<int32_t> ids = tok->encode(text);
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
  std::printf("\n");
  return 0;
}

int cmd_prepare(const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  const bool force = take_flag(rest, "--force");
  std::vector<std::string> inputs = multi_option(rest, "prepare", "input");
  ParsedArgs p = parse_args("prepare", rest, {"tokenizer", "output", "records", "shard-tokens"});
  if (!p.positional.empty()) usage_error("prepare: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("tokenizer")) usage_error("prepare: --tokenizer is required");
  if (!p.options.count("output")) usage_error("prepare: --output is required");
  if (inputs.empty()) usage_error("prepare: --input needs at least one file");
  PrepareOptions options;
  options.format =
      parse_record_format(p.options.count("records") ? p.options.at("records") : "file");
  if (p.options.count("shard-tokens"))
    options.shard_tokens =
        parse_token_count("prepare: --shard-tokens", p.options.at("shard-tokens"));
  options.overwrite = force;
  std::unique_ptr<Tokenizer> tok = make_tokenizer(p.options.at("tokenizer"));
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  PrepareProgressPrinter printer(stderr, isatty(fileno(stderr)));
  options.progress = [&](const PrepareProgress& progress) { printer.update(progress, seconds()); };
  const PrepareStats s =
      prepare_dataset(*tok, {inputs.begin(), inputs.end()}, p.options.at("output"), options);
  printer.finish(s, seconds());
  std::printf("%s: %lld documents, %lld tokens from %lld bytes in %lld files (tokenizer %s, "
              "vocabulary %d)",
              p.options.at("output").c_str(), (long long)s.documents, (long long)s.tokens,
              (long long)s.bytes, (long long)s.files, tok->name().c_str(), tok->vocab_size());
  if (s.shards > 0) std::printf(" in %lld shards", (long long)s.shards);
  std::printf("\n");
  return 0;
}

int cmd_tokenizer(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "train")
    usage_error("tokenizer: expected 'train' (see forge tokenizer --help)");
  std::vector<std::string> rest(args.begin() + 1, args.end());
  std::vector<std::string> inputs = multi_option(rest, "tokenizer train", "input");
  ParsedArgs p = parse_args("tokenizer train", rest, {"vocab-size", "output"});
  if (!p.positional.empty()) usage_error("tokenizer train: unexpected argument '" + p.positional[0] + "'");
  if (inputs.empty()) usage_error("tokenizer train: --input needs at least one file");
  if (!p.options.count("output")) usage_error("tokenizer train: --output is required");
  if (!p.options.count("vocab-size")) usage_error("tokenizer train: --vocab-size is required");
  int64_t vocab = integer_option(p, "vocab-size", 0);
  if (vocab < 257 || vocab > INT32_MAX)
    usage_error(detail::concat("tokenizer train: --vocab-size must be in [257, 2^31), got ", vocab));
  check_output_path("tokenizer train: --output", p.options.at("output"),
                    {inputs.begin(), inputs.end()}, OutputShape::directory);
  train_bpe({inputs.begin(), inputs.end()}, int32_t(vocab), p.options.at("output"));
  std::unique_ptr<Tokenizer> tok = make_tokenizer(p.options.at("output"));
  std::printf("%s: vocabulary %d (encoder.json, vocab.bpe, tokenizer.json)\n",
              p.options.at("output").c_str(), tok->vocab_size());
  return 0;
}

// What a benchmark or a bug report needs to know about this binary: the instruction sets its
// kernels run with here (FORGE_ISA=avx2 in scripts/setup.sh builds the AVX2 path) and MPI.
int print_version() {
  std::printf("forge %s\nkernels: %s (built with%s AVX-512)\n%s\nMPI: %s\n", kForgeVersion,
              kernels::kernel_isa(), kernels::kAvx512Built ? "" : "out",
              kernels::onednn_description().c_str(),
              mpi_built() ? "built in" : "not built (training runs in one process)");
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(usage_text().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  if (command == "--version") return print_version();
  std::vector<std::string> args(argv + 2, argv + argc);
  const std::map<std::string, std::function<int(const std::vector<std::string>&)>> commands = {
      {"train", cmd_train},       {"validate", cmd_validate}, {"eval", cmd_eval},
      {"generate", cmd_generate}, {"inspect", cmd_inspect}, {"export", cmd_export},
      {"tokenize", cmd_tokenize},  {"predict", cmd_predict},    {"report", cmd_report},
      {"prepare", cmd_prepare},   {"tokenizer", cmd_tokenizer},
  };
  auto it = commands.find(command);
  const RecipeCommand* recipe_command = find_recipe_command(command);
  if (it == commands.end() && !recipe_command)
    usage_error("unknown command '" + command + "' (see forge --help)");
  if (world_comm().size() > 1 && command != "train")
    usage_error("forge " + command + " runs in one process; only forge train runs under mpirun");
  const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
  if (recipe_command) {
    if (help) return std::fputs(recipe_command->usage.c_str(), stdout), 0;
    ParsedArgs p = parse_args(command, args, recipe_command->options);
    if (!p.positional.empty())
      usage_error(command + ": unexpected argument '" + p.positional[0] + "'");
    return recipe_command->run(CommandOptions{p.options});
  }
  if (help) {
    std::fputs(kCommandUsage.at(command).c_str(), stdout);
    if (command == "eval")
      for (const RecipeSpec& r : recipe_registry()) {
        if (r.eval_options.empty()) continue;
        std::printf("\nOptions for a %s run:\n", r.name.c_str());
        for (const auto& [name, help] : r.eval_options)
          std::printf("  --%-16s %s\n", name.c_str(), help.c_str());
      }
    return 0;
  }
  return it->second(args);
}

const char* error_kind(ExitCode code) {
  switch (code) {
    case ExitCode::usage: return "usage error";
    case ExitCode::data: return "data error";
    case ExitCode::checkpoint: return "checkpoint error";
    case ExitCode::numerical: return "numerical error";
    default: return "internal error (please report it)";
  }
}

// Prints an error as one line per problem. Config errors arrive as complete "forge: config error:
// ..." lines, one per problem: each is printed as one line, and a newline inside a problem (a
// quoted value) is escaped. `who` is "" or "rank N: ".
void print_error(const Error& e, const std::string& who) {
  std::string message = e.what();
  if (message.rfind("forge: ", 0) != 0) {
    std::fprintf(stderr, "forge: %s%s: %s\n", who.c_str(), error_kind(e.code()),
                 printable(message).c_str());
    return;
  }
  const std::string separator = "\nforge: ";
  for (size_t begin = 0, end; begin < message.size(); begin = end + 1) {
    end = std::min(message.find(separator, begin), message.size());
    std::fprintf(stderr, "%s\n", printable(message.substr(begin, end - begin)).c_str());
  }
}

// An error under mpirun. Before the ranks agreed their set-up succeeded it is usually every
// rank's (a config error): the lowest failing rank reports it and all end with one code. After,
// a numerical failure is every rank's (they check the same reduced gradients), as is an
// AgreedError, and ends them all normally; any other error is this rank's own, and the others may
// be waiting for it inside a collective: it ends the whole job.
int handle_error(const Error& e) {
  Comm& comm = world_comm();
  if (comm.size() == 1) {
    print_error(e, "");
    return int(e.code());
  }
  if (!setup_joined()) {
    const SetupOutcome outcome = join_setup(int(e.code()));
    if (outcome.failed_rank == comm.rank()) print_error(e, "");
    return outcome.exit_code;
  }
  if (e.code() == ExitCode::numerical || dynamic_cast<const AgreedError*>(&e)) {
    if (comm.rank() == 0) print_error(e, "");
    return int(e.code());
  }
  print_error(e, detail::concat("rank ", comm.rank(), ": "));
  std::fflush(stderr);
  abort_world_comm(int(e.code()));
}

// Ranks that share a machine share its cores: each gets its share of the threads unless the user
// chose (OMP_NUM_THREADS) or the launcher bound it to fewer cores than the machine has.
std::optional<int> threads_per_local_rank() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (std::getenv("OMP_NUM_THREADS") || !local) return std::nullopt;
  const long ranks = std::atol(local);
  cpu_set_t set;
  if (ranks <= 1 || sched_getaffinity(0, sizeof set, &set) != 0) return std::nullopt;
  const long cpus = CPU_COUNT(&set);
  if (cpus < sysconf(_SC_NPROCESSORS_ONLN)) return std::nullopt;
  return int(std::max(1L, cpus / ranks));
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  // How OpenMP threads wait between parallel regions decides small-model speed. libgomp's default
  // spins ~300k iterations: on shared cores (VMs, other jobs) that made training 12x slower here
  // (152 s vs 12 s for 300 steps). Sleeping at once (passive) costs a wake-up per region, half the
  // throughput of a short spin (25k vs 49k tok/s on configs/gpt_shakespeare.yaml). A 10k spin keeps
  // threads hot between a step's back-to-back kernels and still yields the core soon. libgomp reads
  // this and the thread count when it loads, before main, so the process restarts itself once
  // unless the user chose.
  bool restart = false;
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", "10000", 1);
    restart = true;
  }
  if (launched_by_mpi())
    if (std::optional<int> threads = threads_per_local_rank()) {
      setenv("OMP_NUM_THREADS", std::to_string(*threads).c_str(), 1);
      restart = true;
    }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  int code = 0;
  try {
    if (launched_by_mpi()) {
      // Open MPI's non-blocking all-reduce picks recursive doubling for 2 ranks; Rabenseifner's
      // reduce-scatter + all-gather summed the medium GPT's 43 MB of gradients in about half the
      // time here (29 vs 61 ms, docs/distributed.md). The user's own choice stands.
      setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
      init_world_comm(&argc, &argv);
    }
    install_catalog(forge_catalog());
    install_foreign_layout(hf_model_layout());
    code = run(argc, argv);
  } catch (const PeerSetupFailed& e) {
    code = e.exit_code;
  } catch (const Error& e) {
    code = handle_error(e);
  } catch (const std::exception& e) {
    code = handle_error(Error(ExitCode::internal, e.what()));
  }
  finalize_world_comm();
  return code;
}
