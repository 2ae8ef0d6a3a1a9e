// Fuzzes the BPE tokenizer loader (data/bpe.h): the input is encoder.json, a NUL byte, then
// vocab.bpe. A loaded tokenizer must encode and decode text without crashing.
#include <algorithm>
#include <string>

#include "data/bpe.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t(0));
  const size_t encoder_size = size_t(nul - data);
  const size_t merges_offset = std::min(size, encoder_size + 1);
  forge::fuzz::write_input("encoder.json", data, encoder_size);
  forge::fuzz::write_input("vocab.bpe", data + merges_offset, size - merges_offset);
  return forge::fuzz::run_expecting_forge_errors([&] {
    forge::BpeTokenizer tokenizer(forge::fuzz::scratch_dir(), "fuzz", {"<|pad|>"});
    const std::string text = "Hello, world! <|endoftext|> 'tis  \xc3\xa9t\xc3\xa9\n<|pad|>";
    auto ids = tokenizer.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    tokenizer.decode(ids);
    tokenizer.encode(std::string(reinterpret_cast<const char*>(data), encoder_size));
  });
}
