#include "nn/classifier.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

namespace {

// Registers the backbone's children under their own names, except `skip` (heads the classifier
// does not use), so that checkpoint names are the backbone's.
void adopt_children(Module& classifier, Module& backbone, const std::vector<std::string>& skip) {
  for (auto& [name, child] : backbone.named_children()) {
    bool skipped = false;
    for (const std::string& s : skip) skipped = skipped || name == s;
    if (!skipped) classifier.register_module(name, child);
  }
}

// The real-token count of each row of `mask` [B, L], checked to be a non-empty prefix.
std::vector<int64_t> prefix_lengths(const Tensor& mask) {
  FORGE_CHECK(mask.dim() == 2, "concat_pool: mask must be [B, L], got ", shape_str(mask.shape()));
  const int64_t B = mask.size(0), L = mask.size(1);
  const std::vector<double> m = mask.to(DType::f64).contiguous().to_vector<double>();
  std::vector<int64_t> lengths(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    while (n < L && m[size_t(b * L + n)] != 0) ++n;
    for (int64_t t = n; t < L; ++t)
      if (m[size_t(b * L + t)] != 0)
        throw Error(ExitCode::usage, detail::concat("concat_pool: row ", b, " has padding at ", n,
                                                    " before a real token at ", t));
    if (n == 0) throw Error(ExitCode::usage, detail::concat("concat_pool: row ", b, " is empty"));
    lengths[size_t(b)] = n;
  }
  return lengths;
}

// t [B, L] i64 with zero columns appended up to `width`.
Tensor pad_columns(const Tensor& t, int64_t width) {
  const int64_t B = t.size(0), L = t.size(1);
  const std::vector<int64_t> v = t.contiguous().to_vector<int64_t>();
  std::vector<double> out(size_t(B * width), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j) out[size_t(b * width + j)] = double(v[size_t(b * L + j)]);
  return from_vector(out, {B, width}, DType::i64);
}

void check_inputs(const Tensor& ids, const Tensor& mask, const char* who) {
  FORGE_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64 && ids.size(1) > 0, who,
              ": ids must be a non-empty [B, L] i64 tensor, got ", shape_str(ids.shape()));
  FORGE_CHECK(mask.shape() == ids.shape(), who, ": mask ", shape_str(mask.shape()),
              " must have the shape of ids ", shape_str(ids.shape()));
}

}  // namespace

Tensor concat_pool(const Tensor& hidden, const Tensor& mask) {
  FORGE_CHECK(hidden.dim() == 3, "concat_pool: hidden must be [B, L, C], got ",
              shape_str(hidden.shape()));
  FORGE_CHECK(mask.dim() == 2 && mask.size(0) == hidden.size(0) && mask.size(1) == hidden.size(1),
              "concat_pool: mask ", shape_str(mask.shape()), " does not match hidden ",
              shape_str(hidden.shape()));
  const int64_t B = hidden.size(0), L = hidden.size(1), C = hidden.size(2);
  const std::vector<int64_t> lengths = prefix_lengths(mask);
  std::vector<double> keep(size_t(B * L), 0.0), pad(size_t(B * L), 1.0), count(size_t(B), 0.0);
  std::vector<double> last(size_t(B), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lengths[size_t(b)];
    for (int64_t t = 0; t < n; ++t) {
      keep[size_t(b * L + t)] = 1.0;
      pad[size_t(b * L + t)] = 0.0;
    }
    count[size_t(b)] = double(n);
    last[size_t(b)] = double(b * L + n - 1);
  }
  const Tensor h = hidden.contiguous();
  const DType dt = h.dtype();
  Tensor h_last = index_select(reshape(h, {B * L, C}), 0, from_vector(last, {B}, DType::i64));
  Tensor h_max = max(
      masked_fill(h, from_vector(pad, {B, L, 1}, dt), -std::numeric_limits<double>::infinity()), 1);
  Tensor h_mean =
      div(sum(mul(h, from_vector(keep, {B, L, 1}, dt)), {1}), from_vector(count, {B, 1}, dt));
  return cat({h_last, h_max, h_mean}, -1);
}

Tensor last_token(const Tensor& hidden, const Tensor& mask) {
  FORGE_CHECK(hidden.dim() == 3, "last_token: hidden must be [B, L, C], got ",
              shape_str(hidden.shape()));
  FORGE_CHECK(mask.dim() == 2 && mask.size(0) == hidden.size(0) && mask.size(1) == hidden.size(1),
              "last_token: mask ", shape_str(mask.shape()), " does not match hidden ",
              shape_str(hidden.shape()));
  const int64_t B = hidden.size(0), L = hidden.size(1), C = hidden.size(2);
  const std::vector<int64_t> lengths = prefix_lengths(mask);
  std::vector<double> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) rows[size_t(b)] = double(b * L + lengths[size_t(b)] - 1);
  return index_select(reshape(hidden.contiguous(), {B * L, C}), 0,
                      from_vector(rows, {B}, DType::i64));
}

