// The recipe registry's shared half: the catalog a program installs, lookups in it, and command
// options. The list of recipes itself is recipes/catalog.cpp, a layer above.
#include "runtime/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "core/error.h"

namespace forge {

namespace {

// Set once by install_catalog, before any config is read.
Catalog& installed_catalog() {
  static Catalog catalog;
  return catalog;
}

}  // namespace

void install_catalog(Catalog catalog) { installed_catalog() = std::move(catalog); }

const std::vector<RecipeSpec>& recipe_registry() {
  FORGE_CHECK(!installed_catalog().recipes.empty(),
              "recipe_registry: no recipes installed (install_catalog at program start)");
  return installed_catalog().recipes;
}

const std::vector<ConfigSection>& config_sections() { return installed_catalog().sections; }

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

const RecipeCommand* find_recipe_command(const std::string& name) {
  for (const RecipeSpec& recipe : recipe_registry())
    for (const RecipeCommand& command : recipe.commands)
      if (command.name == name) return &command;
  return nullptr;
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
