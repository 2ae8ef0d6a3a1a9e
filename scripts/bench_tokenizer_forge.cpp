// Forge's side of the `tokenizer` suite of scripts/bench (scripts/bench_tokenizer.sh builds this
// file itself, so the suite needs no CMake target): loads the `gpt2` tokenizer, encodes a text file
// and prints one line `load_ms=X mb_s=Y tokens=N` (make_tokenizer finds data/tokenizers/gpt2 in
// the source tree the libraries were built from).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: bench_tokenizer_forge TEXT_FILE [REPEATS]\n");
    return 2;
  }
  const int repeats = argc == 3 ? std::atoi(argv[2]) : 3;
  if (repeats < 1) {
    std::fprintf(stderr, "bench_tokenizer_forge: REPEATS wants N >= 1, got '%s'\n", argv[2]);
    return 2;
  }
  try {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer_forge: cannot read '%s'\n", argv[1]);
      return 1;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

    // Each timed encode gets a freshly loaded tokenizer: the piece cache it keeps across calls
    // would otherwise turn every encode after the first into lookups of pieces already seen,
    // which neither tiktoken nor js-tiktoken get. The first load (cold) is the one reported; the
    // first tokenizer only warms up the code on a small prefix, as the node side does.
    std::vector<double> load_s, encode_s;
    size_t tokens = 0;
    for (int r = 0; r <= repeats; ++r) {
      auto start = std::chrono::steady_clock::now();
      auto tok = forge::make_tokenizer("gpt2");
      load_s.push_back(seconds_since(start));
      if (r == 0) {
        tok->encode(std::string_view(text).substr(0, std::min<size_t>(text.size(), 65536)));
        continue;
      }
      start = std::chrono::steady_clock::now();
      tokens = tok->encode(text).size();
      encode_s.push_back(seconds_since(start));
    }
    std::sort(encode_s.begin(), encode_s.end());
    const double median = encode_s[encode_s.size() / 2];
    std::printf("load_ms=%.1f mb_s=%.3f tokens=%zu\n", load_s[0] * 1e3,
                static_cast<double>(text.size()) / 1e6 / median, tokens);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer_forge: %s\n", e.what());
    return 1;
  }
}