void check_config(const ClassifierHeadConfig& config) {
  if (config.num_labels < 2)
    throw Error(ExitCode::usage,
                detail::concat("classifier: need at least 2 labels, got ", config.num_labels));
  if (config.hidden < 1)
    throw Error(ExitCode::usage,
                detail::concat("classifier: head hidden size must be >= 1, got ", config.hidden));
  if (!(config.dropout >= 0.0 && config.dropout < 1.0))
    throw Error(ExitCode::usage,
                detail::concat("classifier: dropout must be in [0, 1), got ", config.dropout));
}

GPTClassifier::GPTClassifier(const GPTConfig& config, const ClassifierHeadConfig& head,
                             Generator& gen)
    : head_(head) {
  check_config(head);
  gpt_ = std::make_shared<GPT>(config, gen);
  adopt_children(*this, *gpt_, {"lm_head"});
  auto h = register_module("head", std::make_shared<Module>());
  fc = h->register_module("fc",
                          std::make_shared<Linear>(3 * config.d_model, head.hidden, true, gen));
  drop = h->register_module("drop", std::make_shared<Dropout>(head.dropout));
  out =
      h->register_module("out", std::make_shared<Linear>(head.hidden, head.num_labels, true, gen));
}

int64_t gpt_backbone_parameters(const GPTConfig& config) {
  int64_t n = 0;
  for (const ParameterShape& p : gpt_parameter_shapes(config))
    if (p.name.rfind("lm_head.", 0) != 0) n += shape_numel(p.shape);
  return n;
}

Tensor GPTClassifier::features(const Tensor& ids, const Tensor& mask) const {
  check_inputs(ids, mask, "GPTClassifier");
  const int64_t B = ids.size(0), L = ids.size(1), T = gpt_->config().context;
  if (L <= T) return concat_pool(gpt_->forward(ids, GPTOutput::hidden), mask);
  const int64_t windows = (L + T - 1) / T, width = windows * T;
  const Tensor rows = reshape(pad_columns(ids, width), {B * windows, T});
  // The windows of a row after its last real token hold padding only. They stay out of the
  // backbone's batch (a third of the windows of a batch of fortunes: docs/recipes/classify.md),
  // and their hidden states are zeros, which the pooling masks as it masks all padding.
  const std::vector<int64_t> lengths = prefix_lengths(mask);
  std::vector<double> used;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w * T < lengths[size_t(b)]; ++w) used.push_back(double(b * windows + w));
  Tensor hidden;
  if (int64_t(used.size()) == B * windows) {
    hidden = gpt_->forward(rows, GPTOutput::hidden);
  } else {
    const Tensor index = from_vector(used, {int64_t(used.size())}, DType::i64);
    const Tensor packed = gpt_->forward(index_select(rows, 0, index), GPTOutput::hidden);
    hidden = index_add(zeros({B * windows, T, packed.size(2)}, packed.dtype()), 0, index, packed);
  }
  return concat_pool(reshape(hidden, {B, width, hidden.size(2)}),
                     pad_columns(mask.to(DType::i64), width));
}

Tensor GPTClassifier::head_logits(const Tensor& features) const {
  return out->forward(drop->forward(relu(fc->forward(features))));
}

Tensor GPTClassifier::forward(const Tensor& ids, const Tensor& mask) const {
  return head_logits(features(ids, mask));
}

GPTRewardModel::GPTRewardModel(const GPTConfig& config, Generator& gen) {
  gpt_ = std::make_shared<GPT>(config, gen);
  adopt_children(*this, *gpt_, {"lm_head"});
  auto h = register_module("head", std::make_shared<Module>());
  score = h->register_module("score", std::make_shared<Linear>(config.d_model, 1, false, gen));
}

Tensor GPTRewardModel::forward(const Tensor& ids, const Tensor& mask) const {
  check_inputs(ids, mask, "GPTRewardModel");
  FORGE_CHECK(ids.size(1) <= gpt_->config().context, "GPTRewardModel: rows of ", ids.size(1),
              " tokens do not fit the context of ", gpt_->config().context);
  return score->forward(last_token(gpt_->forward(ids, GPTOutput::hidden), mask));
}

Tensor GPTRewardModel::rewards(const Tensor& ids, const Tensor& mask) const {
  return reshape(forward(ids, mask), {ids.size(0)});
}

Tensor GPTRewardModel::values(const Tensor& ids) const {
  FORGE_CHECK(ids.defined() && ids.dim() == 2, "GPTRewardModel::values: ids must be [B, L]");
  return reshape(score->forward(gpt_->forward(ids, GPTOutput::hidden)),
                 {ids.size(0), ids.size(1)});
}

BertClassifier::BertClassifier(const BertConfig& config, const ClassifierHeadConfig& head,
                               Generator& gen)
    : head_(head) {
  check_config(head);
  bert_ = std::make_shared<Bert>(config, gen);
  adopt_children(*this, *bert_, {"mlm", "nsp"});
  auto h = register_module("head", std::make_shared<Module>());
  drop = h->register_module("drop", std::make_shared<Dropout>(head.dropout));
  out = h->register_module(
      "out", std::make_shared<Linear>(config.d_model, head.num_labels, true, gen, config.init_std));
}

Tensor BertClassifier::forward(const Tensor& ids, const Tensor& mask) const {
  check_inputs(ids, mask, "BertClassifier");
  return out->forward(drop->forward(bert_->forward(ids, Tensor(), mask).pooled));
}

}  // namespace forge::nn
