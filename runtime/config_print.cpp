// Printing the config: the resolved YAML (common sections and the active recipe's own) and the
// type, allowed values and default of a key as docs/config.md writes them.
#include "runtime/config_internal.h"

namespace forge {

using namespace config_detail;

std::string to_yaml(const RunConfig& config) {
  const SchemaIndex& ix = schema_index();
  std::string out;
  auto emit = [&](auto& self, const std::string& prefix, int depth) -> void {
    for (const auto& name : ix.children.at(prefix)) {
      std::string path = join(prefix, name);
      std::string indent(static_cast<size_t>(2 * depth), ' ');
      // A recipe section is shown only with the recipe that reads it.
      if (depth == 0 && !recipe_section_of(path).empty() && !recipe_reads(config, path)) continue;
      // The MoE keys are shown only for a model that has MoE layers.
      if (path == "model.moe" && config.model.moe_every == 0) continue;
      // Likewise the rotary scaling keys for a model whose rotary frequencies are not scaled.
      if (path == "model.rope_scaling" && config.model.rope_scaling == "none") continue;
      if (const ConfigKey* key = find_config_key(path)) {
        out += indent + name + ": " + format_config_value(key->get(config)) + "\n";
      } else {
        out += indent + name + ":\n";
        self(self, path, depth + 1);
      }
    }
  };
  emit(emit, "", 0);
  return out;
}

std::string config_type_name(const ConfigKey& key) {
  switch (key.type) {
    case ConfigType::integer: return "integer";
    case ConfigType::number: return "number";
    case ConfigType::boolean: return "bool";
    case ConfigType::string: return "string";
    case ConfigType::path: return "path";
    case ConfigType::checkpoint: return "checkpoint";
    case ConfigType::choice: return "choice";
    case ConfigType::number_list: return "list of " + std::to_string(key.list_size) + " numbers";
    case ConfigType::string_list: return "list of strings";
    case ConfigType::integer_list: return "list of integers";
  }
  return "";
}

std::string config_allowed_text(const ConfigKey& key) {
  if (key.type != ConfigType::choice) return key.range.text;
  std::string out;
  for (const auto& c : key.choices) out += (out.empty() ? "" : ", ") + c;
  return out;
}

std::string config_default_text(const ConfigKey& key) {
  if (key.required) return "required";
  if (!key.shown_default.empty()) return key.shown_default;
  return format_config_value(key.default_value);
}

}  // namespace forge
