// `forge export --format gguf`: a GPT-2-style model as a GGUF file that llama.cpp runs with its
// gpt2 architecture (its tensor names and metadata keys, every tensor f32), with the run's
// vocabulary as a GPT-2 BPE (the bytes tokenizer as one without merges). docs/interop.md describes
// the file and the name mapping.
#pragma once

#include <filesystem>

namespace forge {

/// Writes the GPT of `checkpoint_file` (a LoRA run's adapters merged first) to `output` as GGUF
/// version 3, atomically and durably. Error(usage) naming what llama.cpp's gpt2 graph lacks for
/// another model (rmsnorm, rotary positions, swiglu, no biases, a BERT).
void export_gguf(const std::filesystem::path& checkpoint_file, const std::filesystem::path& output);

}  // namespace forge
