// The GPT family: a decoder-only transformer of pre-norm blocks, configured as GPT-2 (LayerNorm,
// learned positions, GELU-tanh MLP, biases, tied LM head) or as the Llama family (Llama, Mistral,
// Qwen2: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases or q/k/v biases
// only) from one plain config struct. Also incremental decoding with a KV cache for generation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/named_tensor.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/moe.h"

namespace forge::nn {

enum class NormType { layernorm, rmsnorm };
enum class PositionType { learned, rotary };
enum class MLPType { gelu, swiglu };

/// model.* of a gpt recipe (the config schema owns parsing and range checks; check_config repeats
/// the structural ones so a model is never built inconsistent).
struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t context = 64;        ///< longest sequence; learned positions and KV caches have this size
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;      ///< key/value heads (grouped-query attention); 0 = n_heads
  int64_t head_dim = 0;        ///< 0 = d_model / n_heads
  double dropout = 0.0;        ///< after embeddings and on each residual branch
  bool bias = true;            ///< biases in Linear layers and LayerNorm
  bool qkv_bias = false;       ///< q/k/v biases even without `bias` (Qwen2)
  bool fused_qkv = true;       ///< attention projects q, k, v with one matrix; false: three
  NormType norm = NormType::layernorm;
  PositionType position = PositionType::learned;
  MLPType mlp = MLPType::gelu;
  double ffn_mult = 4;         ///< MLP hidden size is round(ffn_mult * d_model) (mlp_hidden_size)
  int64_t ffn_hidden = 0;      ///< the MLP hidden size itself, overriding ffn_mult; 0 = unset
  bool tie_embeddings = true;  ///< LM head reuses tok_emb.weight
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double norm_eps = 1e-5;
  MoEConfig moe;               ///< moe.every > 0: some blocks hold an MoE feed-forward (nn/moe.h)
};

/// Throws Error(usage) naming the first inconsistent field (sizes, divisibility, odd rotary dim).
void check_config(const GPTConfig& config);
/// ffn_hidden when set. Else GELU: ffn_mult * d_model, rounded to the nearest integer (as BERT's
/// d_ff); SwiGLU (LLaMA convention, so parameters match the GELU MLP): 2/3 of that, truncated,
/// rounded up to a multiple of 8 — e.g. d_model 768 -> 2048, 16 -> 48.
int64_t mlp_hidden_size(const GPTConfig& config);
/// Key/value heads and head dimension with their defaults resolved.
int64_t kv_heads(const GPTConfig& config);
int64_t head_dim(const GPTConfig& config);
/// A parameter of GPT(config), listed without building the model.
struct ParameterShape {
  std::string name;  ///< as named_parameters() names it, e.g. "blocks.0.attn.qkv.weight"
  Shape shape;
  bool expert = false;  ///< an MoE expert tensor: [n_experts, ...], top_k of them per token
  /// type_name() of each module on the name's path, the model first: {"GPT", "ModuleList<Block>",
  /// "Block", "SelfAttention", "Linear"} for the example.
  std::vector<std::string> modules;
};
/// Every parameter of GPT(config), in named_parameters() order (a test compares the two, and the
/// module types with the built model's), for `forge validate` estimates and config checks that
/// select parameters or modules by name (LoRA targets).
std::vector<ParameterShape> gpt_parameter_shapes(const GPTConfig& config);
/// Parameter count of GPT(config) without building it (for `forge validate` estimates).
int64_t gpt_num_parameters(const GPTConfig& config);
/// Parameters a token passes through: an MoE layer counts its router and top_k experts only.
int64_t gpt_active_parameters(const GPTConfig& config);
/// The shape of block `layer`'s MoE feed-forward (experts of width moe.ffn_mult * d_model).
MoELayerShape moe_layer_shape(const GPTConfig& config);

/// The tensors of a GPT of `config` (its state, or a LoRA run's adapters) with each fused
/// attn.qkv tensor as the attn.q, attn.k and attn.v ones the same model unfused holds: the rows
/// q | k | v (weight, bias, a LoRA's lora_B) apart, contiguous; a LoRA's lora_A, which the three
/// share, given to each, so each adds its part of the fused layer's update exactly. Other tensors
/// pass as they are. For writers of the hub's and llama.cpp's layouts, which keep q, k, v apart.
NamedTensors unfuse_qkv(const NamedTensors& tensors, const GPTConfig& config);

/// GPT-2 initialisation: Linear and Embedding weights ~ N(0, 0.02), residual projections
/// (attn.proj, mlp.proj) ~ N(0, 0.02 / sqrt(2 n_layers)) so the residual stream's variance does not
/// grow with depth; biases 0, norm weights 1.
constexpr double kGPTInitStd = 0.02;
double gpt_residual_init_std(const GPTConfig& config);

