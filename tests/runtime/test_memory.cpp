// The memory estimate stays finite and positive at the largest sizes the schema allows and counts
// a Llama's activations to within 10% of what a step allocates, and a run whose estimate exceeds
// the machine's memory stops with exit 2 before building anything, unless told to go on.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "nn/gpt.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge::testing {
namespace {

constexpr const char* kLargest =
    "recipe: gpt_pretrain\n"
    "data: {train: tests/recipes/configs/tiny.txt}\n"
    "model: {vocab_size: 16777216, context: 1048576, d_model: 65536, n_layers: 1024,\n"
    "        n_heads: 1024, ffn_mult: 64, tie_embeddings: false, mlp: swiglu}\n"
    "train: {batch_size: 65536}\n";

TEST(MemoryEstimate, LargestAllowedSizesDoNotOverflow) {
  for (const char* recipe : {"gpt_pretrain", "bert_pretrain"}) {
    std::string text = kLargest;
    if (std::string(recipe) == "bert_pretrain")
      text = "recipe: bert_pretrain\n"
             "data: {train: tests/recipes/configs/tiny.txt,\n"
             "       special_tokens: [\"[PAD]\", \"[CLS]\", \"[SEP]\", \"[MASK]\"]}\n"
             "model: {arch: bert, vocab_size: 16777216, context: 1048576, d_model: 65536,\n"
             "        n_layers: 1024, n_heads: 1024, ffn_mult: 64}\n"
             "train: {batch_size: 65536}\n";
    const RunConfig c = load_config_string(text, "x.yaml");
    const MemoryEstimate e = find_recipe(recipe).estimate(c);
    // At least the blocks' square matrices: n_layers * 4 * d_model^2 = 2^44.
    EXPECT_GT(e.parameters, int64_t(1) << 44) << recipe;
    EXPECT_EQ(e.trainable_parameters, e.parameters) << recipe;
    // Weights, gradients and two AdamW moments: 16 bytes a parameter, exactly.
    EXPECT_EQ(e.state_bytes, 16.0 * double(e.parameters)) << recipe;
    EXPECT_GT(e.activation_bytes, 0) << recipe;
    EXPECT_GT(e.logits_bytes, 0) << recipe;
    EXPECT_TRUE(std::isfinite(total_bytes(e))) << recipe;
  }
}

// The allocator's peak over one forward and backward of a model, above what was live before: the
// activations and logits the estimate counts, plus the parameters' gradients.
double step_peak_bytes(const RunConfig& c) {
  Generator gen(7);
  nn::GPT model(gpt_config(c.model), gen);
  const int64_t B = c.train.batch_size, T = c.model.context;
  std::vector<double> ids(size_t(B * T)), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = double((i * 37) % 256);
    targets[i] = double((i * 37 + 37) % 256);
  }
  const Tensor target = from_vector(targets, {B * T}, DType::i64);
  allocator::reset_peak();
  const size_t before = allocator::stats().current_bytes;
  {
    const Tensor logits = model.forward(from_vector(ids, {B, T}, DType::i64));
    cross_entropy(reshape(logits, {B * T, logits.size(2)}), target).backward();
  }
  return double(allocator::stats().peak_bytes - before);
}

TEST(MemoryEstimate, ActivationsOfGroupedQueryAttentionAndAWideSwiGLUWithinTenPercent) {
  // Llama-3.2-1B's proportions: 4 query heads on 1 key/value head, heads twice as wide as
  // d_model / n_heads, a SwiGLU 4 d_model wide. Counted as 16 values per token and channel, as
  // GPT-2's are, its activations would be a third short.
  const RunConfig c = load_config_string(
      "recipe: gpt_pretrain\n"
      "data: {train: tests/recipes/configs/tiny.txt}\n"
      "model: {vocab_size: 256, context: 64, d_model: 64, n_layers: 6, n_heads: 4, n_kv_heads: 1,\n"
      "        head_dim: 32, ffn_hidden: 256, norm: rmsnorm, position: rotary, mlp: swiglu,\n"
      "        bias: false}\n"
      "train: {batch_size: 8}\n",
      "x.yaml");
  const MemoryEstimate e = find_recipe("gpt_pretrain").estimate(c);
  const double estimate = e.activation_bytes + e.logits_bytes + 4.0 * double(e.parameters);
  const double measured = step_peak_bytes(c);
  EXPECT_NEAR(estimate / measured, 1.0, 0.1)
      << "estimated " << estimate / 1048576.0 << " MiB, measured " << measured / 1048576.0;
}

TEST(MemoryCheck, AnEstimateBeyondTheLimitIsAConfigErrorNamingBoth) {
  MemoryEstimate e;
  e.state_bytes = 3.0 * 1048576;
  const MemoryLimit limit{2.0 * 1048576, "the cgroup limit /sys/fs/cgroup/memory.max"};
  expect_error(ExitCode::usage,
               "estimated peak training memory 3.0 MiB exceeds 2.0 MiB (the cgroup limit "
               "/sys/fs/cgroup/memory.max); shrink the model or batch, or pass "
               "--ignore-memory-check",
               [&] { check_memory(e, limit, false); });
  EXPECT_NO_THROW(check_memory(e, limit, true));
  EXPECT_NO_THROW(check_memory(e, MemoryLimit{4.0 * 1048576, "x"}, false));
  EXPECT_NO_THROW(check_memory(e, std::nullopt, false));
  const std::optional<MemoryLimit> machine = machine_memory();
  ASSERT_TRUE(machine);
  EXPECT_GT(machine->bytes, 0);
}

