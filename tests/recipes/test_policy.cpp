// What finetune, dpo and ppo share through recipes/policy.h, checked per recipe: the memory
// estimate of `forge validate` for each one's case (full or LoRA, a reference copy or not, ppo's
// reward and value models and generation rows), the dpo: section read into its struct, forge eval
// of a dpo run and its --prompts KL, and a ppo config whose reward model is not a readable
// checkpoint refused by `forge validate` with exit 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "recipes/dpo.h"
#include "recipes/lm_objective.h"
#include "recipes/policy.h"
#include "runtime/registry.h"
#include "tests/recipes/recipe_test.h"
#include "tests/recipes/section_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// The policy of every case: a byte GPT of context 32, d_model 32, 2 layers with a tied head.
// Its parameters: embeddings 256*32 + 32*32, per block 2*64 (norms) + 32*96+96 + 32*32+32
// + 32*128+128 + 128*32+32 = 12704, the final norm 64.
constexpr int64_t kPolicy = 256 * 32 + 32 * 32 + 2 * 12704 + 64;
// LoRA rank 4 on qkv (32 -> 96) and both MLP layers (32 -> 128 -> 32) of each block.
constexpr int64_t kAdapters = 2 * 4 * ((32 + 96) + (32 + 128) + (128 + 32));
constexpr const char* kLoRA = "lora: {rank: 4, alpha: 8, targets: [\"*.attn.qkv\", \"*.mlp.*\"]}\n";
// ppo's reward model (below): context 32, d_model 48, one block, and its score head (48).
constexpr int64_t kReward =
    256 * 48 + 32 * 48 + (2 * 96 + 48 * 144 + 144 + 48 * 48 + 48 + 48 * 192 + 192 + 192 * 48 + 48) +
    96 + 48;

class PolicyMemory : public testing::RecipeTest {
 protected:
  // The estimate of `recipe` on the policy above with `extra` YAML; files are not read, except
  // ppo's reward model, which the estimate sizes from its stored config.
  MemoryEstimate estimate(const std::string& recipe, const std::string& extra,
                          const std::vector<std::string>& overrides = {}) {
    const RunConfig c = load_config_string(
        "recipe: " + recipe + "\noutput_dir: " + (dir_ / "run").string() +
            "\nmodel: {init_from: base, vocab_size: 256, context: 32, d_model: 32, n_layers: 2, "
            "n_heads: 2, dropout: 0.0}\n"
            "data: {tokenizer: bytes, train: data.jsonl}\n"
            "train: {batch_size: 4}\n" +
            extra,
        "x.yaml", overrides, ConfigFiles::skip);
    return find_recipe(recipe).estimate(c);
  }

  // A checkpoint holding only the stored config of a reward_model run with the model above.
  fs::path write_reward_model() {
    const RunConfig rm = load_config_string(
        "recipe: reward_model\nmodel: {init_from: base, vocab_size: 256, context: 32, "
        "d_model: 48, n_layers: 1, n_heads: 2}\ndata: {tokenizer: bytes, train: pairs.jsonl}\n",
        "rm.yaml", {}, ConfigFiles::skip);
    CheckpointData data;
    data.config_yaml = to_yaml(rm);
    save_checkpoint_file(dir_ / "rm.h5", data);
    return dir_ / "rm.h5";
  }

  // The logits kept for backward: `rows` rows of `length` positions over 256 tokens, and their
  // gradient, in f32.
  static double logits(int64_t rows, int64_t length) { return 2.0 * double(rows * length) * 256 * 4; }
  // Activations of 2 blocks without checkpointing: 17 values a token and channel each at GPT-2's
  // shape (estimate_memory).
  static double activations(int64_t rows, int64_t length) {
    return 2 * 17.0 * double(rows * length) * 32 * 4;
  }
};

TEST_F(PolicyMemory, FinetuneHoldsThePolicyAndTrainsAllOrItsAdapters) {
  const MemoryEstimate full = estimate("finetune", "");
  EXPECT_EQ(full.parameters, kPolicy);
  EXPECT_EQ(full.trainable_parameters, kPolicy);
  EXPECT_EQ(full.logits_bytes, logits(4, 32));
  EXPECT_EQ(full.activation_bytes, activations(4, 32));
  EXPECT_EQ(full.state_bytes, 16.0 * double(kPolicy));

  const MemoryEstimate lora = estimate("finetune", kLoRA);
  EXPECT_EQ(lora.parameters, kPolicy + kAdapters);
  EXPECT_EQ(lora.trainable_parameters, kAdapters);
  EXPECT_EQ(lora.state_bytes, 4.0 * double(kPolicy + kAdapters) + 12.0 * double(kAdapters));
  // train_also adds the base parameters it names to the trained ones.
  EXPECT_EQ(estimate("finetune", kLoRA, {"lora.train_also=[\"ln_f.*\"]"}).trainable_parameters,
            kAdapters + 64);
}

