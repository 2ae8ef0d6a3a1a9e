// Where LMWindows reads token ids from: a sequence it reads ranges of, either held in memory (text
// inputs, records, tests) or read from a token dataset on disk on demand (data/token_dataset.h),
// so that a corpus larger than memory trains with resident memory that does not grow with it.
// Views (a slice, shards end to end) and a bounded block cache compose over any source.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace forge {

/// A read-only sequence of token ids.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  /// Ids [at, at + n) into `dst`. A source read from a file range-checks what it reads: an id
  /// outside the vocabulary is Error(data) naming the file and position.
  void read(int64_t at, int64_t n, int32_t* dst) const;

 protected:
  virtual void read_range(int64_t at, int64_t n, int32_t* dst) const = 0;
};

/// Ids held in memory.
class MemoryTokens final : public TokenSource {
 public:
  explicit MemoryTokens(std::shared_ptr<const std::vector<int32_t>> tokens)
      : tokens_(std::move(tokens)) {}
  int64_t size() const override { return int64_t(tokens_->size()); }

 private:
  void read_range(int64_t at, int64_t n, int32_t* dst) const override;
  std::shared_ptr<const std::vector<int32_t>> tokens_;
};

/// Ids [begin, end) of `source`.
std::shared_ptr<const TokenSource> slice_tokens(std::shared_ptr<const TokenSource> source,
                                                int64_t begin, int64_t end);

/// The sources end to end (the shards of a dataset): a read may cross from one into the next.
std::shared_ptr<const TokenSource> concatenate_tokens(
    std::vector<std::shared_ptr<const TokenSource>> parts);

/// `source` read in aligned blocks of `block` ids through a least-recently-used cache of at most
/// `capacity` blocks (block * capacity * 4 bytes of memory): sequential evaluation windows and a
/// dataset that fits the cache are read from disk once; larger reads bypass it.
std::shared_ptr<const TokenSource> cache_tokens(std::shared_ptr<const TokenSource> source,
                                                int64_t block, int64_t capacity);

/// A train / validation pair of sources.
struct TokenSourceSplit {
  std::shared_ptr<const TokenSource> train, val;
};

}  // namespace forge
