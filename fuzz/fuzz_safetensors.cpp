// Fuzzes the safetensors reader (core/safetensors.h): a file either opens or throws forge::Error,
// and every float tensor of an opened file reads with the shape its header declares.
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = forge::fuzz::write_input("model.safetensors", data, size);
  return forge::fuzz::run_expecting_forge_errors([&] {
    forge::SafetensorsFile f(file);
    for (const forge::SafetensorsEntry& e : f.entries()) {
      if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64") continue;
      if (f.read_f32(e.name).shape() != e.shape) __builtin_trap();
    }
  });
}
