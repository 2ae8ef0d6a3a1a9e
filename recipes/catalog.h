// The recipes and recipe sections of the forge binary, in one explicit list. A new recipe adds its
// `<name>_recipe()` (and any new section) in catalog.cpp; nothing in the runtime or the CLI
// changes.
#pragma once

#include "runtime/registry.h"

namespace forge {

/// Every recipe and section Forge ships, for install_catalog.
Catalog forge_catalog();

}  // namespace forge
