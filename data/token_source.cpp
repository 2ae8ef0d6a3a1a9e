// Token sources: memory, slices, concatenation and the bounded block cache (token_source.h).
#include "data/token_source.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace forge {

void TokenSource::read(int64_t at, int64_t n, int32_t* dst) const {
  FORGE_CHECK(at >= 0 && n >= 0 && at <= size() - n, "TokenSource::read: [", at, ", ", at + n,
              ") is outside [0, ", size(), ")");
  if (n > 0) read_range(at, n, dst);
}

void MemoryTokens::read_range(int64_t at, int64_t n, int32_t* dst) const {
  std::memcpy(dst, tokens_->data() + at, size_t(n) * sizeof(int32_t));
}

namespace {

class SliceTokens final : public TokenSource {
 public:
  SliceTokens(std::shared_ptr<const TokenSource> source, int64_t begin, int64_t end)
      : source_(std::move(source)), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }

 private:
  void read_range(int64_t at, int64_t n, int32_t* dst) const override {
    source_->read(begin_ + at, n, dst);
  }
  std::shared_ptr<const TokenSource> source_;
  int64_t begin_, end_;
};

class ConcatenatedTokens final : public TokenSource {
 public:
  explicit ConcatenatedTokens(std::vector<std::shared_ptr<const TokenSource>> parts)
      : parts_(std::move(parts)) {
    starts_.push_back(0);
    for (const auto& p : parts_) starts_.push_back(starts_.back() + p->size());
  }
  int64_t size() const override { return starts_.back(); }

 private:
  void read_range(int64_t at, int64_t n, int32_t* dst) const override {
    // The last part starting at or before `at` (empty parts share their start with the next).
    size_t i = size_t(std::upper_bound(starts_.begin(), starts_.end() - 1, at) - starts_.begin()) - 1;
    while (n > 0) {
      const int64_t offset = at - starts_[i];
      const int64_t take = std::min(n, parts_[i]->size() - offset);
      if (take > 0) parts_[i]->read(offset, take, dst);
      at += take;
      dst += take;
      n -= take;
      ++i;
    }
  }
  std::vector<std::shared_ptr<const TokenSource>> parts_;
  std::vector<int64_t> starts_;  // prefix sums of the parts' sizes
};

class CachedTokens final : public TokenSource {
 public:
  CachedTokens(std::shared_ptr<const TokenSource> source, int64_t block, int64_t capacity)
      : source_(std::move(source)), block_(block), capacity_(size_t(capacity)) {
    FORGE_CHECK(block > 0 && capacity > 0, "cache_tokens: block ", block, ", capacity ", capacity);
  }
  int64_t size() const override { return source_->size(); }

 private:
  struct Block {
    int64_t index;
    std::vector<int32_t> ids;
  };

  // Under the lock throughout: it serialises the readers below too (libhdf5 is not thread-safe).
  void read_range(int64_t at, int64_t n, int32_t* dst) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n > block_) {  // a long read would only push out what the windows reuse
      source_->read(at, n, dst);
      return;
    }
    while (n > 0) {
      const int64_t index = at / block_, offset = at - index * block_;
      const std::vector<int32_t>& ids = fetch(index);
      const int64_t take = std::min(n, int64_t(ids.size()) - offset);
      std::memcpy(dst, ids.data() + offset, size_t(take) * sizeof(int32_t));
      at += take;
      dst += take;
      n -= take;
    }
  }

  // Block `index`, made the most recently used; read from the source when missing.
  const std::vector<int32_t>& fetch(int64_t index) const {
    if (auto it = where_.find(index); it != where_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->ids;
    }
    if (lru_.size() < capacity_) {
      lru_.push_front({index, {}});
    } else {
      lru_.splice(lru_.begin(), lru_, std::prev(lru_.end()));
      where_.erase(lru_.front().index);
      lru_.front().index = index;
    }
    Block& b = lru_.front();
    const int64_t start = index * block_;
    b.ids.resize(size_t(std::min(block_, source_->size() - start)));
    try {
      source_->read(start, int64_t(b.ids.size()), b.ids.data());
    } catch (...) {
      lru_.pop_front();
      throw;
    }
    where_[index] = lru_.begin();
    return b.ids;
  }

  std::shared_ptr<const TokenSource> source_;
  const int64_t block_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  mutable std::list<Block> lru_;  // most recently used first
  mutable std::unordered_map<int64_t, std::list<Block>::iterator> where_;
};

}  // namespace

std::shared_ptr<const TokenSource> slice_tokens(std::shared_ptr<const TokenSource> source,
                                                int64_t begin, int64_t end) {
  FORGE_CHECK(0 <= begin && begin <= end && end <= source->size(), "slice_tokens: [", begin, ", ",
              end, ") of ", source->size());
  return std::make_shared<SliceTokens>(std::move(source), begin, end);
}

std::shared_ptr<const TokenSource> concatenate_tokens(
    std::vector<std::shared_ptr<const TokenSource>> parts) {
  if (parts.size() == 1) return parts.front();
  return std::make_shared<ConcatenatedTokens>(std::move(parts));
}

std::shared_ptr<const TokenSource> cache_tokens(std::shared_ptr<const TokenSource> source,
                                                int64_t block, int64_t capacity) {
  return std::make_shared<CachedTokens>(std::move(source), block, capacity);
}

}  // namespace forge
