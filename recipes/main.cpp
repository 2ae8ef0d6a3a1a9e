// The forge command line: parses the subcommand and its options, dispatches to the recipe the
// config names, and turns every forge::Error into one line on stderr and the exit code of
// DESIGN.md §1. Nothing here knows how a recipe trains.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "nn/generate.h"
#include "recipes/checkpoint.h"
#include "recipes/components.h"
#include "recipes/config.h"
#include "recipes/gpt_pretrain.h"

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
    "  eval CONFIG-or-RUN-DIR              loss and perplexity on the whole validation split\n"
    "  generate --checkpoint RUN-DIR-or-FILE --prompt TEXT [--max-new-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "  inspect CHECKPOINT                  print step, config and parameters; verify integrity\n"
    "\n"
    "forge COMMAND --help prints the usage of one command. Exit codes: 0 ok, 1 internal error,\n"
    "2 usage or config error, 3 data error, 4 checkpoint error, 5 non-finite loss or gradient,\n"
    "130/143 stopped by SIGINT/SIGTERM after writing a checkpoint.\n";

const std::map<std::string, std::string> kCommandUsage = {
    {"train",
     "usage: forge train CONFIG [key.path=value ...]\n"
     "Trains the recipe CONFIG names. Overrides use dotted paths (optimizer.lr=3e-4, a list as\n"
     "[a,b]). The run directory (output_dir) receives config.yaml, metrics.jsonl, checkpoints/ and\n"
     "report.html; a second run resumes from its latest checkpoint unless train.resume=never.\n"},
    {"validate",
     "usage: forge validate CONFIG [key.path=value ...]\n"
     "Checks every key, file and shape, prints the resolved config, the parameter count and an\n"
     "estimate of peak training memory. Trains nothing.\n"},
    {"eval",
     "usage: forge eval CONFIG-or-RUN-DIR\n"
     "Loss and perplexity of the run's latest checkpoint over the whole validation split.\n"},
    {"generate",
     "usage: forge generate --checkpoint RUN-DIR-or-FILE --prompt TEXT [options]\n"
     "  --max-new-tokens N   tokens to generate (default 200)\n"
     "  --temperature T      0 = greedy (default 0.8)\n"
     "  --top-k K            keep the K most likely tokens, 0 = all (default 200)\n"
     "  --top-p P            nucleus sampling, 1 = off (default 1)\n"
     "  --seed S             the same seed gives the same text (default 0)\n"},
    {"inspect",
     "usage: forge inspect CHECKPOINT\n"
     "Prints the step, the resolved config and every parameter with its shape, and verifies the\n"
     "checksum of every tensor. CHECKPOINT is a .h5 file or a run directory.\n"},
};

[[noreturn]] void usage_error(const std::string& message) { throw Error(ExitCode::usage, message); }

// Splits `args` into positionals and --name value options; `flags` lists the allowed options.
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
    parsed.options[name] = value;
  }
  return parsed;
}

double number_option(const ParsedArgs& p, const std::string& name, double fallback) {
  auto it = p.options.find(name);
  if (it == p.options.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end)
    usage_error(detail::concat("--", name, ": expected a number, got '", it->second, "'"));
  return v;
}

int64_t integer_option(const ParsedArgs& p, const std::string& name, int64_t fallback) {
  double v = number_option(p, name, double(fallback));
  if (v != double(int64_t(v)))
    usage_error(detail::concat("--", name, ": expected an integer, got '", p.options.at(name), "'"));
  return int64_t(v);
}

RunConfig config_from_args(const std::string& command, const std::vector<std::string>& args) {
  if (args.empty()) usage_error(command + ": missing CONFIG (see forge " + command + " --help)");
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i].find('=') == std::string::npos || args[i].rfind("--", 0) == 0)
      usage_error(detail::concat(command, ": expected key.path=value, got '", args[i], "'"));
  return load_config(args[0], {args.begin() + 1, args.end()});
}

int cmd_train(const std::vector<std::string>& args) {
  RunConfig config = config_from_args("train", args);
  return train_gpt(config);
}

