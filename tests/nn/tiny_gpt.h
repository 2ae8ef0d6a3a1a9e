// The 2-layer GPT that nn tests and the PyTorch goldens share (tests/golden/make_gpt_goldens.py):
// GPT-2 flavour by default, LLaMA flavour (RMSNorm, rotary, SwiGLU, no biases) on request.
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

}  // namespace forge::testing
