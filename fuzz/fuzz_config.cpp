// Fuzzes the YAML config loader (runtime/config.h): any text either loads or throws forge::Error,
// and a config that loads round-trips through to_yaml.
#include <string>

#include "fuzz/fuzz_util.h"
#include "recipes/catalog.h"
#include "runtime/config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  forge::install_catalog(forge::forge_catalog());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return forge::fuzz::run_expecting_forge_errors([&] {
    // ConfigFiles::skip: the fuzzer's paths name no real files, and following them would make
    // the outcome depend on the machine.
    auto config = forge::load_config_string(text, "fuzz.yaml", {}, forge::ConfigFiles::skip);
    auto again = forge::load_config_string(forge::to_yaml(config), "fuzz.yaml", {},
                                           forge::ConfigFiles::skip);
    if (forge::to_yaml(again) != forge::to_yaml(config)) __builtin_trap();
  });
}
