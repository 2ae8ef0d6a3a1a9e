// What the forge prepare tests share: running under a given OpenMP thread limit (which sets
// prepare's thread count), a dataset's contents, and the contents prepare owes for some inputs.
#pragma once

#include <omp.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/prepare.h"
#include "data/token_dataset.h"
#include "tests/test_util.h"

namespace forge::testing {

/// f() with OpenMP limited to `threads`, the previous limit restored after.
template <class F>
auto with_threads(int threads, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  struct Restore {
    int n;
    ~Restore() { omp_set_num_threads(n); }
  } restore{before};
  return f();
}

/// A dataset's document offsets and tokens.
using DatasetContents = std::pair<std::vector<int64_t>, std::vector<int32_t>>;

inline DatasetContents contents(const std::filesystem::path& file) {
  const TokenDataset d = open_token_dataset(file);
  return {d.doc_offsets(), *d.tokens()};
}

/// What prepare must write: split_records over each whole file, each document encode()d in turn.
inline DatasetContents expected_contents(const Tokenizer& tok,
                                         const std::vector<std::filesystem::path>& inputs,
                                         RecordFormat format) {
  DatasetContents out{{0}, {}};
  for (const std::filesystem::path& in : inputs) {
    const std::string text = read_file(in);
    for (std::string_view doc : split_records(text, format)) {
      const std::vector<int32_t> ids = tok.encode(doc);
      out.second.insert(out.second.end(), ids.begin(), ids.end());
      out.first.push_back(int64_t(out.second.size()));
    }
  }
  return out;
}

}  // namespace forge::testing
