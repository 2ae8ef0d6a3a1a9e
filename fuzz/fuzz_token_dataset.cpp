// Fuzzes the token-dataset readers (data/token_dataset.h): a file either opens or throws
// forge::Error, in memory and streamed, and an opened dataset yields batches whose ids are within
// its vocabulary, the same from both readers.
#include "data/lm_data.h"
#include "data/token_dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = forge::fuzz::write_input("tokens.h5", data, size);
  return forge::fuzz::run_expecting_forge_errors([&] {
    auto dataset = forge::open_token_dataset(file, nullptr, 1 << 20);
    const int64_t vocab = dataset.info().vocab_size;
    for (int32_t id : *dataset.tokens())
      if (id < 0 || id >= vocab) __builtin_trap();
    auto split = dataset.split_by_document(0.5);
    auto streamed = forge::open_token_dataset_reader(file, nullptr, 1 << 20).split_by_document(0.5);
    if (streamed.train->size() != int64_t(split.train->size())) __builtin_trap();
    const int64_t context = 4;
    if (int64_t(split.train->size()) <= context) return;
    forge::LMWindows windows(split.train, context), stream_windows(streamed.train, context);
    for (int64_t step = 0; step < 3; ++step)
      if (windows.sample(2, 1234, step).ids.to_vector<int64_t>() !=
          stream_windows.sample(2, 1234, step).ids.to_vector<int64_t>())
        __builtin_trap();
  });
}
