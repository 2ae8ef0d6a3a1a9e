// The 2-layer GPT that nn tests and the PyTorch goldens share (tests/golden/make_gpt_goldens.py):
// GPT-2 flavour by default, LLaMA flavour (RMSNorm, rotary, SwiGLU, no biases) on request, and the
// hub's Llama/Qwen2 layout (grouped-query attention, q/k/v apart with biases, llama3 rotary
// scaling, untied head).
#pragma once

#include "nn/gpt.h"

namespace forge::testing {

inline nn::GPTConfig tiny_gpt_config(bool llama = false) {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  if (llama) {
    c.bias = false;
    c.norm = nn::NormType::rmsnorm;
    c.position = nn::PositionType::rotary;
    c.mlp = nn::MLPType::swiglu;
  }
  return c;
}

/// The script's "llama_gqa" variant.
inline nn::GPTConfig tiny_llama_gqa_config() {
  nn::GPTConfig c = tiny_gpt_config(true);
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 6;
  c.fused_qkv = false;
  c.qkv_bias = true;
  c.ffn_hidden = 40;
  c.tie_embeddings = false;
  c.rope_scaling = {.type = nn::RopeScalingType::llama3, .factor = 4, .low_freq_factor = 1,
                    .high_freq_factor = 4, .original_context = 16};
  return c;
}

}  // namespace forge::testing
