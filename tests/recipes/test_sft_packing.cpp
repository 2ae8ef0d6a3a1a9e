// Packed SFT batches against records alone: with attention confined to each record and positions
// restarting, every record of a packed batch gets the loss and the parameter gradients it gets in
// a batch of its own, for GPT-2 (learned positions) and the Llama options (rotary, grouped-query
// attention, q/k/v apart), with and without activation checkpointing.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/ops.h"
#include "data/lm_data.h"
#include "data/packing.h"
#include "data/sft.h"
#include "recipes/finetune.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"

namespace forge {
namespace {

// 14 records of 3 to 12 tokens (ids < 11) whose prompts are 1 to 3 tokens.
std::shared_ptr<const SFTDataset> records() {
  auto d = std::make_shared<SFTDataset>();
  Generator gen(17);
  Tensor u = uniform({14, 13}, 0, 1, gen);
  for (int64_t i = 0; i < 14; ++i) {
    const auto len = size_t(3 + int64_t(u.at({i, 0}) * 10));
    std::vector<int32_t>& row = d->tokens.emplace_back();
    for (size_t j = 0; j < len; ++j) row.push_back(int32_t(u.at({i, int64_t(j) + 1}) * 11));
    d->prompt_len.push_back(1 + i % 3);
  }
  return d;
}

std::vector<std::vector<double>> gradients(const nn::GPT& model) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, p] : model.named_parameters())
    out.push_back(p.grad().defined() ? p.grad().to_vector<double>()
                                     : std::vector<double>(size_t(p.numel()), 0.0));
  return out;
}

// |got - want| <= 1e-5 * max(max |want|, 1) elementwise.
void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << " at " << i;
}

void expect_records_as_alone(nn::GPTConfig config, bool checkpointing) {
  config.context = 24;
  Generator gen(3);
  nn::GPT model(config, gen);
  model.set_activation_checkpointing(checkpointing);
  auto data = records();
  PackedSFTLoader loader(data, 3, config.context, 5);
  const SFTBatch packed = loader.next();
  ASSERT_GT(packed.indices.size(), size_t(packed.ids.size(0))) << "rows hold several records";
  const std::vector<int64_t> segments = packed.segments.to_vector<int64_t>();
  const std::vector<int64_t> targets = packed.targets.to_vector<int64_t>();
  const std::vector<int64_t> real = packed.mask.to_vector<int64_t>();
  const int64_t R = packed.ids.size(0), W = packed.ids.size(1);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  ce.ignore_index = LMWindows::kIgnoreTarget;
  size_t next = 0;  // packed.indices lists the records row by row
  for (int64_t r = 0; r < R; ++r)
    for (int64_t id = 0; next < packed.indices.size(); ++id) {
      // This record's targets alone; every other position ignored.
      std::vector<double> mine(size_t(R * W), double(LMWindows::kIgnoreTarget));
      bool found = false;
      for (size_t j = size_t(r * W); j < size_t((r + 1) * W); ++j)
        if (segments[j] == id) {
          found = found || real[j] == 1;
          mine[j] = double(targets[j]);
        }
      if (!found) break;  // the row's padding
      const int64_t record = packed.indices[next++];
      SCOPED_TRACE("record " + std::to_string(record) + " in row " + std::to_string(r));
      model.zero_grad();
      Tensor logits = model.forward(packed.ids, nn::PackedRows{packed.positions, packed.segments});
      Tensor loss = cross_entropy(reshape(logits, {-1, config.vocab_size}),
                                  from_vector(mine, {R * W}, DType::i64), ce);
      loss.backward();
      const double packed_loss = loss.item();
      const auto packed_grads = gradients(model);

      model.zero_grad();
      MicroBatchLoss alone = sft_loss(model, SFTLoader::make_batch(*data, {record}));
      alone.loss_sum.backward();
      EXPECT_NEAR(packed_loss, alone.loss_sum.item(), 1e-5 * std::fabs(alone.loss_sum.item()));
      const auto alone_grads = gradients(model);
      size_t i = 0;
      for (const auto& [name, p] : model.named_parameters())
        expect_close(packed_grads[i], alone_grads[i], name), ++i;
    }
  EXPECT_EQ(next, packed.indices.size());
}

TEST(SFTPacking, GPTRecordsGetTheirOwnLossAndGradients) {
  expect_records_as_alone(testing::tiny_gpt_config(), false);
}

TEST(SFTPacking, LlamaRecordsGetTheirOwnLossAndGradients) {
  expect_records_as_alone(testing::tiny_llama_gqa_config(), false);
  expect_records_as_alone(testing::tiny_llama_gqa_config(), true);
}

}  // namespace
}  // namespace forge
