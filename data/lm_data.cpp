// Byte tokens, the positional split and LM windows. Training windows are i.i.d. uniform starts (as
// nanoGPT samples them); evaluation windows tile the split.
#include "data/lm_data.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"

namespace forge {

std::vector<int32_t> read_byte_tokens(const std::filesystem::path& path) {
  const std::string text = read_input_file(path.string(), kCorpusInput);
  std::vector<int32_t> tokens(text.size());
  std::transform(text.begin(), text.end(), tokens.begin(),
                 [](char c) { return int32_t(uint8_t(c)); });
  return tokens;
}

TokenSplit split_by_position(std::vector<int32_t> tokens, double val_fraction) {
  FORGE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction must be in [0, 1), got ",
              val_fraction);
  size_t n_val = size_t(double(tokens.size()) * val_fraction);
  auto val = std::make_shared<std::vector<int32_t>>(tokens.end() - ptrdiff_t(n_val), tokens.end());
  tokens.resize(tokens.size() - n_val);
  return {std::make_shared<const std::vector<int32_t>>(std::move(tokens)), std::move(val)};
}

LMWindows::LMWindows(std::shared_ptr<const TokenSource> tokens, int64_t context)
    : tokens_(std::move(tokens)), context_(context) {
  FORGE_CHECK(context_ > 0, "LMWindows: context must be positive, got ", context_);
  if (tokens_->size() < context_ + 1)
    throw Error(ExitCode::data, detail::concat("the split has ", tokens_->size(),
                                               " tokens, fewer than context + 1 = ", context_ + 1));
}

LMWindows::LMWindows(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t context)
    : LMWindows(std::make_shared<const MemoryTokens>(std::move(tokens)), context) {}

void LMWindows::fill_row(int64_t start, std::vector<int32_t>& window, int64_t* ids,
                         int64_t* targets) const {
  const int64_t T = context_;
  tokens_->read(start, T + 1, window.data());
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = window[size_t(t)];
    targets[t] = window[size_t(t + 1)];
  }
}

LMBatch LMWindows::sample(int64_t batch_size, uint64_t seed, int64_t step, int64_t micro) const {
  const int64_t T = context_;
  Tensor ids = empty({batch_size, T}, DType::i64), targets = empty({batch_size, T}, DType::i64);
  uint64_t starts = uint64_t(num_tokens() - T);  // valid starts: 0 .. n - T - 1
  uint64_t stream = rng_stream("lm_batch", uint64_t(step));
  std::vector<int32_t> window(size_t(T + 1));
  for (int64_t b = 0; b < batch_size; ++b) {
    auto w = philox(seed, stream, uint64_t(micro * batch_size + b));
    uint64_t r = (uint64_t(w[0]) << 32) | w[1];
    int64_t start = int64_t(r % starts);
    fill_row(start, window, ids.data<int64_t>() + b * T, targets.data<int64_t>() + b * T);
  }
  return {ids, targets};
}

int64_t LMWindows::num_eval_windows() const {
  return (num_tokens() - 1 + context_ - 1) / context_;
}

LMBatch LMWindows::eval_batch(int64_t first, int64_t count) const {
  const int64_t T = context_, windows = num_eval_windows();
  count = std::min(count, windows - first);
  FORGE_CHECK(first >= 0 && count > 0, "eval_batch: window ", first, " out of range [0, ", windows,
              ")");
  Tensor ids = empty({count, T}, DType::i64), targets = empty({count, T}, DType::i64);
  std::vector<int32_t> window(size_t(T + 1));
  for (int64_t i = 0; i < count; ++i) {
    int64_t w = first + i, start = w * T;
    int64_t* pt = targets.data<int64_t>() + i * T;
    if (start + T + 1 > num_tokens()) {
      // The last window ends at the split's end; skip the targets the previous window scored.
      int64_t shifted = num_tokens() - 1 - T;
      fill_row(shifted, window, ids.data<int64_t>() + i * T, pt);
      for (int64_t t = 0; t < start - shifted; ++t) pt[t] = kIgnoreTarget;
    } else {
      fill_row(start, window, ids.data<int64_t>() + i * T, pt);
    }
  }
  return {ids, targets};
}

}  // namespace forge
