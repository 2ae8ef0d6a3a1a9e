// Fuzzes the Jinja interpreter (data/jinja.h) through ChatTemplate: the input up to its first NUL
// byte is a chat template, the rest the user's message. Parsing and rendering must end in text or
// a forge::Error, within the interpreter's bounds (no hang, no runaway memory).
#include <algorithm>
#include <string>

#include "data/chat_template.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t(0));
  const std::string source(reinterpret_cast<const char*>(data), size_t(nul - data));
  const std::string content(reinterpret_cast<const char*>(std::min(nul + 1, data + size)),
                            reinterpret_cast<const char*>(data + size));
  return forge::fuzz::run_expecting_forge_errors([&] {
    const forge::ChatTemplate tmpl(source, "fuzz", "<s>", "</s>");
    const std::vector<forge::ChatMessage> messages = {
        {"system", "Be brief."}, {"user", content}, {"assistant", "  Sure: \"ok\"\n"}};
    tmpl.render(messages, true);
    tmpl.render({{"user", content}}, false);
  });
}