TEST_F(PolicyMemory, DPOHoldsAReferenceCopyUnlessPrecomputedOrLoRAAndBothRowsOfAPair) {
  const std::string dpo = "preference: {max_length: 24, max_prompt_length: 8}\n";
  const MemoryEstimate full = estimate("dpo", dpo);
  EXPECT_EQ(full.parameters, 2 * kPolicy);
  EXPECT_EQ(full.trainable_parameters, kPolicy);
  // Chosen and rejected rows of 4 pairs, each preference.max_length long.
  EXPECT_EQ(full.logits_bytes, logits(8, 24));
  EXPECT_EQ(full.activation_bytes, activations(8, 24));

  const MemoryEstimate precomputed = estimate("dpo", dpo, {"dpo.precompute_reference=true"});
  EXPECT_EQ(precomputed.parameters, kPolicy);
  EXPECT_EQ(precomputed.trainable_parameters, kPolicy);

  // A LoRA policy's reference is itself with its adapters off: no copy, precomputed or not.
  for (const char* precompute : {"false", "true"}) {
    const MemoryEstimate lora =
        estimate("dpo", dpo + kLoRA, {std::string("dpo.precompute_reference=") + precompute});
    EXPECT_EQ(lora.parameters, kPolicy + kAdapters) << precompute;
    EXPECT_EQ(lora.trainable_parameters, kAdapters) << precompute;
    EXPECT_EQ(lora.logits_bytes, logits(8, 24)) << precompute;
  }

  // ORPO and SimPO compare no reference: the policy alone.
  for (const char* loss : {"orpo", "simpo"}) {
    const MemoryEstimate free = estimate("dpo", dpo, {std::string("dpo.loss_type=") + loss});
    EXPECT_EQ(free.parameters, kPolicy) << loss;
    EXPECT_EQ(free.trainable_parameters, kPolicy) << loss;
    EXPECT_EQ(free.logits_bytes, logits(8, 24)) << loss;
  }
}

TEST_F(PolicyMemory, PPOHoldsTheRewardModelAndTrainsAValueModelOrHead) {
  const std::string ppo = "ppo: {reward_model: " + write_reward_model().string() +
                          ", rollout_batch: 8, max_new_tokens: 12, generation_batch_size: 8}\n";
  // Policy, its reference copy, the reward model and the value model initialised from it.
  const MemoryEstimate separate = estimate("ppo", ppo);
  EXPECT_EQ(separate.parameters, 2 * kPolicy + 2 * kReward);
  EXPECT_EQ(separate.trainable_parameters, kPolicy + kReward);
  // Generation decodes ppo.generation_batch_size rows when it exceeds train.batch_size.
  EXPECT_EQ(separate.logits_bytes, logits(8, 32));
  EXPECT_EQ(separate.activation_bytes, activations(8, 32));
  EXPECT_EQ(estimate("ppo", ppo, {"ppo.generation_batch_size=2"}).logits_bytes, logits(4, 32));

  // A shared value head is one weight a channel on the policy.
  const MemoryEstimate shared = estimate("ppo", ppo, {"ppo.value=shared"});
  EXPECT_EQ(shared.parameters, 2 * kPolicy + kReward + 32);
  EXPECT_EQ(shared.trainable_parameters, kPolicy + 32);

  const MemoryEstimate lora = estimate("ppo", ppo + kLoRA);
  EXPECT_EQ(lora.parameters, kPolicy + kAdapters + 2 * kReward);
  EXPECT_EQ(lora.trainable_parameters, kAdapters + kReward);
  const MemoryEstimate lora_shared = estimate("ppo", ppo + kLoRA, {"ppo.value=shared"});
  EXPECT_EQ(lora_shared.parameters, kPolicy + kAdapters + kReward + 32);
  EXPECT_EQ(lora_shared.trainable_parameters, kAdapters + 32);
}

