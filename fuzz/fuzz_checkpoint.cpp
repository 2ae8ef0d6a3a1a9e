// Fuzzes the checkpoint reader (runtime/checkpoint.h) on arbitrary files: the calls forge inspect,
// eval, generate and resume make, in the order they make them. What libhdf5 itself does with a
// corrupt file is outside Forge's control; docs/reliability.md says how findings there are triaged.
#include "fuzz/fuzz_util.h"
#include "runtime/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = forge::fuzz::write_input("checkpoint.h5", data, size);
  return forge::fuzz::run_expecting_forge_errors([&] {
    forge::verify_checkpoint(file);
    auto info = forge::read_checkpoint_info(file);
    // A verified file of a few MB at most: reading larger tensors only costs the fuzzer time.
    if (info.model_numel() + info.optim_numel() > (int64_t(1) << 20)) return;
    forge::LoadOptions options;
    options.expected_optim = info.optim;
    forge::load_checkpoint(file, info.model, options);
  });
}