// Under train.shard_optimizer a rank holds AdamW's moments of 1/ranks of the trained parameters.
TEST(MemoryCheck, ShardedOptimizerStateIsDividedAmongTheRanks) {
  MemoryEstimate e;
  e.parameters = 1000;
  e.trainable_parameters = 600;
  e.state_bytes = 4.0 * 1000 + 12.0 * 600;
  e.activation_bytes = 5;
  EXPECT_EQ(sharded_optimizer_estimate(e, 1).state_bytes, e.state_bytes);
  const MemoryEstimate half = sharded_optimizer_estimate(e, 2);
  EXPECT_EQ(half.state_bytes, 4.0 * 1000 + 4.0 * 600 + 8.0 * 600 / 2);
  EXPECT_EQ(half.activation_bytes, 5);
  EXPECT_EQ(sharded_optimizer_estimate(e, 4).state_bytes, 4.0 * 1000 + 4.0 * 600 + 8.0 * 600 / 4);
}

// Under ulimit -v every allocation past the limit fails, however much the machine has free. The
// soft limit is lowered for the call and put back (the hard one stays, so it can be).
TEST(MemoryCheck, TheAddressSpaceLimitBoundsTheMachinesMemory) {
  const std::optional<MemoryLimit> free = machine_memory();
  ASSERT_TRUE(free);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  rlimit lowered = saved;
  lowered.rlim_cur = rlim_t(free->bytes / 2);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  const std::optional<MemoryLimit> limited = machine_memory();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  ASSERT_TRUE(limited);
  EXPECT_EQ(limited->bytes, double(lowered.rlim_cur));
  EXPECT_EQ(limited->source, "the address-space limit (ulimit -v)");
}

// A generation's key-value cache holds the key/value heads only: 1 of 8 heads a layer here, so a
// row of 1000 new tokens needs 2 x 8 floats a token, not 2 x d_model (64). Its lower bound must
// stay one, or a generation from a grouped-query model that fits would be refused.
TEST(MemoryCheck, AGenerationsCacheHoldsTheKeyValueHeadsOnly) {
  ModelConfig m;
  m.vocab_size = 256;
  m.d_model = 64;
  m.n_layers = 1;
  m.n_heads = 8;
  m.n_kv_heads = 1;
  const nn::SamplingOptions sampling{.max_new_tokens = 1000};
  const nn::BatchOptions batch{.num_samples = 1, .batch_size = 1};
  const std::vector<std::vector<int64_t>> prompts = {{1}};
  // 4 bytes x (2 x 8 x 1000 cached + 256 logits) = 65,024 bytes a row, and one completion.
  EXPECT_NO_THROW(check_generation_memory(m, prompts, sampling, batch,
                                          MemoryLimit{100000, "a limit"}, "generate"));
  expect_error(ExitCode::usage, "generate: --batch-size 1: the completions and a batch of 1 rows",
               [&] {
                 check_generation_memory(m, prompts, sampling, batch, MemoryLimit{60000, "x"},
                                         "generate");
               });
  m.n_kv_heads = 8;  // every head keeps its keys and values: 2 x 64 a token
  EXPECT_THROW(check_generation_memory(m, prompts, sampling, batch,
                                       MemoryLimit{100000, "a limit"}, "generate"),
               Error);
}

class MemoryRun : public RecipeTest {};

TEST_F(MemoryRun, TrainStopsBeforeBuildingAModelThatCannotFit) {
  const auto config = dir_ / "huge.yaml";
  write_file(config, "recipe: gpt_pretrain\ndata: {train: " + (dir_ / "corpus.txt").string() +
                         "}\nmodel: {d_model: 65536, n_layers: 1024}\n");
  const auto out = dir_ / "out.txt";
  // The address-space cap keeps a run that skipped the check from taking the machine's memory.
  const std::string train =
      "ulimit -v 8000000; timeout 60 " + std::string(FORGE_BINARY) + " train ";
  int status = std::system((train + config.string() + " >" + out.string() + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read_file(out).find("exceeds"), std::string::npos) << read_file(out);
  EXPECT_NE(read_file(out).find("--ignore-memory-check"), std::string::npos) << read_file(out);
  status = std::system(("ulimit -v 8000000; timeout 60 " + std::string(FORGE_BINARY) + " eval " +
                        config.string() + " >" + out.string() + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read_file(out).find("exceeds"), std::string::npos) << read_file(out);

  write_file(config, "recipe: gpt_pretrain\noutput_dir: " + (dir_ / "run").string() +
                         "\ndata: {train: " + (dir_ / "corpus.txt").string() +
                         "}\nmodel: {d_model: 16, n_layers: 1, n_heads: 2, context: 16}\n"
                         "train: {max_steps: 2, batch_size: 2}\n");
  status = std::system((train + "--ignore-memory-check " + config.string() + " >" + out.string() +
                        " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 0) << read_file(out);
}

}  // namespace
}  // namespace forge::testing
