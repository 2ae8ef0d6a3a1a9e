// Recipe ppo through the forge binary, from a tiny base GPT and a tiny reward model that prefers
// completions with "good" words (both trained in SetUp): a fixed-seed run with asserted metrics;
// the first rollout's KL is exactly 0 (the policy is its reference); the reference and the reward
// model never change (forge eval, which reloads both, reproduces the run's last val line); each
// step's first pass reproduces the rollout bitwise, even from a reward model trained with dropout;
// prompts that outgrow the reward or value model are refused at set-up; the evaluation KL is that
// of the sampling distribution; the rollout does not depend on the generation batch; a minibatch
// split into micro-batches gives the same updates; kill-and-resume is exact with the adaptive KL
// controller, in bf16 with bf16 frozen models too; a LoRA policy with a shared value head saves
// adapters and the head only; bad input exits with its code and one line; every ppo: key arrives in
// its PPOSection field.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "recipes/ppo.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class PPORecipe : public testing::RecipeTest {
 protected:
  void SetUp() override {
    RecipeTest::SetUp();
    train_tiny_base(40);
    if (HasFatalFailure()) return;
    write_word_pairs(dir_ / "pairs.jsonl", 48, 1);
    std::ofstream(dir_ / "rm.yaml")
        << "recipe: reward_model\nseed: 3\noutput_dir: " << (dir_ / "rm").string() << "\n"
        << "model: {init_from: " << (dir_ / "base").string() << "}\n"
        << "data: {train: " << (dir_ / "pairs.jsonl").string() << ", val_fraction: 0.25}\n"
        << "preference: {max_prompt_length: 16}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.0}\n"
        << "train: {batch_size: 8, max_steps: 12, log_every: 6}\n";
    ASSERT_EQ(forge("train " + (dir_ / "rm.yaml").string()), 0);
    write_prompts(dir_ / "prompts.jsonl", 40, 1);
    write_prompts(dir_ / "val_prompts.jsonl", 8, 2);
  }

  void write_prompts(const fs::path& file, int n, uint64_t seed) {
    std::ofstream out(file);
    for (const std::string& p : corpus_prompts(n, seed))
      out << nlohmann::json({{"prompt", p}}).dump() << "\n";
  }

  fs::path write_config(const std::string& name, const std::string& ppo = "",
                        const std::string& train =
                            "{batch_size: 4, max_steps: 6, eval_every: 3, eval_batches: 1, "
                            "save_every: 3, log_every: 1}",
                        const std::string& extra = "") {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: ppo\nseed: 3\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {init_from: " << (dir_ / "base").string() << ", dropout: 0.0}\n"
        << "data: {train: " << (dir_ / "prompts.jsonl").string()
        << ", val: " << (dir_ / "val_prompts.jsonl").string() << "}\n"
        << "ppo: {reward_model: " << (dir_ / "rm").string()
        << ", rollout_batch: 8, ppo_epochs: 2, max_new_tokens: 12, "
           "generation_batch_size: 8"
        << ppo << "}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.0}\n"
        << "train: " << train << "\n"
        << extra;
    return dir_ / (name + ".yaml");
  }

  const std::vector<std::string> keys_ = {"loss",      "score",      "kl",        "kl_coef",
                                          "approx_kl", "value_loss", "grad_norm", "entropy"};
};

