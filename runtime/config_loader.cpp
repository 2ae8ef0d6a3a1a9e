// Config loading: the YAML walk that checks a file against the schema, `key.path=value` overrides,
// recipe sections only where the active recipe reads them, files and checkpoints that must exist,
// the keys that another model fixes (model.init_from's architecture, a teacher's vocabulary),
// derived defaults, and the rules across keys (the common ones here, the recipes' own from the
// registry). Problems are collected, not thrown one by one, so a user fixes a whole file in one
// round trip (docs/config.md).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/file_io.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config_internal.h"
#include "runtime/registry.h"

namespace forge {
namespace {

using namespace config_detail;


// Where a value came from: a place in the file, an override, or just the file.
struct Where {
  enum Kind { mark, override_arg, file } kind = file;
  int line = 0, col = 0;  // 0-based, as yaml-cpp marks
  size_t index = 0;       // override position
  std::string override_text{};
};

Where at(const YAML::Mark& m) {
  return m.is_null() ? Where{} : Where{Where::mark, m.line, m.column};
}

std::string describe(const YAML::Node& node) {
  if (node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  if (node.Tag() == "!") return "the quoted string '" + node.Scalar() + "'";
  return "'" + node.Scalar() + "'";
}

std::string joined(const std::vector<std::string>& names, const std::string& sep) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : sep) + n;
  return out;
}

// Keys that moved into a recipe section; configs stored in older checkpoints still spell them so.
const std::map<std::string, std::string> kMovedKeys = {
    {"model.type_vocab_size", "bert.type_vocab_size"},
    {"data.mask_prob", "bert.mask_prob"},
    {"data.eval_pairs", "bert.eval_pairs"},
    {"data.paragraphs_per_document", "bert.paragraphs_per_document"},
    {"data.sentence_breaks", "bert.sentence_breaks"},
};

// Keys Forge no longer reads, and why; configs stored in older checkpoints still hold them.
const std::map<std::string, std::string> kRetiredKeys = {
    {"model.moe.eval_capacity_factor",
     "evaluation and generation route every token without a capacity limit, so that a row's "
     "output does not depend on its batch (docs/recipes/moe.md)"},
};

class Loader : public ConfigChecker {
 public:
  Loader(std::string name, ConfigFiles files)
      : name_(std::move(name)), files_(files), config_(default_config()) {}

  void load_text(const std::string& text) {
    YAML::Node doc;
    try {
      doc = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      error(at(e.mark), "YAML syntax error: " + e.msg);
      unreadable_ = true;
      return;
    }
    if (doc.IsNull()) return;
    if (!doc.IsMap()) {
      error(at(doc.Mark()),
            "expected a mapping of config keys at the top level, got " + describe(doc));
      unreadable_ = true;
      return;
    }
    walk(doc, "");
  }

