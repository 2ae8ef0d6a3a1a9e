// Forge's side of the `tokenizer` suite of scripts/bench (scripts/bench_tokenizer.sh builds this
// file itself, so the suite needs no CMake target): loads a tokenizer (`gpt2` unless named; any
// name or directory make_tokenizer takes), encodes a text file, whole or in chunks that end at the
// first line end after every CHUNK_BYTES (as scripts/bench_tokenizer.mjs cuts them), and prints
// one line `load_ms=X mb_s=Y tokens_s=Z tokens=N`.
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

// The text cut after the first '\n' at or past every `chunk` bytes (one piece when chunk is 0).
std::vector<std::string_view> chunks_of(std::string_view text, size_t chunk) {
  if (chunk == 0) return {text};
  std::vector<std::string_view> out;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', std::min(text.size(), begin + chunk));
    end = end == std::string_view::npos ? text.size() : end + 1;
    out.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 5) {
    std::fprintf(stderr,
                 "usage: bench_tokenizer_forge TEXT_FILE [REPEATS [TOKENIZER [CHUNK_BYTES]]]\n");
    return 2;
  }
  const int repeats = argc >= 3 ? std::atoi(argv[2]) : 3;
  if (repeats < 1) {
    std::fprintf(stderr, "bench_tokenizer_forge: REPEATS wants N >= 1, got '%s'\n", argv[2]);
    return 2;
  }
  const std::string name = argc >= 4 ? argv[3] : "gpt2";
  const long chunk = argc >= 5 ? std::atol(argv[4]) : 0;
  if (chunk < 0) {
    std::fprintf(stderr, "bench_tokenizer_forge: CHUNK_BYTES wants N >= 0, got '%s'\n", argv[4]);
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
    const std::vector<std::string_view> chunks = chunks_of(text, static_cast<size_t>(chunk));
    std::vector<double> load_s, encode_s;
    size_t tokens = 0;
    for (int r = 0; r <= repeats; ++r) {
      auto start = std::chrono::steady_clock::now();
      auto tok = forge::make_tokenizer(name);
      load_s.push_back(seconds_since(start));
      if (r == 0) {
        tok->encode(std::string_view(text).substr(0, std::min<size_t>(text.size(), 65536)));
        continue;
      }
      start = std::chrono::steady_clock::now();
      tokens = 0;
      for (std::string_view c : chunks) tokens += tok->encode(c).size();
      encode_s.push_back(seconds_since(start));
    }
    std::sort(encode_s.begin(), encode_s.end());
    const double median = encode_s[encode_s.size() / 2];
    std::printf("load_ms=%.1f mb_s=%.3f tokens_s=%.0f tokens=%zu\n", load_s[0] * 1e3,
                static_cast<double>(text.size()) / 1e6 / median,
                static_cast<double>(tokens) / median, tokens);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer_forge: %s\n", e.what());
    return 1;
  }
}
