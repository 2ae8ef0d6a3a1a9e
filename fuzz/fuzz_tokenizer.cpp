// Fuzzes the tokenizer loaders: the input is two files split at the first NUL byte, loaded as
// encoder.json + vocab.bpe (data/bpe.h) and as vocab.txt + tokenizer_config.json
// (data/wordpiece.h). A loaded tokenizer must encode and decode text without crashing.
#include <algorithm>
#include <string>

#include "data/bpe.h"
#include "data/wordpiece.h"
#include "fuzz/fuzz_util.h"

namespace {

void exercise(const forge::Tokenizer& tokenizer, const std::string& more_text) {
  const std::string text =
      "Hello, world! <|endoftext|> 'tis  \xc3\xa9t\xc3\xa9\n<|pad|>[MASK] \xe4\xb8\xad\xff";
  for (const std::string& t : {text, more_text}) {
    auto ids = tokenizer.encode(t);
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    tokenizer.decode(ids);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t(0));
  const size_t first_size = size_t(nul - data);
  const size_t second_offset = std::min(size, first_size + 1);
  const std::string first(reinterpret_cast<const char*>(data), first_size);
  const auto& dir = forge::fuzz::scratch_dir();
  for (const char* name : {"encoder.json", "vocab.txt"})
    forge::fuzz::write_input(name, data, first_size);
  for (const char* name : {"vocab.bpe", "tokenizer_config.json"})
    forge::fuzz::write_input(name, data + second_offset, size - second_offset);
  forge::fuzz::run_expecting_forge_errors([&] {
    exercise(forge::BpeTokenizer(dir / "encoder.json", dir / "vocab.bpe", "fuzz", {"<|pad|>"}),
             first);
  });
  return forge::fuzz::run_expecting_forge_errors([&] {
    exercise(forge::WordPieceTokenizer(dir, "fuzz", {"<|pad|>"}), first);
  });
}
