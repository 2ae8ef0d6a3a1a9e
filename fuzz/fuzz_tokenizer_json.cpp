// Fuzzes the tokenizer.json loader (data/tokenizer_json.h): the input up to its first NUL byte is
// the file, the rest more text to encode. A loaded tokenizer must encode (with offsets inside the
// text), decode and add its special tokens without crashing; only forge::Error may escape.
#include <algorithm>
#include <string>

#include "data/tokenizer_json.h"
#include "fuzz/fuzz_util.h"

namespace {

void exercise(const forge::Tokenizer& tokenizer, const std::string& more_text) {
  const std::string text =
      "Hello, world! <s> 'tis  \xc3\xa9t\xc3\xa9\n<|endoftext|>[MASK] \xe4\xb8\xad "
      "\xf0\x9f\x98\x80";
  for (const std::string& t : {text, more_text}) {
    const forge::Encoding e = tokenizer.encode_with_offsets(t);
    if (e.ids.size() != e.offsets.size()) __builtin_trap();
    for (size_t i = 0; i < e.ids.size(); ++i)
      if (e.ids[i] < 0 || e.ids[i] >= tokenizer.vocab_size() ||
          e.offsets[i].first > e.offsets[i].second || e.offsets[i].second > t.size())
        __builtin_trap();
    tokenizer.decode(tokenizer.with_special_tokens(e.ids));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t(0));
  const size_t file_size = size_t(nul - data);
  const size_t text_offset = std::min(size, file_size + 1);
  const std::string more_text(reinterpret_cast<const char*>(data) + text_offset,
                              size - text_offset);
  const auto file = forge::fuzz::write_input("tokenizer.json", data, file_size);
  return forge::fuzz::run_expecting_forge_errors(
      [&] { exercise(forge::TokenizerJson(file, "fuzz", {"<|pad|>"}), more_text); });
}
