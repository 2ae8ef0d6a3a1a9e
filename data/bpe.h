// GPT-2 byte-level BPE: the vocabulary (encoder.json + vocab.bpe, which Hugging Face names
// vocab.json + merges.txt), GPT-2's pre-tokenisation regex implemented by hand over UTF-8, and
// merges applied exactly as OpenAI's tiktoken does (repeatedly merge the adjacent pair whose
// concatenation has the lowest rank, leftmost first; rank == id).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/bpe_merge.h"
#include "data/tokenizer.h"

namespace forge {

/// Pieces of `text` as split by GPT-2's pattern
/// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ . Bytes that are not
/// valid UTF-8 count as one-byte characters that are neither letter, number nor space.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

/// `bytes` in GPT-2's byte alphabet (bytes_to_unicode), as UTF-8: how encoder.json and vocab.bpe
/// spell tokens.
std::string gpt2_spelling(std::string_view bytes);

class BpeTokenizer final : public Tokenizer {
 public:
  /// Loads the token ids (encoder.json) and the merges (vocab.bpe). Ids from 256 + (number of
  /// merges) on are special tokens (a trained vocabulary's "<|endoftext|>", "[PAD]", "[CLS]",
  /// ...), as is "<|endoftext|>" anywhere. `specials` not already in the vocabulary get ids after
  /// it. Throws Error(data) naming the file.
  BpeTokenizer(const std::filesystem::path& encoder_file, const std::filesystem::path& merges_file,
               std::string name, const std::vector<std::string>& specials = {});

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  /// Starts of lines that begin with an ASCII letter after a line ending in a visible ASCII
  /// character, away from any special token.
  std::vector<size_t> independent_cuts(std::string_view text, size_t every) const override;
  int32_t vocab_size() const override { return num_tokens_ + num_extra_specials_; }
  std::string name() const override { return name_; }

  /// Every token in id order as encoder.json spells it (gpt2_spelling), special tokens as their
  /// text: the vocabulary another format (GGUF) stores.
  std::vector<std::string> spelled_tokens() const;
  /// The merges in rank order as vocab.bpe spells them ("left right").
  std::vector<std::string> spelled_merges() const;
  /// Every split of every mergeable token into two tokens, spelled "left right", in the order
  /// encode() applies them: by the id of the token made (its vocab.bpe merge first, then by split
  /// point). tiktoken-style merging as an explicit merge list, which Hugging Face's BPE with
  /// ignore_merges follows (tokenizer.json).
  std::vector<std::string> spelled_merge_pairs() const;

 private:
  struct Merge {
    std::string joined;  // the bytes of the token the merge makes
    size_t left_bytes;   // how many of them the left part holds
    size_t line;         // in vocab.bpe, for errors
  };
  /// The bytes of token `id` < num_tokens_ (a view into token_bytes_).
  std::string_view bytes_of(int32_t id) const;
  static std::vector<Merge> read_merges(const std::filesystem::path& path);
  void build_vocabulary(const std::vector<std::pair<std::string, int32_t>>& entries,
                        size_t num_merges, const std::filesystem::path& path,
                        const std::filesystem::path& merges_file);
  void check_merges(const std::vector<Merge>& merges, const std::filesystem::path& path,
                    const std::filesystem::path& encoder_file) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, bpe::PieceCache& cache,
                    std::vector<int32_t>& parts, std::vector<int32_t>& ranks) const;

  std::string name_;
  int32_t num_tokens_ = 0;          // ids in encoder.json
  int32_t num_extra_specials_ = 0;  // configured specials appended after them
  std::string token_bytes_;         // bytes of token i: [token_offsets_[i], token_offsets_[i + 1])
  std::vector<uint32_t> token_offsets_;
  std::unordered_map<std::string_view, int32_t> token_ids_;  // mergeable tokens only
  int32_t byte_ids_[256] = {};
  bpe::MergeTable pairs_;  // rank == the id made, as in tiktoken
  std::vector<std::pair<int32_t, uint32_t>> merges_;  // (token made, left_bytes) in rank order
  // piece -> ids, kept across calls. Concurrent calls (forge prepare encodes on every core) each
  // take the first free slot from one their thread starts at, so every thread keeps a warm cache
  // of its own; a call finding none free uses its own.
  struct CacheSlot {
    std::mutex mutex;
    bpe::PieceCache cache;
  };
  static constexpr size_t kCacheSlots = 8;
  mutable std::array<CacheSlot, kCacheSlots> caches_;
};

}  // namespace forge
