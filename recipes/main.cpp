// The forge command line. Subcommands arrive with the issues that build them (train, validate,
// eval, generate, prepare, inspect); until then they are reported as not available, exit 2.
#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr const char* kUsage =
    "usage: forge COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [key.path=value ...]   run the recipe a YAML config names\n"
    "  validate CONFIG [overrides]         check a config and print it resolved\n"
    "  eval CONFIG-or-RUN-DIR              loss, perplexity and task accuracies\n"
    "  generate --checkpoint RUN --prompt TEXT   sample from a trained model\n"
    "  prepare --tokenizer NAME --input TEXT... --output FILE.h5\n"
    "  inspect CHECKPOINT                  print and verify a checkpoint\n"
    "\n"
    "forge COMMAND --help prints the options of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  for (const char* known : {"train", "validate", "eval", "generate", "prepare", "inspect"}) {
    if (command == known) {
      std::fprintf(stderr, "forge: usage error: '%s' is not available in this build yet\n",
                   known);
      return 2;
    }
  }
  std::fprintf(stderr, "forge: usage error: unknown command '%s' (see forge --help)\n",
               command.c_str());
  return 2;
}
