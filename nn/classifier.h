// Sequence classifiers on a pretrained backbone (docs/recipes/classify.md). The backbone's modules
// are registered under their own names (tok_emb, blocks.<i>, ln_f, ...), so a language model's
// checkpoint loads into the classifier by name; the LM head (GPT) or the MLM and NSP heads (BERT)
// are left out, and the new layers sit under "head.". Parameter order is the backbone's, then the
// head's, which is what discriminative learning rates and gradual unfreezing key on
// (optim/groups.h: the head is above the blocks, so it trains first and at the full rate).
#pragma once

#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/bert.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {

/// ULMFiT's concat pooling (Howard & Ruder 2018, section 3.3): [h_last, max_t h_t, mean_t h_t]
/// over the real tokens of each row. hidden [B, L, C], mask [B, L] of any dtype, nonzero on real
/// tokens, which come first in a row (right padding) and number at least one -> [B, 3C]. Padding
/// takes no part in any of the three. Throws Error(usage) for a row without real tokens or with
/// padding before a real token.
Tensor concat_pool(const Tensor& hidden, const Tensor& mask);

/// The sizes of a classification head.
struct ClassifierHeadConfig {
  int64_t num_labels = 2;
  int64_t hidden = 50;   ///< GPT head: width of its hidden layer (ULMFiT's 50)
  double dropout = 0.1;  ///< before the head's last Linear
};

/// Throws Error(usage) naming a size out of range (fewer than 2 labels, hidden < 1, dropout
/// outside [0, 1)).
void check_config(const ClassifierHeadConfig& config);

/// What the classify recipe trains, whatever the backbone: texts in, one logit per label out.
class SequenceClassifier : public Module {
 public:
  /// ids, mask [B, L] i64 (mask 1 on real tokens, which come first) -> logits [B, num_labels].
  virtual Tensor forward(const Tensor& ids, const Tensor& mask) const = 0;
  virtual void set_activation_checkpointing(bool on) = 0;
};

/// A GPT with concat pooling and Linear(3C, hidden) -> ReLU -> dropout -> Linear(hidden,
/// num_labels) ("head.fc", "head.out"; PyTorch's default Linear init). A text longer than the
/// context is cut into consecutive windows of `context` tokens that run side by side as rows of one
/// batch (positions restart at 0 in each) and are pooled together: ULMFiT's BPT3C for a model with
/// a fixed context, without the state an LSTM carries between windows.
class GPTClassifier : public SequenceClassifier {
 public:
  /// Draws the backbone's init from `gen` exactly as GPT(config, gen) does, then the head's.
  GPTClassifier(const GPTConfig& config, const ClassifierHeadConfig& head, Generator& gen);

  /// ids, mask [B, L] i64 (any L >= 1; mask 1 on real tokens, which come first) -> logits
  /// [B, num_labels].
  Tensor forward(const Tensor& ids, const Tensor& mask) const override;
  /// The pooled features [B, 3C] the head reads.
  Tensor features(const Tensor& ids, const Tensor& mask) const;
  /// The head alone: features [B, 3C] -> logits [B, num_labels].
  Tensor head_logits(const Tensor& features) const;

  const GPT& backbone() const { return *gpt_; }
  const ClassifierHeadConfig& head_config() const { return head_; }
  void set_activation_checkpointing(bool on) override { gpt_->set_activation_checkpointing(on); }

  std::shared_ptr<Linear> fc;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Linear> out;

 private:
  std::shared_ptr<GPT> gpt_;
  ClassifierHeadConfig head_;
};

/// Parameters of GPT(config) that the backbone of a GPTClassifier or GPTRewardModel keeps: all but
/// an untied LM head. Counted without building the model (forge validate's estimates).
int64_t gpt_backbone_parameters(const GPTConfig& config);

/// The hidden state of each row's last real token: hidden [B, L, C], mask [B, L] as concat_pool
/// takes it (real tokens first, at least one) -> [B, C]. Same errors as concat_pool.
Tensor last_token(const Tensor& hidden, const Tensor& mask);

/// A reward model (InstructGPT; TRL's RewardTrainer on AutoModelForSequenceClassification): a GPT
/// whose last real token's hidden state goes through "head.score", a Linear(C, 1) without bias
/// (PyTorch's default init), to one scalar per text. Texts fit the context: a reward is read off
/// one window, and a longer text is an error rather than silently cut.
class GPTRewardModel : public SequenceClassifier {
 public:
  /// Draws the backbone's init from `gen` exactly as GPT(config, gen) does, then the head's.
  GPTRewardModel(const GPTConfig& config, Generator& gen);

  /// ids, mask [B, L] i64 (L <= context; mask 1 on real tokens, which come first) -> [B, 1].
  Tensor forward(const Tensor& ids, const Tensor& mask) const override;
  /// forward as [B].
  Tensor rewards(const Tensor& ids, const Tensor& mask) const;
  /// The head at every position: ids [B, L] -> [B, L], position t scoring tokens 0..t (a PPO
  /// value model; right padding leaves the real positions alone, as attention is causal).
  Tensor values(const Tensor& ids) const;

  const GPT& backbone() const { return *gpt_; }
  void set_activation_checkpointing(bool on) override { gpt_->set_activation_checkpointing(on); }

  std::shared_ptr<Linear> score;

 private:
  std::shared_ptr<GPT> gpt_;
};

/// BERT's sequence classifier (as Hugging Face's BertForSequenceClassification): the tanh pooler
/// on [CLS], dropout, Linear(C, num_labels) ("head.out", N(0, init_std) as BERT's other layers).
/// Texts are at most max_positions tokens, [CLS] first.
class BertClassifier : public SequenceClassifier {
 public:
  /// Draws the backbone's init from `gen` exactly as Bert(config, gen) does, then the head's.
  BertClassifier(const BertConfig& config, const ClassifierHeadConfig& head, Generator& gen);

  /// ids, mask [B, L] i64 (mask 1 on real tokens; padded positions are never attended to) ->
  /// logits [B, num_labels].
  Tensor forward(const Tensor& ids, const Tensor& mask) const override;

  const Bert& backbone() const { return *bert_; }
  const ClassifierHeadConfig& head_config() const { return head_; }
  void set_activation_checkpointing(bool on) override { bert_->set_activation_checkpointing(on); }

  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Linear> out;

 private:
  std::shared_ptr<Bert> bert_;
  ClassifierHeadConfig head_;
};

}  // namespace forge::nn
