// Errors that reach users. Every check at a boundary throws forge::Error carrying an exit code of
// the README's table, so the CLI can print one line and exit; `assert` is reserved for kernel
// internals.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace forge {

/// Exit codes of the forge binary (README.md).
enum class ExitCode : int {
  ok = 0,
  internal = 1,
  usage = 2,
  data = 3,
  checkpoint = 4,
  numerical = 5,
};

/// An error with the exit code it maps to; what() is the one line shown to users.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

/// `text` as one printable line: control characters (newlines included), DEL, C1 controls and bytes
/// that are not UTF-8 are escaped (`\n`, `\t`, `\x1b`, `\xff`), so a message quoting a file's
/// bytes or a user's string can neither span lines nor drive the terminal. Valid UTF-8 passes.
/// Text beyond kMaxPrintable characters is cut and the rest counted.
inline constexpr size_t kMaxPrintable = 1000;
std::string printable(std::string_view text);

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace forge

/// Throws forge::Error(internal) with the failed condition and a message built from the arguments,
/// e.g. FORGE_CHECK(a.dim() == 2, "matmul: a must be 2-D, got shape ", a.shape()).
#define FORGE_CHECK(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::forge::Error(::forge::ExitCode::internal, ::forge::detail::concat(__VA_ARGS__)); \
  } while (0)