TEST(DPOSection, HoldsEveryKeyOfTheSection) {
  const std::string yaml =
      "recipe: dpo\nmodel: {init_from: base}\ndata: {tokenizer: bytes, train: pairs.jsonl}\n";
  testing::expect_every_key_reaches_its_field<DPOSection>(
      dpo_section(), yaml, dpo_settings,
      {{{"dpo.beta=0.5"}, [](const DPOSection& s) { EXPECT_EQ(s.beta, 0.5); }},
       {{"dpo.loss_type=ipo"},
        [](const DPOSection& s) { EXPECT_EQ(s.loss_type, nn::DPOLossType::ipo); }},
       {{"dpo.loss_type=hinge"},
        [](const DPOSection& s) { EXPECT_EQ(s.loss_type, nn::DPOLossType::hinge); }},
       {{"dpo.loss_type=orpo"},
        [](const DPOSection& s) { EXPECT_EQ(s.loss_type, nn::DPOLossType::orpo); }},
       {{"dpo.loss_type=simpo"},
        [](const DPOSection& s) { EXPECT_EQ(s.loss_type, nn::DPOLossType::simpo); }},
       {{"dpo.simpo_gamma=1.5"}, [](const DPOSection& s) { EXPECT_EQ(s.simpo_gamma, 1.5); }},
       {{"dpo.label_smoothing=0.2"},
        [](const DPOSection& s) { EXPECT_EQ(s.label_smoothing, 0.2); }},
       {{"dpo.precompute_reference=true"},
        [](const DPOSection& s) { EXPECT_TRUE(s.precompute_reference); }},
       {{"dpo.eval_text=text.txt"},
        [](const DPOSection& s) { EXPECT_EQ(s.eval_text, "text.txt"); }},
       {{"dpo.eval_text_fraction=0.25"},
        [](const DPOSection& s) { EXPECT_EQ(s.eval_text_fraction, 0.25); }}});
  const DPOSection defaults =
      dpo_settings(load_config_string(yaml, "x.yaml", {}, ConfigFiles::skip));
  EXPECT_EQ(defaults.loss_type, nn::DPOLossType::sigmoid);
  EXPECT_FALSE(defaults.precompute_reference);
  EXPECT_EQ(defaults.simpo_gamma, 0.5);  // TRL's
}

class PolicyEval : public testing::RecipeTest {};

// forge eval of a dpo run: the recipe's metrics, the held-out text's loss as the run's final
// evaluation logged it (text_loss serves both), then --prompts' samples of policy and reference.
TEST_F(PolicyEval, DPOEvalRepeatsTheRunsLastTextLossAndAddsThePromptsMetrics) {
  train_tiny_base(40);
  ASSERT_FALSE(HasFatalFailure());
  write_word_pairs(dir_ / "pairs.jsonl", 24, 1);
  testing::write_file(dir_ / "dpo.yaml",
                      "recipe: dpo\nseed: 3\noutput_dir: " + (dir_ / "dpo").string() +
                          "\nmodel: {init_from: " + (dir_ / "base").string() +
                          "}\ndata: {train: " + (dir_ / "pairs.jsonl").string() +
                          ", val_fraction: 0.25}\npreference: {max_prompt_length: 16}\n"
                          "dpo: {eval_text: " + (dir_ / "corpus.txt").string() +
                          ", eval_text_fraction: 0.05}\n"
                          "train: {batch_size: 6, max_steps: 3, eval_every: 3, log_every: 1}\n");
  ASSERT_EQ(forge("train " + (dir_ / "dpo.yaml").string()), 0);
  const double text_loss = losses(dir_ / "dpo", "val", "text_loss").at(3);
  testing::write_file(dir_ / "prompts.txt", "ROMEO:\n");
  auto [code, out] = forge_output("eval " + (dir_ / "dpo").string() + " --prompts " +
                                  (dir_ / "prompts.txt").string() +
                                  " --num-samples 2 --max-new-tokens 4");
  ASSERT_EQ(code, 0) << out;
  const size_t own = out.find("val_text_loss " + g6(text_loss) + "\n");
  const size_t prompts = out.find("val_kl_per_token ");
  EXPECT_NE(own, std::string::npos) << out;
  EXPECT_NE(out.find("val_rewards_acc "), std::string::npos) << out;
  EXPECT_NE(prompts, std::string::npos) << out;
  EXPECT_LT(own, prompts) << out;
  EXPECT_NE(out.find("val_samples 2\n"), std::string::npos) << out;
}