// ppo_section_settings fills one field per key of the section: every key set away from its default arrives.
TEST(PPOSectionStruct, EveryKeyOfThePPOSectionArrivesInItsField) {
  const RunConfig c = load_config_string(
      "recipe: ppo\nmodel: {arch: gpt, vocab_size: 256, context: 64, init_from: base.h5}\n"
      "data: {tokenizer: bytes, train: p.jsonl, val: v.jsonl}\n"
      "train: {batch_size: 2}\n"
      "ppo: {reward_model: rm.h5, value: shared, rollout_batch: 6, ppo_epochs: 3, "
      "generation_batch_size: 5, max_new_tokens: 7, temperature: 0.7, top_k: 9, top_p: 0.9, "
      "stop_text: '%', missing_eos_penalty: 1.5, kl_coef: 0.2, adaptive_kl: true, target_kl: 2.0, "
      "kl_horizon: 300.0, gamma: 0.99, lam: 0.9, clip_range: 0.3, clip_range_value: 0.4, "
      "vf_coef: 0.5, entropy_coef: 0.01, whiten_rewards: true, eval_text: t.txt, "
      "eval_text_fraction: 0.2}\n",
      "ppo.yaml", {}, ConfigFiles::skip);
  EXPECT_EQ(ppo_section().keys.size(), 24u) << "a key was added: give it a field and a value here";
  // The YAML above, field by field.
  const PPOSection want = {
      .reward_model = "rm.h5", .value = PPOSection::Value::shared, .rollout_batch = 6,
      .ppo_epochs = 3, .generation_batch_size = 5, .max_new_tokens = 7, .temperature = 0.7,
      .top_k = 9, .top_p = 0.9, .stop_text = "%", .missing_eos_penalty = 1.5, .kl_coef = 0.2,
      .adaptive_kl = true, .target_kl = 2.0, .kl_horizon = 300.0, .gamma = 0.99, .lam = 0.9,
      .clip_range = 0.3, .clip_range_value = 0.4, .vf_coef = 0.5, .entropy_coef = 0.01,
      .whiten_rewards = true, .eval_text = "t.txt", .eval_text_fraction = 0.2};
  EXPECT_TRUE(ppo_section_settings(c) == want);
}

TEST_F(PPORecipe, LearnsFromTheRewardModelWhileItsFrozenModelsNeverChange) {
  ASSERT_EQ(forge("train " + write_config("ppo").string()), 0);
  const fs::path run = dir_ / "ppo";
  // Step 0: the policy is its reference, so their samples are the same draws: equal scores, a win
  // rate of one half, no KL; and the first rollout's KL is exactly 0.
  EXPECT_EQ(losses(run, "val", "score").at(0), losses(run, "val", "reference_score").at(0));
  EXPECT_EQ(losses(run, "val", "reward_win_rate").at(0), 0.5);
  EXPECT_NEAR(losses(run, "val", "kl").at(0), 0.0,
              1e-5);  // sampling's and a forward's sums
  EXPECT_EQ(losses(run, "train", "kl").at(1), 0.0);
  // The first pass starts from the rollout's own policy: ratio 1 before its first update.
  EXPECT_NEAR(losses(run, "train", "ratio").at(1), 1.0, 0.05);
  // From this fixed seed, at the first step only: later rollouts sample from an updated policy,
  // and a last-bit difference between builds (another compiler, the AVX2 kernels) can change a
  // sampled token there, so they are compared within one build (the tests below).
  EXPECT_NEAR(losses(run, "val", "score").at(0), 2.512, 3e-3);
  EXPECT_NEAR(losses(run, "train", "score").at(1), 0.7817, 3e-3);
  EXPECT_NEAR(losses(run, "train", "value_loss").at(1), 3.609, 0.04);
  EXPECT_NEAR(losses(run, "train", "policy_loss").at(1), -0.0389, 2e-3);
  EXPECT_GT(losses(run, "val", "kl").at(6), 0.0);

  // Checkpoints hold the policy and the value model; reference and reward model are referenced.
  const CheckpointInfo info = read_checkpoint_info(resolve_checkpoint(run));
  int value_tensors = 0;
  for (const TensorSpec& t : info.model) {
    EXPECT_EQ(t.name.rfind("reference.", 0), std::string::npos) << t.name;
    EXPECT_EQ(t.name.rfind("reward.", 0), std::string::npos) << t.name;
    value_tensors += t.name.rfind("value.", 0) == 0;
  }
  EXPECT_GT(value_tensors, 0);
  ASSERT_TRUE(info.references.count("reference"));
  ASSERT_TRUE(info.references.count("reward"));
  EXPECT_EQ(info.references.at("reward").path, resolve_checkpoint(dir_ / "rm").string());

  // forge eval reloads the reference and the reward model from their files: its numbers are the
  // run's last evaluation, so neither moved in memory while the policy trained.
  auto [code, out] = forge_output("eval " + run.string());
  ASSERT_EQ(code, 0) << out;
  for (const char* key : {"loss", "score", "reference_score", "kl", "reward_win_rate"})
    EXPECT_NE(out.find(std::string("val_") + key + " " + g6(losses(run, "val", key).at(6)) + "\n"),
              std::string::npos)
        << key << "\n"
        << out;
}

