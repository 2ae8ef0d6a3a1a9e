// Every differentiable op Forge has. A node can only be recorded with an entry of this list, and
// tests/core/test_gradcheck_coverage.cpp fails for any entry without a finite-difference gradient
// check, so a new op cannot land without one.
#pragma once

#define FORGE_DIFFERENTIABLE_OPS(X)                                                              \
  /* elementwise binary with broadcasting */                                                     \
  X(add) X(sub) X(mul) X(div) X(pow) X(minimum) X(maximum)                                       \
  /* scalar and unary */                                                                         \
  X(add_scalar) X(mul_scalar) X(pow_scalar) X(neg) X(exp) X(log) X(sqrt) X(rsqrt) X(abs)         \
  X(tanh) X(sigmoid) X(relu) X(gelu) X(gelu_tanh) X(silu) X(log_sigmoid) X(softplus) X(clamp)    \
  X(normal_cdf) X(where) X(masked_fill) X(dropout) X(cast)                                      \
  /* reductions */                                                                               \
  X(sum) X(mean) X(max) X(min) X(var)                                                            \
  /* layout */                                                                                   \
  X(reshape) X(permute) X(slice) X(expand) X(contiguous) X(cat) X(index_select) X(gather)        \
  X(index_add)                                                                                   \
  /* linear algebra and fused layers */                                                          \
  X(matmul) X(linear) X(softmax) X(log_softmax) X(layer_norm) X(rms_norm) X(embedding)           \
  X(cross_entropy) X(kd_kl_div) X(attention) X(rotary_embedding) X(cosine_similarity)           \
  X(topk_load) X(grouped_linear)                                                                 \
  /* engine */                                                                                   \
  X(checkpoint)

/// Ops that record nodes but are verified elsewhere: accumulate_grad is the engine's leaf sink,
/// custom is a user-defined backward (tested by the gradient checker's own self-test).
#define FORGE_ENGINE_NODES(X) X(accumulate_grad) X(custom)
