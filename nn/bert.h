// BERT (Devlin et al. 2018) for pretraining with masked-LM and next-sentence-prediction heads, laid
// out as HF BertForPreTraining: token + learned position + segment embeddings and a LayerNorm,
// bidirectional encoder blocks over a key-padding mask (post-norm as in the paper, or pre-norm with
// a final LayerNorm), a tanh pooler on the first token, an MLM head whose decoder is tied to the
// token embedding, and a 2-way NSP classifier.
#pragma once

#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {

/// model.* of a bert recipe (the config schema owns parsing and range checks; check_config repeats
/// the structural ones so a model is never built inconsistent).
struct BertConfig {
  int64_t vocab_size = 260;
  int64_t max_positions = 512;  ///< longest sequence (learned positions 0 .. T-1)
  int64_t type_vocab_size = 2;  ///< segment ids (sentence A / B)
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t d_ff = 512;
  /// BERT's hidden_dropout_prob: after the embedding LayerNorm, on the attention output projection
  /// and on the feed-forward output. (BERT's separate dropout on attention probabilities is not
  /// applied: the fused attention kernel never materialises them.)
  double dropout = 0.1;
  /// false: the paper's post-norm blocks, x = LN(x + drop(attn(x))), x = LN(x + drop(ff(x))).
  /// true: pre-norm blocks x + drop(attn(LN(x))), x + drop(ff(LN(x))), then a final LayerNorm.
  bool pre_norm = false;
  double norm_eps = 1e-12;
  double init_std = 0.02;  ///< every Linear and Embedding weight ~ N(0, init_std); biases 0, LN 1/0
  /// >= 0: that token's embedding row starts at zero and its lookups pass no gradient (HF's
  /// padding_idx = pad_token_id); -1: no such row (the original TF BERT).
  int64_t pad_id = -1;
};

/// Throws Error(usage) naming the first inconsistent field (sizes, divisibility, ranges).
void check_config(const BertConfig& config);
/// Parameter count of Bert(config) without building it (tied decoder counted once).
int64_t bert_num_parameters(const BertConfig& config);

/// Position-wise feed-forward, [..., C] -> [..., C]: "fc" C -> d_ff, exact (erf) GELU, "proj"
/// d_ff -> C, hidden dropout. fc and proj are replaceable by any UnaryModule (LoRA).
class BertFeedForward : public UnaryModule {
 public:
  BertFeedForward(const BertConfig& config, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const override;

  std::shared_ptr<UnaryModule> fc;    ///< a Linear as built
  std::shared_ptr<UnaryModule> proj;  ///< a Linear as built
  std::shared_ptr<Dropout> drop;
};

/// One encoder block: children "attn" (bidirectional SelfAttention with hidden dropout on its
/// output), "ln1" (normalises the attention sublayer: its output sum in post-norm, its input in
/// pre-norm), "ff", "ln2" (likewise for the feed-forward sublayer). ln1, ff and ln2 are
/// replaceable by any UnaryModule.
class BertBlock : public Module {
 public:
  BertBlock(const BertConfig& config, Generator& gen = default_generator());
  /// x [B, T, C], attention_mask [B, T] (nonzero = real token) or undefined -> [B, T, C].
  Tensor forward(const Tensor& x, const Tensor& attention_mask) const;

  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<UnaryModule> ln1;  ///< a LayerNorm as built
  std::shared_ptr<UnaryModule> ff;   ///< a BertFeedForward as built
  std::shared_ptr<UnaryModule> ln2;  ///< a LayerNorm as built

 private:
  bool pre_norm_;
};

/// The MLM prediction head: "dense" C -> C, exact GELU, "ln", then a decoder whose weight is the
/// token embedding (passed in, so it stays tied) plus this head's own output "bias" [V]. dense and
/// ln are replaceable by any UnaryModule.
class BertMLMHead : public Module {
 public:
  BertMLMHead(const BertConfig& config, Generator& gen = default_generator());
  /// hidden_rows [..., C], decoder_weight [V, C] -> logits [..., V].
  Tensor forward(const Tensor& hidden_rows, const Tensor& decoder_weight) const;

