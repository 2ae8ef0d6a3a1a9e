// `forge export --format gguf`: a GPT as a GGUF file that llama.cpp runs with its gpt2 architecture
// (GPT-2's layout), its llama architecture (Llama's: rmsnorm, rotary, swiglu, no biases; q and k
// rows permuted to its interleaved rotary pairs) or its qwen2 one (Llama's with q/k/v biases),
// every tensor f32, with the run's vocabulary as a GPT-2 BPE (the bytes tokenizer as one without
// merges). docs/interop.md describes the file and the name mapping.
#pragma once

#include <filesystem>
#include <string>

namespace forge {

/// Writes the GPT of `checkpoint_file` (a LoRA run's adapters merged first) to `output` as GGUF
/// version 3, atomically and durably, and returns the llama.cpp architecture written ("gpt2",
/// "llama" or "qwen2"). Error(usage) naming what those architectures lack for another model
/// (layernorm with rotary positions, biases beside rmsnorm, mixture-of-experts layers, a BERT).
std::string export_gguf(const std::filesystem::path& checkpoint_file,
                        const std::filesystem::path& output);

}  // namespace forge