TEST_F(PPORecipe, EachUpdatePassStartsFromTheRolloutsLogProbabilitiesAndValues) {
  // A reward model trained with dropout: the separate value model starts from it and trains, so
  // its stored dropout would make the update's values differ from the rollout's by noise.
  std::string rm = testing::read_file(dir_ / "rm.yaml");
  rm.replace(rm.find("/rm\n"), 4, "/rm_drop\n");
  rm.replace(rm.find("model: {"), 8, "model: {dropout: 0.1, ");
  testing::write_file(dir_ / "rm_drop.yaml", rm);
  ASSERT_EQ(forge("train " + (dir_ / "rm_drop.yaml").string()), 0);
  // One epoch of one minibatch: every step's train line is the pass before its only update. With
  // clip ranges of 1e-12, any difference from the rollout's log-probabilities or values counts as
  // clipped.
  const fs::path config = write_config("exact", ", clip_range: 1.0e-12, clip_range_value: 1.0e-12",
                                       "{batch_size: 8, max_steps: 4, log_every: 1}");
  auto [code, out] = forge_output("train " + config.string() + " ppo.ppo_epochs=1 ppo.reward_model=" +
                                  (dir_ / "rm_drop").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("the value model from ppo.reward_model"), std::string::npos) << out;
  // The log-probabilities agree bitwise on the AVX-512 path; on the AVX2 path oneDNN sums the
  // rollout's and the update's forwards in other orders, and they agree to float rounding
  // (approx_kl 5.9e-16 measured). The value model's dropout moved the values by far more: its
  // value_clip_frac was 0.43 to 0.54.
  for (int64_t step = 1; step <= 4; ++step) {
    EXPECT_NEAR(losses(dir_ / "exact", "train", "ratio").at(step), 1.0, 1e-6) << step;
    EXPECT_LE(losses(dir_ / "exact", "train", "approx_kl").at(step), 1e-12) << step;
    EXPECT_EQ(losses(dir_ / "exact", "train", "clip_frac").at(step), 0.0) << step;
    EXPECT_EQ(losses(dir_ / "exact", "train", "value_clip_frac").at(step), 0.0) << step;
  }
  // The values moved from the fresh head's zeros, so the last check could have failed.
  EXPECT_NE(losses(dir_ / "exact", "train", "explained_variance").at(4), 0.0);
}