// Rough peak of a training step in f32: weights, gradients and AdamW moments (16 bytes a
// parameter), the activations each block keeps for backward (~16 values per token and channel,
// one block's worth with checkpointing) and the logits with their gradient.
int cmd_validate(const std::vector<std::string>& args) {
  RunConfig c = config_from_args("validate", args);
  nn::GPTConfig g = gpt_config(c.model);
  nn::check_config(g);
  int64_t params = nn::gpt_num_parameters(g);
  double tokens = double(c.train.batch_size * c.model.context);
  double per_block = 16.0 * tokens * double(c.model.d_model) * 4;
  double blocks = c.train.activation_checkpointing
                      ? double(c.model.n_layers) * tokens * double(c.model.d_model) * 4 + per_block
                      : double(c.model.n_layers) * per_block;
  double logits = 2.0 * tokens * double(c.model.vocab_size) * 4;
  double state = 16.0 * double(params);
  std::fputs(to_yaml(c).c_str(), stdout);
  std::printf("# parameters: %lld\n", (long long)params);
  std::printf("# estimated peak training memory: %.1f MiB (weights+grads+optimizer %.1f, "
              "activations %.1f, logits %.1f)\n",
              (state + blocks + logits) / 1048576.0, state / 1048576.0, blocks / 1048576.0,
              logits / 1048576.0);
  return 0;
}

int cmd_eval(const std::vector<std::string>& args) {
  if (args.size() != 1) usage_error("eval: expected one CONFIG or RUN-DIR (see forge eval --help)");
  fs::path target = args[0];
  RunConfig config = fs::is_directory(target) ? load_config((target / "config.yaml").string())
                                              : load_config(target.string());
  fs::path file = resolve_checkpoint(config.output_dir);
  return eval_gpt(config, file.string());
}

int cmd_generate(const std::vector<std::string>& args) {
  ParsedArgs p = parse_args("generate", args,
                            {"checkpoint", "prompt", "max-new-tokens", "temperature", "top-k",
                             "top-p", "seed"});
  if (!p.positional.empty()) usage_error("generate: unexpected argument '" + p.positional[0] + "'");
  if (!p.options.count("checkpoint")) usage_error("generate: --checkpoint is required");
  std::string prompt = p.options.count("prompt") ? p.options.at("prompt") : "\n";
  nn::SamplingOptions o;
  o.max_new_tokens = integer_option(p, "max-new-tokens", 200);
  o.temperature = number_option(p, "temperature", 0.8);
  o.top_k = integer_option(p, "top-k", 200);
  o.top_p = number_option(p, "top-p", 1.0);
  o.seed = uint64_t(integer_option(p, "seed", 0));
  nn::check_sampling(o);
  LoadedGPT loaded = load_gpt(resolve_checkpoint(p.options.at("checkpoint")));
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  for (auto& id : ids) id = int64_t(uint8_t(id));
  std::vector<int64_t> out = nn::generate(*loaded.model, ids, o);
  std::string text = prompt;
  for (int64_t id : out) text.push_back(char(uint8_t(id)));
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
  std::printf("parameters: %lld in %zu tensors\n", (long long)info.model_numel(), info.model.size());
  for (const TensorSpec& t : info.model)
    std::printf("  %-40s %-16s %s %lld\n", t.name.c_str(), shape_str(t.shape).c_str(),
                dtype_name(t.dtype), (long long)shape_numel(t.shape));
  std::printf("optimizer state: %lld values in %zu tensors\n", (long long)info.optim_numel(),
              info.optim.size());
  verify_checkpoint(file);
  std::printf("integrity: ok (every checksum verified)\n--- config ---\n%s", info.config_yaml.c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  const std::map<std::string, std::function<int(const std::vector<std::string>&)>> commands = {
      {"train", cmd_train},       {"validate", cmd_validate}, {"eval", cmd_eval},
      {"generate", cmd_generate}, {"inspect", cmd_inspect},
  };
  auto it = commands.find(command);
  if (it == commands.end())
    usage_error("unknown command '" + command + "' (see forge --help)");
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kCommandUsage.at(command).c_str(), stdout);
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

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  // How OpenMP threads wait between parallel regions decides small-model speed. libgomp's default
  // spins ~300k iterations: on shared cores (VMs, other jobs) that made training 12x slower here
  // (152 s vs 12 s for 300 steps). Sleeping at once (passive) costs a wake-up per region, half the
  // throughput of a short spin (25k vs 49k tok/s on configs/gpt_shakespeare.yaml). A 10k spin keeps
  // threads hot between a step's back-to-back kernels and still yields the core soon. libgomp reads
  // this when it loads, before main, so the process restarts itself once unless the user chose.
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", "10000", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::string message = e.what();
    // Config errors arrive as complete "forge: config error: ..." lines, one per problem.
    if (message.rfind("forge: ", 0) == 0)
      std::fprintf(stderr, "%s\n", message.c_str());
    else
      std::fprintf(stderr, "forge: %s: %s\n", error_kind(e.code()), message.c_str());
    return int(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forge: internal error (please report it): %s\n", e.what());
    return 1;
  }
}
