// The merge loop both BPE tokenizers run (GPT-2's tiktoken-style one in data/bpe.cpp and
// tokenizer.json's in data/tokenizer_json_model.cpp): adjacent parts merge lowest rank first,
// leftmost on ties, until no adjacent pair has a merge; and the per-piece cache in front of it,
// because natural text repeats its words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace forge::bpe {

/// A merge: parts `left` and `right` next to each other become `made`, before any merge of
/// higher rank.
struct Merge {
  int32_t left, right, rank, made;
};

/// Open-addressing map (left, right) -> (rank, made): the merge loop's only lookup.
class MergeTable {
 public:
  /// A pair given twice keeps its last entry (Hugging Face's merge map does the same).
  void build(const std::vector<Merge>& merges);
  /// The merge of `left` followed by `right`, or nullptr.
  const Merge* find(int32_t left, int32_t right) const;

  /// Merges `parts` (ids) in place until no adjacent pair has a merge. `lens`, if given, holds a
  /// length per part, summed as parts merge (Hugging Face's offsets within a piece). `ranks` is
  /// scratch space.
  void merge(std::vector<int32_t>& parts, std::vector<uint32_t>* lens,
             std::vector<int32_t>& ranks) const;

 private:
  static constexpr size_t kShortPiece = 64;  // longer pieces take the O(n log n) merge
  void merge_short(std::vector<int32_t>& parts, std::vector<uint32_t>* lens,
                   std::vector<int32_t>& ranks) const;
  void merge_long(std::vector<int32_t>& parts, std::vector<uint32_t>* lens) const;

  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  uint64_t mask_ = 0;
};

/// Piece -> its merged ids (and lengths, for callers that keep them), bounded so that a stream of
/// unique pieces cannot grow it without limit. Not thread-safe: each thread needs its own
/// (BpeTokenizer keeps a few behind try-locks, tokenizer.json's BPE one per thread).
class PieceCache {
 public:
  /// Appends the cached ids (and lengths, if `lens`) of `piece` and returns true, or returns
  /// false.
  bool append(std::string_view piece, std::vector<int32_t>& ids, std::vector<uint32_t>* lens) const;
  void insert(std::string_view piece, const std::vector<int32_t>& ids,
              const std::vector<uint32_t>* lens);

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, Hash, std::equal_to<>> spans_;
  std::vector<int32_t> ids_;
  std::vector<uint32_t> lens_;  // parallel to ids_ when the owner keeps lengths
};

}  // namespace forge::bpe
