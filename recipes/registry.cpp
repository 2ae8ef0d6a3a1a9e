// The one list of recipes and the one list of recipe sections. A new recipe adds its
// `<name>_recipe()` (and any new section) here; nothing else in the loader or the CLI changes.
#include "recipes/registry.h"

#include <algorithm>

#include "core/error.h"
#include "recipes/bert_objective.h"
#include "recipes/bert_pretrain.h"
#include "recipes/classify.h"
#include "recipes/distill.h"
#include "recipes/finetune.h"
#include "recipes/gpt_pretrain.h"
#include "recipes/lora_config.h"

namespace forge {

const std::vector<RecipeSpec>& recipe_registry() {
  static const std::vector<RecipeSpec> recipes = {
      gpt_pretrain_recipe(),
      bert_pretrain_recipe(),
      finetune_recipe(),
      distill_recipe(),
      classify_recipe(),
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
  };
  return sections;
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
