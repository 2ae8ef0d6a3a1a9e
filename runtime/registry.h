// The recipes a program knows and the config sections they own. Each recipe file declares its
// RecipeSpec (what it trains, the sections it reads, its cross-key checks, train / eval / memory
// estimate, its own commands) and its sections; recipes/catalog.cpp lists them in one explicit
// list, which the program installs at start, so the loader, the CLI and the docs follow the
// registry and never name a recipe, and the runtime depends on no recipe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace forge {

/// A section of keys that belongs to recipes, not to every run ("bert", "lora", ...).
struct ConfigSection {
  std::string name;
  std::string doc;
  std::vector<ConfigKey> keys;
};

/// Lets a recipe add cross-key rules to the loader: a rule names the keys it reads (the first one
/// the file/override set is blamed, as today's `cross`), and is skipped when one of them was
/// already rejected.
class ConfigChecker {
 public:
  virtual ~ConfigChecker() = default;
  virtual void cross(std::initializer_list<std::string> keys, bool ok,
                     const std::string& message) = 0;
  virtual const RunConfig& config() const = 0;
};

/// What `forge validate` prints: parameter counts and a rough peak of a training step, in bytes.
struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t trainable_parameters = 0;
  double state_bytes = 0, activation_bytes = 0, logits_bytes = 0;
};

/// The --name value options of a command line, for recipe hooks that read some (dpo's eval takes
/// --prompts, --num-samples, ...). Typed reads throw Error(usage) naming "--name" and the value.
struct CommandOptions {
  std::map<std::string, std::string> values;
  bool has(const std::string& name) const { return values.count(name) > 0; }
  std::string text(const std::string& name, const std::string& fallback) const;
  double number(const std::string& name, double fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
};

/// A command of its own that a recipe adds to the CLI (reward_model: `forge score`). The CLI parses
/// `--name value` options against `options` (any other argument is a usage error), lists
/// `summary` in `forge --help` and prints `usage` for `forge NAME --help`.
struct RecipeCommand {
  std::string name;                  // "score"
  std::string summary;               // help lines after the name, aligned as forge --help's
  std::string usage;                 // the whole text of forge NAME --help
  std::vector<std::string> options;  // accepted option names, without "--"
  std::function<int(const CommandOptions&)> run;
};

struct RecipeSpec {
  std::string name;                   // "gpt_pretrain"
  std::string doc;                    // one line, for --help / docs
  std::vector<std::string> families;  // model.arch values it trains, e.g. {"gpt"}
  std::vector<std::string> sections;  // recipe sections it reads, e.g. {"bert"} or {"lora", "finetune"}
  std::function<void(ConfigChecker&)> check;   // optional cross-key checks
  std::function<int(const RunConfig&)> train;  // forge train
  // forge eval; `options` are the command's options of eval_options
  std::function<int(const RunConfig&, const std::filesystem::path& checkpoint,
                    const CommandOptions& options)>
      eval;
  std::function<MemoryEstimate(const RunConfig&)> estimate;                    // forge validate
  // forge predict (optional): one prediction per line or record of `input`, for a checkpoint of
  // this recipe whose stored config is `config`.
  std::function<int(const RunConfig& config, const std::filesystem::path& checkpoint,
                    const std::filesystem::path& input)>
      predict = {};
  bool data_directories = false;  // data.train / data.val may name a directory of record files
  // Options forge eval accepts for a run of this recipe besides the common ones (names without
  // "--"), with their help; forge eval refuses the others.
  std::vector<std::pair<std::string, std::string>> eval_options = {};
  std::vector<RecipeCommand> commands = {};  // commands of its own (forge score)
};

/// What a program knows: every recipe and every recipe section (recipes/catalog.h lists Forge's).
struct Catalog {
  std::vector<RecipeSpec> recipes;
  std::vector<ConfigSection> sections;
};

/// Makes `catalog` the registry; a program calls it once at start, before reading any config
/// (cli/main.cpp, tests/main.cpp). No static-init self-registration: static libraries drop
/// unreferenced objects.
void install_catalog(Catalog catalog);

/// Every installed recipe, in catalog order.
const std::vector<RecipeSpec>& recipe_registry();

/// The command of an installed recipe with this name, or nullptr.
const RecipeCommand* find_recipe_command(const std::string& name);

/// The recipe with this name; Error(usage) naming the known recipes.
const RecipeSpec& find_recipe(const std::string& name);

/// Every installed recipe section.
const std::vector<ConfigSection>& config_sections();

/// The recipes that list `section` among theirs, in registry order.
std::vector<std::string> recipes_reading(const std::string& section);

// ---- declaring keys ---------------------------------------------------------------------------

/// What a key accepts and its default, before it gets a path, a doc and a place to live. Built by
/// the functions below; the common schema (config_schema.cpp) and recipe sections use the same.
struct KeySpec {
  ConfigType type{};
  ConfigValue def{};
  bool required = false;
  std::string range{};
  std::vector<std::string> choices{};
  size_t list_size = 0;
  std::string shown{};
  std::vector<std::string> aliases{};
  bool architecture = false;
  std::vector<std::string> inherits{};
  /// Names other tools use for the key; they only feed "did you mean".
  KeySpec aka(std::vector<std::string> names) &&;
  /// The default as the docs show it, when it is derived.
  KeySpec shown_as(std::string text) &&;
  /// The weights fix this key (ConfigKey::architecture).
  KeySpec fixes_architecture() &&;
  /// A checkpoint key whose model's stored config fixes `keys` of this run (ConfigKey::inherits).
  KeySpec inherits_keys(std::vector<std::string> keys) &&;
};

KeySpec integer_key(int64_t def, std::string range);
KeySpec number_key(double def, std::string range);
KeySpec boolean_key(bool def);
KeySpec string_key(std::string def);
KeySpec optional_path_key();
KeySpec required_path_key();
KeySpec checkpoint_key();
/// An empty default makes the key required.
KeySpec choice_key(std::string def, std::vector<std::string> choices);
KeySpec number_list_key(std::vector<double> def, std::string range);
KeySpec string_list_key(std::vector<std::string> def = {});
/// Any number of integers, each within `range`.
KeySpec integer_list_key(std::vector<int64_t> def, std::string range);

/// A key of `set`/`get` functions and the parts a spec and a doc give.
ConfigKey make_config_key(std::string path, KeySpec spec, std::string doc,
                          std::function<void(RunConfig&, const ConfigValue&)> set,
                          std::function<ConfigValue(const RunConfig&)> get);

/// A key of a recipe section: its value lives in RunConfig::sections under `path`.
ConfigKey section_key(std::string path, KeySpec spec, std::string doc);

}  // namespace forge
