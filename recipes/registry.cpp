// The one list of recipes and the one list of recipe sections. A new recipe adds its
// `<name>_recipe()` (and any new section) here; nothing else in the loader or the CLI changes.
#include "recipes/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "recipes/bert_objective.h"
#include "recipes/bert_pretrain.h"
#include "recipes/classify.h"
#include "recipes/distill.h"
#include "recipes/dpo.h"
#include "recipes/ppo.h"
#include "recipes/finetune.h"
#include "recipes/gpt_pretrain.h"
#include "recipes/lora_config.h"
#include "recipes/preference_config.h"
#include "recipes/reward_model.h"

namespace forge {

const std::vector<RecipeSpec>& recipe_registry() {
  static const std::vector<RecipeSpec> recipes = {
      gpt_pretrain_recipe(),
      bert_pretrain_recipe(),
      finetune_recipe(),
      distill_recipe(),
      classify_recipe(),
      reward_model_recipe(),
      dpo_recipe(),
      ppo_recipe(),
  };
  return recipes;
}

const std::vector<ConfigSection>& config_sections() {
  static const std::vector<ConfigSection> sections = {
      bert_section(),
      lora_section(),
      finetune_section(),
      distill_section(),
      classify_section(),
      preference_section(),
      reward_model_section(),
      dpo_section(),
      ppo_section(),
  };
  return sections;
}

std::string CommandOptions::text(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  return it == values.end() ? fallback : it->second;
}

double CommandOptions::number(const std::string& name, double fallback) const {
  auto it = values.find(name);
  if (it == values.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end)
    throw Error(ExitCode::usage,
                detail::concat("--", name, ": expected a number, got '", it->second, "'"));
  return v;
}

int64_t CommandOptions::integer(const std::string& name, int64_t fallback) const {
  const double v = number(name, double(fallback));
  if (!(std::fabs(v) < 9.0e15) || v != double(int64_t(v)))
    throw Error(ExitCode::usage,
                detail::concat("--", name, ": expected an integer, got '", values.at(name), "'"));
  return int64_t(v);
}

const RecipeSpec& find_recipe(const std::string& name) {
  std::string known;
  for (const RecipeSpec& recipe : recipe_registry()) {
    if (recipe.name == name) return recipe;
    known += (known.empty() ? "" : ", ") + recipe.name;
  }
  throw Error(ExitCode::usage, "unknown recipe '" + name + "' (known recipes: " + known + ")");
}

std::vector<std::string> recipes_reading(const std::string& section) {
  std::vector<std::string> names;
  for (const RecipeSpec& recipe : recipe_registry())
    if (std::find(recipe.sections.begin(), recipe.sections.end(), section) !=
        recipe.sections.end())
      names.push_back(recipe.name);
  return names;
}

}  // namespace forge