TEST_F(PPORecipe, PromptsThatOutgrowTheRewardOrValueModelsContextAreRefusedAtSetUp) {
  // A reward model of context 24 (trained from scratch: one from the base has its 40), with an
  // end of text of one token. A row the value model reads is prompt + completion less the last
  // token; one the reward model scores is prompt + completion + its end of text.
  std::ofstream(dir_ / "small_rm.yaml")
      << "recipe: reward_model\nseed: 3\noutput_dir: " << (dir_ / "small_rm").string() << "\n"
      << "model: {arch: gpt, vocab_size: 256, context: 24, d_model: 16, n_layers: 1, n_heads: 2}\n"
      << "data: {tokenizer: bytes, train: " << (dir_ / "pairs.jsonl").string()
      << ", val_fraction: 0.25}\n"
      << "preference: {max_prompt_length: 12, end_of_text: \"%\"}\n"
      << "train: {batch_size: 8, max_steps: 1}\n";
  ASSERT_EQ(forge("train " + (dir_ / "small_rm.yaml").string()), 0);
  const std::string rm = " ppo.reward_model=" + (dir_ / "small_rm").string();
  auto expect_refused = [&](const std::string& name, const std::string& prompt,
                            const std::string& args, const std::string& what) {
    testing::write_file(dir_ / (name + ".jsonl"), "{\"prompt\": \"ROMEO:\"}\n{\"prompt\": \"" +
                                                      prompt + "\"}\n");
    const std::string file = (dir_ / (name + ".jsonl")).string();
    auto [code, out] = forge_output("train " + write_config(name).string() + rm + args +
                                    " data.train=" + file + " data.val=" + file);
    EXPECT_EQ(code, 3) << out;
    EXPECT_NE(out.find(name + ".jsonl: prompt 2 is " + std::to_string(prompt.size()) +
                       " tokens; with ppo.max_new_tokens 12 " + what),
              std::string::npos)
        << out;
    EXPECT_FALSE(fs::exists(dir_ / name / "metrics.jsonl")) << "refused after the run began";
  };
  // 12 + 12 - 1 fits the value model; 12 + 12 + 1 does not fit the reward model.
  expect_refused("rm_long", std::string(12, 'a'), "",
                 "and the reward model's preference.end_of_text (1 token) it does not fit the "
                 "reward model's context 24");
  // 14 + 12 - 1 does not fit the value model (a copy of the reward model), nor the reward model:
  // the value model is named first; with a shared value head only the reward model's is.
  expect_refused("value_long", std::string(14, 'a'), "",
                 "it does not fit the value model's context 24");
  expect_refused("shared_long", std::string(14, 'a'), " ppo.value=shared",
                 "and the reward model's preference.end_of_text (1 token) it does not fit the "
                 "reward model's context 24");
}

TEST_F(PPORecipe, TheEvaluationKLIsThatOfTheSamplingDistribution) {
  // At step 0 the policy is its reference. Sampled at temperature 0.7 without a filter, both sides
  // are the same tempered distribution: KL 0. With top-k 3 the policy's samples come from the
  // truncated distribution, whose KL to the tempered reference is the filter's own cost,
  // -log(the kept mass) per token; the model's temperature-1 log-probabilities said 0 for both.
  const std::string train = "{batch_size: 8, max_steps: 1, log_every: 1}";
  ASSERT_EQ(forge("train " + write_config("tempered", ", temperature: 0.7", train).string()), 0);
  EXPECT_NEAR(losses(dir_ / "tempered", "val", "kl").at(0), 0.0, 1e-5);
  ASSERT_EQ(
      forge("train " + write_config("top_k", ", temperature: 0.7, top_k: 3", train).string()), 0);
  const double kl = losses(dir_ / "top_k", "val", "kl_per_token").at(0);
  EXPECT_GT(kl, 0.05);
  EXPECT_LT(kl, std::log(256.0 / 3));  // at most that of a uniform distribution cut to 3 of 256
}

TEST_F(PPORecipe, TheRolloutDoesNotDependOnTheGenerationBatch) {
  const std::string train = "{batch_size: 4, max_steps: 2, log_every: 1}";
  ASSERT_EQ(forge("train " + write_config("eight", "", train).string()), 0);
  ASSERT_EQ(
      forge("train " + write_config("three", "", train).string() + " ppo.generation_batch_size=3"),
      0);
  EXPECT_EQ(train_lines(dir_ / "eight", keys_), train_lines(dir_ / "three", keys_));
}

TEST_F(PPORecipe, MicroBatchesOfAMinibatchGiveTheSameUpdates) {
  const std::string whole = "{batch_size: 4, max_steps: 3, log_every: 1}";
  const std::string split = "{batch_size: 2, grad_accum: 2, max_steps: 3, log_every: 1}";
  ASSERT_EQ(forge("train " + write_config("whole", "", whole).string()), 0);
  ASSERT_EQ(forge("train " + write_config("split", "", split).string()), 0);
  // Exact token normalisation: the same gradients, up to the summation order.
  for (const char* key : {"loss", "score", "kl", "value_loss", "grad_norm"}) {
    const std::map<int64_t, double> a = losses(dir_ / "whole", "train", key),
                                    b = losses(dir_ / "split", "train", key);
    ASSERT_EQ(a.size(), 3u);
    for (const auto& [step, v] : a) EXPECT_NEAR(b.at(step), v, 1e-4 * (1 + std::abs(v))) << key;
  }
  const auto wa = saved_tensors(dir_ / "whole"), wb = saved_tensors(dir_ / "split");
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, v] : wa)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(wb.at(name)[i], v[i], 1e-4) << name;
}