  std::shared_ptr<UnaryModule> dense;  ///< a Linear as built
  std::shared_ptr<UnaryModule> ln;     ///< a LayerNorm as built
  Tensor bias;
};

/// What Bert::forward returns.
struct BertOutputs {
  Tensor hidden;  ///< [B, T, C]: the last block's output (after ln_f with pre-norm)
  Tensor pooled;  ///< [B, C]: tanh(pooler(hidden[:, 0])), the [CLS] summary NSP reads
};

/// Parameter names, in order (HF BertForPreTraining's name in brackets):
///   tok_emb.weight [word_embeddings], pos_emb.weight [position_embeddings],
///   seg_emb.weight [token_type_embeddings], emb_ln.{weight, bias} [embeddings.LayerNorm],
///   blocks.<i>.attn.qkv.{weight, bias} [query, key, value stacked: rows q | k | v],
///   blocks.<i>.attn.proj.{weight, bias} [attention.output.dense],
///   blocks.<i>.ln1.{weight, bias} [attention.output.LayerNorm],
///   blocks.<i>.ff.fc.{weight, bias} [intermediate.dense], blocks.<i>.ff.proj.{weight, bias}
///   [output.dense], blocks.<i>.ln2.{weight, bias} [output.LayerNorm],
///   ln_f.{weight, bias} (pre-norm only), pooler.{weight, bias} [pooler.dense],
///   mlm.dense.{weight, bias} [cls.predictions.transform.dense],
///   mlm.ln.{weight, bias} [cls.predictions.transform.LayerNorm], mlm.bias [cls.predictions.bias],
///   nsp.{weight, bias} [cls.seq_relationship].
/// The MLM decoder weight is tok_emb.weight (tied, counted once).
class Bert : public Module {
 public:
  /// Builds and initialises (N(0, init_std) weights, zero biases, unit LayerNorms), drawing from
  /// `gen` in parameter order: the same generator state gives the same weights.
  Bert(const BertConfig& config, Generator& gen);

  /// ids and segments [B, T] i64 with T <= max_positions (segments undefined = all 0);
  /// attention_mask [B, T] of any dtype, nonzero = real token (undefined = all real). Padded
  /// positions are never attended to, so real positions do not depend on them.
  BertOutputs forward(const Tensor& ids, const Tensor& segments,
                      const Tensor& attention_mask) const;
  /// MLM logits [..., V] for hidden rows [..., C]. Callers gather the masked positions first
  /// (index_select on the [B*T, C] view of hidden), so the V-wide decoder runs only on those.
  Tensor mlm_logits(const Tensor& hidden_rows) const;
  /// NSP logits [B, 2] (0 = B follows A, 1 = random, as BERT) from pooled [B, C].
  Tensor nsp_logits(const Tensor& pooled) const;

  /// Recompute each block's activations in backward instead of storing them.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  const BertConfig& config() const { return config_; }

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<Embedding> pos_emb;
  std::shared_ptr<Embedding> seg_emb;
  std::shared_ptr<LayerNorm> emb_ln;
  std::shared_ptr<Dropout> emb_drop;
  std::shared_ptr<ModuleList<BertBlock>> blocks;
  std::shared_ptr<LayerNorm> ln_f;  ///< null in post-norm
  std::shared_ptr<UnaryModule> pooler;  ///< a Linear as built; replaceable (LoRA)
  std::shared_ptr<BertMLMHead> mlm;
  std::shared_ptr<UnaryModule> nsp;     ///< a Linear as built; replaceable (LoRA)

 private:
  BertConfig config_;
  bool checkpointing_ = false;
};

}  // namespace forge::nn