  void apply_override(size_t index, const std::string& text) {
    Where where{Where::override_arg, 0, 0, index, text};
    size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      error(where, "expected key.path=value");
      return;
    }
    std::string path = text.substr(0, eq);
    const ConfigKey* key = find_config_key(path);
    if (!key) {
      if (is_section(path)) {
        error(where, "'" + path + "' is a section, not a key; set one of its keys, e.g. " +
                         join(path, schema_index().children.at(path).front()) + "=...");
      } else {
        std::string guess = suggest_key(parent_of(path), leaf_of(path));
        error(where, "unknown key '" + path + "'" +
                         (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
      }
      return;
    }
    YAML::Node node;
    try {
      node = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      error(where, path + ": value is not valid YAML: " + e.msg);
      return;
    }
    assign(*key, node, where);
  }

  RunConfig finish() {
    // A file that did not parse says nothing about its keys: no "missing key" noise after it.
    if (unreadable_) throw_problems();
    check_required();
    check_sections();
    if (files_ == ConfigFiles::check) {
      check_files();
      inherit_from_checkpoints();
    }
    resolve_derived();
    check_cross_fields();
    if (!problems_.empty()) throw_problems();
    // A checkpoint that is not there is not a config mistake (exit 4), but comes after them.
    if (checkpoint_error_) throw *checkpoint_error_;
    return config_;
  }

  // A rule across keys; skipped when one of them was already rejected on its own.
  void cross(std::initializer_list<std::string> keys, bool ok,
             const std::string& message) override {
    if (!ok) reject(keys, message);
  }

  const RunConfig& config() const override { return config_; }

 private:
  struct Problem {
    Where where;
    size_t seq;
    std::string message;
  };

  void error(const Where& where, std::string message) {
    problems_.push_back({where, problems_.size(), std::move(message)});
  }

  // File positions first, in file order; then overrides in command-line order; then the rest.
  [[noreturn]] void throw_problems() {
    auto rank = [](const Problem& p) {
      return std::tuple(static_cast<int>(p.where.kind), p.where.line, p.where.col, p.where.index,
                        p.seq);
    };
    std::sort(problems_.begin(), problems_.end(),
              [&](const Problem& a, const Problem& b) { return rank(a) < rank(b); });
    // One printable line per problem: a key or value quoted in a message may hold a newline, which
    // must not start a line of its own (main() prints each line of this text).
    std::string out;
    for (const Problem& p : problems_) {
      std::string line = "forge: config error: ";
      switch (p.where.kind) {
        case Where::mark:
          line += name_ + ":" + std::to_string(p.where.line + 1) + ":" +
                 std::to_string(p.where.col + 1);
          break;
        case Where::override_arg: line += "override '" + p.where.override_text + "'"; break;
        case Where::file: line += name_; break;
      }
      line += ": " + p.message;
      if (!out.empty()) out += '\n';
      out += printable(line);
    }
    throw Error(ExitCode::usage, out);
  }

  void walk(const YAML::Node& map, const std::string& prefix) {
    std::map<std::string, Where> seen;
    for (const auto& entry : map) {
      YAML::Node k = entry.first;  // copies are cheap handles
      YAML::Node v = entry.second;
      Where key_at = at(k.Mark());
      if (!k.IsScalar()) {
        error(key_at, "expected a key name, got " + describe(k));
        continue;
      }
      std::string name = k.Scalar();
      std::string path = join(prefix, name);
      if (auto dup = seen.find(name); dup != seen.end()) {
        error(key_at, "duplicate key '" + path + "' (first given at line " +
                          std::to_string(dup->second.line + 1) + ")");
        continue;
      }
      seen[name] = key_at;
      if (const ConfigKey* key = find_config_key(path)) {
        assign(*key, v, v.IsNull() ? key_at : at(v.Mark()));
      } else if (is_section(path)) {
        where_[path] = key_at;
        if (v.IsMap()) {
          walk(v, path);
        } else if (!v.IsNull()) {
          error(at(v.Mark()),
                "'" + path + "' is a section: expected a mapping of its keys, got " + describe(v));
        }
      } else if (files_ == ConfigFiles::skip && kMovedKeys.count(path)) {
        // A checkpoint written before the key moved: its value still counts where it now lives.
        const std::string& moved = kMovedKeys.at(path);
        if (recipe_reads(config_, recipe_section_of(moved)))
          assign(*find_config_key(moved), v, at(v.Mark()));
      } else if (kRetiredKeys.count(path)) {
        if (files_ != ConfigFiles::skip)
          error(key_at, "'" + path + "' was removed: " + kRetiredKeys.at(path));
      } else {
        std::string guess = suggest_key(prefix, name);
        if (!guess.empty() && parent_of(guess) == prefix) guess = leaf_of(guess);
        error(key_at, "unknown key '" + path + "'" +
                          (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
      }
    }
  }

  // Converts, range-checks and stores one value; on failure reports it and marks the key bad so
  // that cross-field checks do not pile consequences on top.
  void assign(const ConfigKey& key, const YAML::Node& node, const Where& where) {
    where_[key.path] = where;
    std::optional<ConfigValue> value = convert(key, node, where);
    if (!value) {
      bad_.insert(key.path);
      return;
    }
    bad_.erase(key.path);
    key.set(config_, *value);
  }

  // Where an element of a list sits: its own mark in a file, the whole override otherwise.
  static Where element_at(const YAML::Node& elem, const Where& list) {
    return list.kind == Where::mark && !elem.Mark().is_null() ? at(elem.Mark()) : list;
  }

  std::optional<double> number_in_range(const ConfigKey& key, const std::string& label,
                                        const YAML::Node& node, const Where& where) {
    std::optional<double> x;
    if (node.IsScalar() && node.Tag() != "!") x = parse_number(node.Scalar());
    if (!x) {
      error(where, label + ": expected a number, got " + describe(node));
      return std::nullopt;
    }
    if (!key.range.contains(*x)) {
      range_error(key, label, node.Scalar(), where);
      return std::nullopt;
    }
    return x;
  }

  void range_error(const ConfigKey& key, const std::string& label, const std::string& got,
                   const Where& where) {
    const std::string& r = key.range.text;
    bool interval = r[0] == '[' || r[0] == '(';
    error(where, label + ": must be " + (interval ? "in " : "") + r + ", got " + got);
  }

  std::optional<ConfigValue> convert(const ConfigKey& key, const YAML::Node& node,
                                     const Where& where) {
    const std::string& label = key.path;
    bool plain_scalar = node.IsScalar() && node.Tag() != "!";
    switch (key.type) {
      case ConfigType::integer: {
        std::optional<int64_t> v;
        if (plain_scalar) v = parse_integer(node.Scalar());
        if (!v) {
          error(where, label + ": expected an integer, got " + describe(node));
          return std::nullopt;
        }
        if (!key.range.contains(static_cast<double>(*v))) {
          range_error(key, label, node.Scalar(), where);
          return std::nullopt;
        }
        return *v;
      }
      case ConfigType::number: {
        auto v = number_in_range(key, label, node, where);
        if (!v) return std::nullopt;
        return *v;
      }
      case ConfigType::boolean: {
        std::optional<bool> v;
        if (plain_scalar) v = parse_bool(node.Scalar());
        if (!v) {
          error(where, label + ": expected true or false, got " + describe(node));
          return std::nullopt;
        }
        return *v;
      }
      case ConfigType::string:
      case ConfigType::path:
      case ConfigType::checkpoint:
      case ConfigType::choice: {
        if (!node.IsScalar()) {
          error(where, label + ": expected a string, got " + describe(node));
          return std::nullopt;
        }
        const std::string& s = node.Scalar();
        if (key.type == ConfigType::choice &&
            std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end()) {
          std::string guess = closest(s, key.choices);
          error(where, label + ": must be one of " + config_allowed_text(key) + "; got '" + s +
                           "'" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
          return std::nullopt;
        }
        if (key.required && s.empty()) {
          error(where, label + ": must not be empty");
          return std::nullopt;
        }
        return s;
      }
      case ConfigType::number_list: {
        std::string want = "a list of " + std::to_string(key.list_size) + " numbers";
        if (!node.IsSequence()) {
          error(where, label + ": expected " + want + ", got " + describe(node));
          return std::nullopt;
        }
        if (node.size() != key.list_size) {
          error(where, label + ": expected " + want + ", got " + std::to_string(node.size()));
          return std::nullopt;
        }
        std::vector<double> xs;
        for (size_t i = 0; i < node.size(); ++i) {
          auto x = number_in_range(key, label + "[" + std::to_string(i) + "]", node[i],
                                   element_at(node[i], where));
          if (x) xs.push_back(*x);
        }
        if (xs.size() != key.list_size) return std::nullopt;
        return xs;
      }
      case ConfigType::string_list: {
        if (!node.IsSequence()) {
          error(where, label + ": expected a list of strings, got " + describe(node));
          return std::nullopt;
        }
        std::vector<std::string> xs;
        bool ok = true;
        for (size_t i = 0; i < node.size(); ++i) {
          if (node[i].IsScalar()) {
            xs.push_back(node[i].Scalar());
          } else {
            error(element_at(node[i], where), label + "[" + std::to_string(i) +
                                                  "]: expected a string, got " + describe(node[i]));
            ok = false;
          }
        }
        if (!ok) return std::nullopt;
        return xs;
      }
      case ConfigType::integer_list: {
        if (!node.IsSequence()) {
          error(where, label + ": expected a list of integers, got " + describe(node));
          return std::nullopt;
        }
        std::vector<int64_t> xs;
        for (size_t i = 0; i < node.size(); ++i) {
          const std::string element = label + "[" + std::to_string(i) + "]";
          std::optional<int64_t> x;
          if (node[i].IsScalar() && node[i].Tag() != "!") x = parse_integer(node[i].Scalar());
          if (!x)
            error(element_at(node[i], where),
                  element + ": expected an integer, got " + describe(node[i]));
          else if (!key.range.contains(static_cast<double>(*x)))
            range_error(key, element, node[i].Scalar(), element_at(node[i], where));
          else
            xs.push_back(*x);
        }
        if (xs.size() != node.size()) return std::nullopt;
        return xs;
      }
    }
    return std::nullopt;
  }

  // The place to blame for a key the file never gives: its section's line, else the file.
  Where where_missing(const std::string& path) const {
    for (std::string p = parent_of(path); !p.empty(); p = parent_of(p))
      if (auto it = where_.find(p); it != where_.end()) return it->second;
    return Where{};
  }

  void check_required() {
    for (const ConfigKey& key : config_schema())
      if (key.required && !where_.count(key.path))
        error(where_missing(key.path), "missing required key '" + key.path + "'");
  }

  void resolve_derived() {
    if (config_.output_dir.empty())
      config_.output_dir = "runs/" + std::filesystem::path(name_).stem().string();
    if (config_.schedule.noam_d_model == 0) config_.schedule.noam_d_model = config_.model.d_model;
    if (!where_.count("data.split_seed")) config_.data.split_seed = config_.seed;
    if (config_.model.norm_placement == "auto")
      config_.model.norm_placement = config_.model.arch == "bert" ? "post" : "pre";
  }

  // Paths resolve against the working directory, as in every common training CLI (docs/config.md).
  void check_files() {
    for (const ConfigKey& key : config_schema()) {
      bool checkpoint = key.type == ConfigType::checkpoint;
      if ((key.type != ConfigType::path && !checkpoint) || bad_.count(key.path)) continue;
      if (std::string section = recipe_section_of(key.path);
          !section.empty() && !recipe_reads(config_, section))
        continue;
      std::string file = std::get<std::string>(key.get(config_));
      if (file.empty()) continue;
      if (checkpoint) {
        try {
          resolved_[key.path] = resolve_checkpoint(file);
        } catch (const Error& e) {
          if (!checkpoint_error_) checkpoint_error_ = e;
        }
        continue;
      }
      std::error_code ec;
      auto status = std::filesystem::status(file, ec);
      if (!std::filesystem::exists(status))
        error(blame({key.path}), key.path + ": file not found: '" + file + "'");
      else if (std::filesystem::is_directory(status) &&
               !(key.path.rfind("data.", 0) == 0 &&
                 (recipe_reads_data_directories() || is_shard_directory(file))))
        error(blame({key.path}), key.path + ": '" + file + "' is a directory, expected a file");
      else if (!std::filesystem::is_directory(status) && !std::filesystem::is_regular_file(status))
        error(blame({key.path}),
              key.path + ": '" + quoted_path(file) + "': not a regular file");
    }
    // The run directory is written to: something else at its path would fail only when training
    // starts (or be mistaken for a directory by validate).
    std::error_code ec;
    auto run_dir = std::filesystem::status(config_.output_dir, ec);
    if (std::filesystem::exists(run_dir) && !std::filesystem::is_directory(run_dir))
      error(blame({"output_dir"}),
            "output_dir: '" + quoted_path(config_.output_dir) + "' exists and is not a directory");
  }

  bool recipe_reads_data_directories() const {
    for (const RecipeSpec& recipe : recipe_registry())
      if (recipe.name == config_.recipe) return recipe.data_directories;
    return false;
  }

  // A recipe section's keys count only where the active recipe reads the section: one error for
  // the section (at its line, or at each override that sets one of its keys).
  void check_sections() {
    if (config_.recipe.empty() || bad_.count("recipe")) return;
    for (const ConfigSection& section : config_sections()) {
      if (recipe_reads(config_, section.name)) continue;
      std::vector<std::string> readers = recipes_reading(section.name);
      std::string message = "section '" + section.name + "' is not read by recipe " +
                            config_.recipe +
                            (readers.empty() ? " (no recipe reads it yet)"
                                             : " (it is read by: " + joined(readers, ", ") + ")");
      if (auto it = where_.find(section.name); it != where_.end()) error(it->second, message);
      for (const ConfigKey& key : section.keys) {
        auto it = where_.find(key.path);
        if (it == where_.end()) continue;
        if (!where_.count(section.name)) error(it->second, message);
        bad_.insert(key.path);
      }
    }
  }

  // Keys that another model fixes come from the config stored in its checkpoint: the architecture
  // for model.init_from, the keys a checkpoint key lists in `inherits` (a teacher's vocabulary and
  // family). A value set by the file or an override that differs is an error at that key, and so
  // are two sources that disagree. Section keys count only when both recipes read the section.
  void inherit_from_checkpoints() {
    for (const ConfigKey& source : config_schema()) {
      if (source.type != ConfigType::checkpoint) continue;
      if (source.path == "model.init_from")
        inherit_from(source, [](const ConfigKey& key) { return key.architecture; });
      else if (!source.inherits.empty())
        inherit_from(source, [&](const ConfigKey& key) {
          return std::find(source.inherits.begin(), source.inherits.end(), key.path) !=
                 source.inherits.end();
        });
    }
  }

  void inherit_from(const ConfigKey& source, const std::function<bool(const ConfigKey&)>& fixes) {
    const std::string from = std::get<std::string>(source.get(config_));
    // check_files resolved (and verified) it, or reported why not.
    auto resolved = resolved_.find(source.path);
    if (from.empty() || resolved == resolved_.end()) return;
    RunConfig stored;
    try {
      const std::filesystem::path& file = resolved->second;
      CheckpointInfo info = read_checkpoint_info(file);
      try {
        stored = load_config_string(info.config_yaml, file.string(), {}, ConfigFiles::skip);
      } catch (const Error& e) {
        std::string first = e.what();
        throw Error(ExitCode::checkpoint, file.string() + ": the stored config does not load: " +
                                              first.substr(0, first.find('\n')));
      }
    } catch (const Error& e) {
      if (!checkpoint_error_) checkpoint_error_ = e;
      return;
    }
    const std::string origin = source.path + " '" + from + "'";
    for (const ConfigKey& key : config_schema()) {
      if (!fixes(key)) continue;
      if (std::string section = recipe_section_of(key.path);
          !section.empty() && !(recipe_reads(config_, section) && recipe_reads(stored, section)))
        continue;
      ConfigValue theirs = key.get(stored);
      // Rotary positions hold no weights per position, so a run may train a hub model (whose
      // context is 8k to 128k) on shorter sequences, or longer ones.
      if (key.path == "model.context" && stored.model.position == "rotary" &&
          where_.count(key.path))
        continue;
      if (auto it = where_.find(key.path); it != where_.end()) {
        ConfigValue ours = key.get(config_);
        if (bad_.count(key.path) || ours == theirs) continue;
        error(it->second, key.path + ": the config says " + format_config_value(ours) + ", but " +
                              origin + " was trained with " + format_config_value(theirs));
        bad_.insert(key.path);
        continue;
      }
      if (auto it = inherited_.find(key.path); it != inherited_.end()) {
        ConfigValue first = key.get(config_);
        if (first != theirs) {
          error(where_missing(key.path), key.path + ": " + it->second + " was trained with " +
                                             format_config_value(first) + ", but " + origin +
                                             " with " + format_config_value(theirs));
          bad_.insert(key.path);
        }
        continue;
      }
      key.set(config_, theirs);
      inherited_[key.path] = origin;
    }
  }

  // A broken rule across `keys`, unless one of them was already rejected on its own.
  void reject(const std::vector<std::string>& keys, const std::string& message) {
    for (const std::string& k : keys)
      if (bad_.count(k)) return;
    error(blame(keys), message);
  }

  // The first of `keys` the file or an override set; else the file as a whole.
  Where blame(const std::vector<std::string>& keys) const {
    for (const std::string& k : keys)
      if (auto it = where_.find(k); it != where_.end()) return it->second;
    return Where{};
  }

  void check_cross_fields() {
    const RunConfig& c = config_;
    auto num = [](double x) { return format_number(x); };
    auto str = [](int64_t x) { return std::to_string(x); };
    const int64_t head_dim =
        c.model.head_dim > 0 ? c.model.head_dim : c.model.d_model / c.model.n_heads;
    cross({"model.n_heads", "model.d_model", "model.head_dim"},
          c.model.head_dim > 0 || c.model.d_model % c.model.n_heads == 0,
          "model.d_model (" + str(c.model.d_model) + ") must be divisible by model.n_heads (" +
              str(c.model.n_heads) + ")");
    cross({"model.n_kv_heads", "model.n_heads"},
          c.model.n_kv_heads == 0 || c.model.n_heads % c.model.n_kv_heads == 0,
          "model.n_kv_heads (" + str(c.model.n_kv_heads) + ") must divide model.n_heads (" +
              str(c.model.n_heads) + ")");
    cross({"model.position", "model.head_dim", "model.d_model", "model.n_heads"},
          c.model.position != "rotary" || head_dim % 2 == 0,
          std::string("model.position 'rotary' needs an even head dimension, got ") +
              (c.model.head_dim > 0 ? "model.head_dim = " : "model.d_model / model.n_heads = ") +
              str(head_dim));
    cross({"model.rope_scaling.high_freq_factor", "model.rope_scaling.low_freq_factor",
           "model.rope_scaling.type"},
          c.model.rope_scaling != "llama3" ||
              c.model.rope_high_freq_factor > c.model.rope_low_freq_factor,
          "model.rope_scaling.high_freq_factor (" + num(c.model.rope_high_freq_factor) +
              ") must exceed low_freq_factor (" + num(c.model.rope_low_freq_factor) + ")");
    if (c.model.moe_every > 0) check_moe(c.model);
    if (std::optional<int64_t> tokenizer_vocab = tokenizer_vocab_size())
      cross({"model.vocab_size", "data.tokenizer", "data.special_tokens"},
            c.model.vocab_size >= *tokenizer_vocab,
            "model.vocab_size (" + str(c.model.vocab_size) + ") must be >= " +
                str(*tokenizer_vocab) + ", the vocabulary of tokenizer '" + c.data.tokenizer +
                "' with " + str(int64_t(c.data.special_tokens.size())) + " special tokens");
    check_recipe();
    cross({"schedule.warmup_steps", "train.max_steps"},
          c.schedule.warmup_steps <= c.train.max_steps,
          "schedule.warmup_steps (" + str(c.schedule.warmup_steps) +
              ") must be <= train.max_steps (" + str(c.train.max_steps) + ")");
    cross({"schedule.warmup_steps", "schedule.name"},
          c.schedule.name != "noam" || c.schedule.warmup_steps >= 1,
          "schedule.warmup_steps must be >= 1 for schedule 'noam'");
    cross({"schedule.min_lr", "optimizer.lr"}, c.schedule.min_lr <= c.optimizer.lr,
          "schedule.min_lr (" + num(c.schedule.min_lr) + ") must be <= optimizer.lr (" +
              num(c.optimizer.lr) + ")");
    cross({"optimizer.nesterov", "optimizer.name", "optimizer.momentum"},
          !c.optimizer.nesterov || (c.optimizer.name == "sgd" && c.optimizer.momentum > 0),
          "optimizer.nesterov needs optimizer.name 'sgd' and optimizer.momentum > 0");
    cross({"train.shard_optimizer", "optimizer.name"},
          !c.train.shard_optimizer || c.optimizer.name == "adamw",
          "train.shard_optimizer shards AdamW's state only; optimizer.name is '" +
              c.optimizer.name + "'");
    cross({"train.eval_every", "data.val", "data.val_fraction"},
          c.train.eval_every == 0 || !c.data.val.empty() || c.data.val_fraction > 0,
          "train.eval_every (" + str(c.train.eval_every) +
              ") needs a validation split: set data.val or data.val_fraction > 0");
  }

  void check_moe(const ModelConfig& m) {
    auto str = [](int64_t x) { return std::to_string(x); };
    cross({"model.moe.every", "model.arch"}, m.arch == "gpt",
          "model.moe is available for gpt models; model.arch is '" + m.arch + "'");
    cross({"model.moe.every", "model.n_layers"}, m.moe_every <= m.n_layers,
          "model.moe.every (" + str(m.moe_every) + ") leaves no MoE block among model.n_layers (" +
              str(m.n_layers) + ")");
    // The layer's own rules, on the MoEConfig a model would be built from.
    for (const nn::MoEConfigProblem& p : nn::moe_config_problems(gpt_config(m).moe)) {
      std::vector<std::string> keys;
      for (const std::string& field : p.fields) keys.push_back("model.moe." + field);
      reject(keys, p.message);
    }
  }

  // The tokenizer's vocabulary with data.special_tokens, or nullopt when it cannot be known here
  // (a directory while files are not checked) or data.tokenizer is wrong (reported as such).
  std::optional<int64_t> tokenizer_vocab_size() {
    const DataConfig& d = config_.data;
    if (bad_.count("data.tokenizer") || bad_.count("data.special_tokens")) return std::nullopt;
    if (d.tokenizer != "bytes" && d.tokenizer != "gpt2" && files_ == ConfigFiles::skip)
      return std::nullopt;
    const std::filesystem::path named(d.tokenizer);
    const bool file = (named.extension() == ".model" || named.extension() == ".json") &&
                      std::filesystem::is_regular_file(named);
    if (d.tokenizer != "bytes" && d.tokenizer != "gpt2" && !std::filesystem::is_directory(named) &&
        !file) {
      error(blame({"data.tokenizer"}),
            "data.tokenizer: '" + d.tokenizer +
                "' is not bytes, gpt2, a tokenizer.json or SentencePiece .model file or a "
                "directory with tokenizer.json, tokenizer.model, vocab.txt, encoder.json + "
                "vocab.bpe or vocab.json + merges.txt");
      return std::nullopt;
    }
    try {
      return make_tokenizer(d.tokenizer, d.special_tokens)->vocab_size();
    } catch (const Error& e) {
      error(blame({"data.tokenizer"}), std::string("data.tokenizer: ") + e.what());
      return std::nullopt;
    }
  }

  // The active recipe's model families and its own rules (registry.h).
  void check_recipe() {
    if (config_.recipe.empty() || bad_.count("recipe")) return;
    const RecipeSpec& recipe = find_recipe(config_.recipe);
    const std::string& arch = config_.model.arch;
    std::vector<std::string> quoted;
    for (const std::string& f : recipe.families) quoted.push_back("'" + f + "'");
    cross({"model.arch", "recipe"},
          std::find(recipe.families.begin(), recipe.families.end(), arch) != recipe.families.end(),
          "recipe " + recipe.name + " trains model.arch " + joined(quoted, " or ") +
              ", the config says '" + arch + "'");
    if (recipe.check) recipe.check(*this);
  }

  std::string name_;
  ConfigFiles files_;
  RunConfig config_;
  std::map<std::string, std::filesystem::path> resolved_;  // checkpoint keys, resolved
  std::map<std::string, std::string> inherited_;  // keys taken from a stored config: by whom
  std::map<std::string, Where> where_;  // keys and sections given by the file or an override
  std::set<std::string> bad_;           // keys whose given value was rejected
  std::vector<Problem> problems_;
  bool unreadable_ = false;
  std::optional<Error> checkpoint_error_;  // thrown when the config itself is fine
};

}  // namespace

RunConfig load_config_string(const std::string& text, const std::string& name,
                             const std::vector<std::string>& overrides, ConfigFiles files) {
  Loader loader(name, files);
  loader.load_text(text);
  for (size_t i = 0; i < overrides.size(); ++i) loader.apply_override(i, overrides[i]);
  return loader.finish();
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config_string(read_input_file(path, kConfigInput), path, overrides,
                            ConfigFiles::check);
}

}  // namespace forge