TEST_F(PPORecipe, KilledAndRestartedIsExactWithTheAdaptiveKLController) {
  const std::string adaptive = ", adaptive_kl: true, target_kl: 0.5, kl_horizon: 20";
  const std::string train = "{batch_size: 4, max_steps: 5, save_every: 2, log_every: 1}";
  ASSERT_EQ(forge("train " + write_config("straight", adaptive, train).string()), 0);
  const fs::path killed = write_config("killed", adaptive, train);
  EXPECT_EQ(forge("train " + killed.string(), "FORGE_TEST_SIGKILL_AFTER_STEP=3"), 128 + SIGKILL);
  EXPECT_EQ(read_checkpoint_info(*latest_checkpoint(dir_ / "killed")).step, 2);
  ASSERT_EQ(forge("train " + killed.string()), 0);
  const std::vector<std::string> a = train_lines(dir_ / "straight", keys_),
                                 b = train_lines(dir_ / "killed", keys_);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a, b);
  // The controller moved, so the resumed run had to restore it.
  const std::map<int64_t, double> coef = losses(dir_ / "straight", "train", "kl_coef");
  EXPECT_EQ(coef.at(1), 0.05);
  EXPECT_NE(coef.at(5), 0.05);
  EXPECT_EQ(saved_tensors(dir_ / "killed"),
            saved_tensors(dir_ / "straight"));  // bitwise
}

// The resume test's run with bf16 products and bf16 frozen models (the reference and the reward
// model): it differs from fp32's, starts near it, and a killed run resumes bitwise, the KL
// controller with it. Only the start is compared: the rounding flips a sampled token now and then,
// and the completion after it, so the rollouts and what the policy learns from them part ways.
TEST_F(PPORecipe, Bf16RunWithBf16FrozenModelsStaysNearFp32AndResumesExactly) {
  const std::string adaptive = ", adaptive_kl: true, target_kl: 0.5, kl_horizon: 20";
  const std::string train = "{batch_size: 4, max_steps: 5, save_every: 2, log_every: 1}";
  expect_bf16_differs_and_resumes_exactly(
      [&](const std::string& name) {
        return "train " + write_config(name, adaptive, train).string();
      },
      " train.precision=bf16 model.frozen_dtype=bf16", keys_, 5, 3);
  if (HasFatalFailure()) return;
  // The policy's entropy over the first rollout. Measured: 4.295741 in fp32, 4.295847 in bf16
  // (native and emulated).
  EXPECT_NEAR(losses(dir_ / "bf16", "train", "entropy").at(1),
              losses(dir_ / "fp32", "train", "entropy").at(1), 1e-3);
  // The frozen models alone: the reference's samples scored by the reward model, both bf16.
  // Measured: 2.5120 in fp32, 2.4947 in bf16 native; 2.5109 and 2.4930 emulated.
  EXPECT_NEAR(losses(dir_ / "bf16", "val", "reference_score").at(0),
              losses(dir_ / "fp32", "val", "reference_score").at(0), 0.05);
  // The bf16 reference is the base rounded (its embedding rows too, which the policy gathers in
  // f32), so the first rollout's KL is 0 only nearly. Measured: -1.5e-4 native, -8.5e-5 emulated.
  EXPECT_NEAR(losses(dir_ / "bf16", "train", "kl").at(1), 0.0, 1e-3);
}