/// Position-wise feed-forward, [B, T, C] -> [B, T, C]. GELU: "fc" C -> hidden, gelu(tanh), "proj"
/// hidden -> C. SwiGLU: proj(silu(gate(x)) * up(x)) with "gate", "up" C -> hidden. GPT-2 init.
/// The Linear children are replaceable by any UnaryModule (LoRA).
class MLP : public UnaryModule {
 public:
  MLP(const GPTConfig& config, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const override;

  std::shared_ptr<UnaryModule> fc;    ///< GELU only
  std::shared_ptr<UnaryModule> gate;  ///< SwiGLU only
  std::shared_ptr<UnaryModule> up;    ///< SwiGLU only
  std::shared_ptr<UnaryModule> proj;
  std::shared_ptr<Dropout> drop;

 private:
  MLPType type_;
};

/// Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)). GPT-2 init. ln1, ln2 and mlp
/// are replaceable by any UnaryModule; block `layer` holds an MoE instead of the MLP when
/// is_moe_layer(config.moe, layer).
class Block : public Module {
 public:
  /// `tables`: the model's shared rotary tables (SelfAttention), or null to build its own.
  Block(const GPTConfig& config, Generator& gen = default_generator(), int64_t layer = 0,
        const RotaryTables* tables = nullptr);
  /// x [B, T, C] -> [B, T, C]; cache and layer as in SelfAttention::forward.
  Tensor forward(const Tensor& x, KVCache* cache = nullptr, size_t layer = 0) const;
  /// Packed rows: attention confined to each record (SelfAttention::forward).
  Tensor forward(const Tensor& x, const PackedRows& packed) const;

  std::shared_ptr<UnaryModule> ln1;  ///< LayerNorm or RMSNorm
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<UnaryModule> ln2;
  std::shared_ptr<UnaryModule> mlp;  ///< an MLP or MoE as built
  bool has_moe = false;
};

/// What GPT::forward returns.
enum class GPTOutput {
  logits,       ///< [B, T, V]
  last_logits,  ///< [B, 1, V]: the last position only (generation)
  hidden,       ///< [B, T, C]: after ln_f, before the LM head
};

/// Parameter names, in order: tok_emb.weight, pos_emb.weight (learned positions),
/// blocks.<i>.{ln1, attn.qkv | attn.q, attn.k, attn.v, attn.proj, ln2, mlp.fc | mlp.gate, mlp.up,
/// mlp.proj}.{weight, bias}, ln_f.{weight, bias}, lm_head.weight (untied only). Biases exist only
/// with config.bias (q/k/v also with qkv_bias).
class GPT : public Module {
 public:
  /// Builds and initialises as GPT-2 does (kGPTInitStd), drawing from `gen` in parameter order:
  /// the same generator state gives the same weights.
  GPT(const GPTConfig& config, Generator& gen);

  /// ids [B, T] i64 with T <= context -> see GPTOutput.
  Tensor forward(const Tensor& ids, GPTOutput what = GPTOutput::logits) const;
  /// Rows packed with several records: positions (learned or rotary) restart at each record and
  /// attention stays within it, so every record gets the outputs it gets alone.
  Tensor forward(const Tensor& ids, const PackedRows& packed,
                 GPTOutput what = GPTOutput::logits) const;
  /// Final hidden state [B, T, C] -> logits [B, T, V] through the (possibly tied) LM head.
  Tensor head(const Tensor& hidden) const;

  /// A cache for `batch` sequences of `capacity` slots (0: the context).
  KVCache make_cache(int64_t batch, int64_t capacity = 0) const;
  /// ids_new [B, t] continue the sequences in `cache` at slots length .. length+t-1 (the absolute
  /// positions, unless the cache is padded: then each row's own); returns their logits [B, t, V]
  /// (or as `what` says: last_logits suits a prompt's prefill) and advances cache.length. Runs
  /// without recording a graph.
  Tensor forward_incremental(const Tensor& ids_new, KVCache& cache,
                             GPTOutput what = GPTOutput::logits) const;

  /// Recompute each block's activations in backward instead of storing them. MoE blocks keep
  /// theirs: their balancing losses join the objective during the forward, which needs the graph.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  const GPTConfig& config() const { return config_; }

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<Embedding> pos_emb;  ///< null with rotary positions
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList<Block>> blocks;
  std::shared_ptr<UnaryModule> ln_f;
  std::shared_ptr<UnaryModule> lm_head;  ///< a Linear without bias as built; null when tied

 private:
  Tensor hidden_states(const Tensor& ids, KVCache* cache, const PackedRows* packed) const;
  Tensor output(const Tensor& hidden, GPTOutput what) const;

  GPTConfig config_;
  bool checkpointing_ = false;
};

}  // namespace forge::nn
