// Byte-level BPE training (`forge tokenizer train`): learns merges on a corpus split by GPT-2's
// pre-tokenisation and writes GPT-2's two-file format (encoder.json + vocab.bpe), so the result
// loads with make_tokenizer(dir) like the shipped gpt2 vocabulary, and Hugging Face's
// tokenizer.json beside it. Deterministic: ties between equally frequent pairs go to the
// lexicographically smallest (left bytes, right bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace forge {

class BpeTokenizer;

/// Learns merges on `text` (special tokens in it are cut out first and never merged) until the
/// vocabulary holds vocab_size - specials.size() tokens (256 bytes + one per merge), or no pair is
/// left. Returns the merges in order as the raw bytes of (left, right).
/// Throws Error(usage) if vocab_size < 256 + specials.size() or a special is empty, one byte
/// long or repeated.
std::vector<std::pair<std::string, std::string>> learn_bpe_merges(
    std::string_view text, int32_t vocab_size,
    const std::vector<std::string>& specials = {"<|endoftext|>"});

/// `tokenizer` as Hugging Face's tokenizer.json, in the layout of GPT-2's: a BPE model over GPT-2's
/// byte alphabet whose merges are every merge encode() may apply (spelled_merge_pairs) with
/// ignore_merges, GPT-2's regex as the ByteLevel pre-tokenizer, the ByteLevel decoder, and the
/// special tokens as added tokens. Hugging Face's `tokenizers` gives it encode()'s ids.
/// Throws Error(data) for a special token that is not UTF-8 (JSON cannot hold it).
std::string bpe_tokenizer_json(const BpeTokenizer& tokenizer);

/// Trains on the concatenated words of `inputs` as learn_bpe_merges does and writes
/// out_dir/encoder.json (ids 0..255: the bytes in GPT-2's order, then one token per merge, then
/// `specials`), out_dir/vocab.bpe ("#version: 0.2", then "left right" per merge) and
/// out_dir/tokenizer.json (bpe_tokenizer_json), each atomically (temporary file + rename);
/// out_dir is created if needed.
/// Throws Error(data) naming the file for an unreadable input or unwritable output, and
/// Error(usage) for no inputs or the cases above.
void train_bpe(const std::vector<std::filesystem::path>& inputs, int32_t vocab_size,
               const std::filesystem::path& out_dir,
               const std::vector<std::string>& specials = {"<|endoftext|>"});

}  // namespace forge