TEST_F(PPORecipe, LoRAPolicyWithASharedValueHeadSavesAdaptersAndTheHead) {
  const std::string lora = "lora: {rank: 4, alpha: 8, targets: [\"*.attn.qkv\", \"*.mlp.*\"]}\n";
  const std::string train = "{batch_size: 4, max_steps: 3, save_every: 3, log_every: 1}";
  ASSERT_EQ(forge("train " + write_config("lora", ", value: shared", train, lora).string()), 0);
  EXPECT_EQ(losses(dir_ / "lora", "train", "kl").at(1), 0.0);
  for (const TensorSpec& t : read_checkpoint_info(resolve_checkpoint(dir_ / "lora")).model)
    EXPECT_TRUE(t.name.find("lora_") != std::string::npos || t.name == "value.weight") << t.name;
  auto [code, out] = forge_output("eval " + (dir_ / "lora").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_reward_win_rate "), std::string::npos) << out;
}

TEST_F(PPORecipe, BadInputsExitWithTheirCodesAndOneLine) {
  auto expect = [&](const fs::path& config, int code, const std::string& what) {
    auto [got, out] = forge_output("train " + config.string());
    EXPECT_EQ(got, code) << out;
    EXPECT_NE(out.find(what), std::string::npos) << out;
  };
  auto [odd, odd_out] =
      forge_output("train " + write_config("odd").string() + " ppo.rollout_batch=6");
  EXPECT_EQ(odd, 2) << odd_out;
  EXPECT_NE(odd_out.find("ppo.rollout_batch: 6 rows must split"), std::string::npos) << odd_out;
  {
    std::ofstream(dir_ / "no_rm.yaml")
        << "recipe: ppo\noutput_dir: " << (dir_ / "no_rm").string() << "\n"
        << "model: {init_from: " << (dir_ / "base").string() << ", dropout: 0.0}\n"
        << "data: {train: " << (dir_ / "prompts.jsonl").string() << "}\n";
    expect(dir_ / "no_rm.yaml", 2, "ppo.reward_model: name the reward_model run");
  }
  // A config written by write_config with one string replaced.
  auto edited = [&](const std::string& name, const std::string& from, const std::string& to) {
    std::string yaml = testing::read_file(write_config(name));
    yaml.replace(yaml.find(from), from.size(), to);
    testing::write_file(dir_ / (name + ".yaml"), yaml);
    return dir_ / (name + ".yaml");
  };
  expect(edited("drop", "dropout: 0.0", "dropout: 0.1"), 2,
         "model.dropout: 0.1: ppo's policy runs without dropout");
  expect(edited("lora_drop", "dropout: 0.0}\n",
                "dropout: 0.0}\nlora: {rank: 4, targets: [\"*.mlp.*\"], dropout: 0.1}\n"),
         2, "lora.dropout: 0.1: ppo's policy (its adapters) runs without dropout");
  // No held-out prompts, and no periodic evaluation that would ask for them: refused before
  // anything loads, not NaN metrics at step 0 and exit 5 at the end.
  const fs::path no_val = edited("no_val", ", val: " + (dir_ / "val_prompts.jsonl").string(),
                                 ", val_fraction: 0.0");
  auto [nv, nv_out] = forge_output("train " + no_val.string() + " train.eval_every=0");
  EXPECT_EQ(nv, 2) << nv_out;
  EXPECT_NE(nv_out.find("data.val_fraction: 0 and no data.val: ppo evaluates on held-out prompts"),
            std::string::npos)
      << nv_out;
  // A prompt that leaves no room for the completion: the file and the prompt's number.
  testing::write_file(dir_ / "long.jsonl",
                      "{\"prompt\": \"ROMEO:\"}\n{\"prompt\": \"" + std::string(30, 'a') + "\"}\n");
  expect(edited("long", (dir_ / "prompts.jsonl").string(), (dir_ / "long.jsonl").string()), 3,
         "long.jsonl: prompt 2 is 30 tokens");
  // A reward model that is not one.
  expect(edited("not_rm", "reward_model: " + (dir_ / "rm").string(),
                "reward_model: " + (dir_ / "base").string()),
         4, "a gpt_pretrain checkpoint, not a reward_model one");
}

}  // namespace
}  // namespace forge