// forge eval --prompts on a policy and a reference that differ (two initialisations), sampled at
// temperature 0.5 among the top 5 tokens: the KL is that of the distribution the samples came
// from (the policy's, tempered and cut, as the sampler sums it) to the reference at temperature
// 0.5, read here off the reference's full forwards. Temperature-1 log-probabilities of both models
// give another number. Greedy decoding has no such distribution and is refused.
TEST_F(PolicyEval, PromptsKLIsThatOfTheSamplingDistributionToTheTemperedReference) {
  const RunConfig config = load_config_string(
      "recipe: dpo\nmodel: {init_from: base, vocab_size: 256, context: 32, d_model: 32, "
      "n_layers: 2, n_heads: 2}\ndata: {tokenizer: bytes, train: pairs.jsonl}\n",
      "x.yaml", {}, ConfigFiles::skip);
  Generator policy_init(1), reference_init(2);
  nn::GPT policy(gpt_config(config.model), policy_init);
  auto copy = std::make_unique<nn::GPT>(gpt_config(config.model), reference_init);
  copy->eval();
  const nn::GPT& ref = *copy;
  const ReferencePolicy reference(policy, std::move(copy));
  testing::write_file(dir_ / "prompts.txt", "ROMEO:\nJULIET:\n");
  CommandOptions options;
  options.values = {{"prompts", (dir_ / "prompts.txt").string()},
                    {"temperature", "0.5"},
                    {"top-k", "5"},
                    {"num-samples", "3"},
                    {"max-new-tokens", "6"},
                    {"seed", "7"}};
  double kl = -1;
  for (const Metric& metric : evaluate_policy(config, policy, reference, options))
    if (metric.key == "kl_per_token") kl = metric.value.as_double();

  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("bytes", {});
  const std::vector<std::vector<int64_t>> prompts =
      encode_prompts({"ROMEO:", "JULIET:"}, *tokenizer);
  const nn::SamplingOptions sampling{
      .max_new_tokens = 6, .temperature = 0.5, .top_k = 5, .seed = 7};
  const nn::BatchOptions batch{.num_samples = 3};
  NoGradGuard no_grad;
  double sampled = 0, untempered = 0, tokens = 0;
  for (const nn::Completion& c : nn::generate_batch(policy, prompts, sampling, batch)) {
    std::vector<int64_t> row = prompts[size_t(c.prompt_index)];
    const int64_t P = int64_t(row.size());
    row.insert(row.end(), c.tokens.begin(), c.tokens.end());
    Tensor ids = empty({1, int64_t(row.size())}, DType::i64);
    std::copy(row.begin(), row.end(), ids.data<int64_t>());
    const Tensor logits = ref.forward(ids).contiguous();  // [1, T, V]
    const int64_t V = logits.size(2);
    const std::vector<double> at_t = log_softmax(mul(logits, 2.0), -1).to_vector<double>();
    const std::vector<double> at_1 = log_softmax(logits, -1).to_vector<double>();
    double ref_t = 0, ref_1 = 0;
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const size_t at = size_t((P - 1 + int64_t(i)) * V + c.tokens[i]);
      ref_t += at_t[at];
      ref_1 += at_1[at];
    }
    sampled += c.sampling_logprob - ref_t;
    untempered += c.logprob - ref_1;
    tokens += double(c.tokens.size());
  }
  EXPECT_NEAR(kl, sampled / tokens, 1e-5);
  EXPECT_GT(std::abs(kl - untempered / tokens), 0.1) << untempered / tokens;

  options.values["temperature"] = "0";
  testing::expect_error(ExitCode::usage, "--temperature 0", [&] {
    evaluate_policy(config, policy, reference, options);
  });
}

class PolicyValidate : public testing::RecipeTest {};

// The reward model is read for its size: a file that is not a readable checkpoint stops validate
// (and so train) with the checkpoint's exit code and one line naming it, as a missing one does.
TEST_F(PolicyValidate, APPOConfigWhoseRewardModelIsCorruptOrMissingExitsWith4NamingIt) {
  train_tiny_base(40);
  ASSERT_FALSE(HasFatalFailure());
  testing::write_file(dir_ / "prompts.jsonl", "{\"prompt\": \"ROMEO:\"}\n");
  const std::string base = testing::read_file(resolve_checkpoint(dir_ / "base"));
  testing::write_file(dir_ / "garbage.h5", "not a checkpoint\n");
  testing::write_file(dir_ / "truncated.h5", base.substr(0, base.size() / 2));
  for (const char* name : {"garbage.h5", "truncated.h5", "missing.h5"}) {
    const fs::path rm = dir_ / name;
    testing::write_file(dir_ / "ppo.yaml",
                        "recipe: ppo\noutput_dir: " + (dir_ / "ppo").string() +
                            "\nmodel: {init_from: " + (dir_ / "base").string() +
                            ", dropout: 0.0}\ndata: {train: " + (dir_ / "prompts.jsonl").string() +
                            "}\nppo: {reward_model: " + rm.string() + ", max_new_tokens: 12}\n");
    auto [code, out] = forge_output("validate " + (dir_ / "ppo.yaml").string());
    EXPECT_EQ(code, 4) << name << "\n" << out;
    EXPECT_NE(out.find(rm.string()), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

}  // namespace
}  // namespace forge
