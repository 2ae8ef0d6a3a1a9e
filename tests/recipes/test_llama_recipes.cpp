// Every recipe on a Llama: the hub directory of a random tiny Llama (tests/golden/hf/llama) for
// full and LoRA fine-tuning with Hugging Face's target names, kill-and-resume, LoRA DPO and as a
// teacher; a Llama-shaped base (RMSNorm, rotary, SwiGLU, no biases, q/k/v apart, 4 query heads on
// 2 key/value heads, untied) trained once for the suite for SFT, reward model, PPO, classify and
// distillation into smaller Llamas. Short fixed-seed runs whose losses are finite and fall.
#include <gtest/gtest.h>
#include <signal.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// The Llama architecture keys, as a hub config.json would set them, at a toy size.
constexpr const char* kLlama =
    "norm: rmsnorm, position: rotary, mlp: swiglu, bias: false, fused_qkv: false, "
    "tie_embeddings: false, rope_theta: 10000.0";

constexpr const char* kHubTargets =
    "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]";

class LlamaRecipes : public testing::RecipeTest {
 protected:
  // The base every test starts from: d_model 32, 2 blocks, trained 30 steps on the corpus.
  static void SetUpTestSuite() {
    suite_ = fs::temp_directory_path() / ("forge_llama_recipes_" + std::to_string(::getpid()));
    fs::remove_all(suite_);
    fs::create_directories(suite_);
    std::ifstream in("data/samples/tinyshakespeare.txt", std::ios::binary);
    std::string text(40000, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    std::ofstream(suite_ / "corpus.txt", std::ios::binary) << text;
    std::ofstream(suite_ / "base.yaml")
        << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << (suite_ / "base").string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 40, d_model: 32, n_layers: 2, "
           "n_heads: 4, n_kv_heads: 2, ffn_hidden: 64, "
        << kLlama << ", dropout: 0.0}\n"
        << "data: {tokenizer: bytes, train: " << (suite_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 30, log_every: 10, sample_tokens: 1}\n";
    base_ok_ = forge("train " + (suite_ / "base.yaml").string()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(suite_); }

  void SetUp() override {
    RecipeTest::SetUp();
    ASSERT_TRUE(base_ok_) << "the Llama base did not train";
    base_ = suite_ / "base";
  }

  // dir_/name.yaml: `recipe` from `base` with seed 3 into dir_/name; `body` holds the rest.
  std::string write_run(const std::string& name, const std::string& recipe,
                        const fs::path& base, const std::string& body) {
    testing::write_file(dir_ / (name + ".yaml"),
                        "recipe: " + recipe + "\nseed: 3\noutput_dir: " + (dir_ / name).string() +
                            "\nmodel: {init_from: " + base.string() + ", dropout: 0.0}\n" + body);
    return (dir_ / (name + ".yaml")).string();
  }

  // A finetune run from `base` over two record files (or `train`), LoRA with `lora` when given.
  std::string write_finetune(const std::string& name, const fs::path& base,
                             const std::string& lora, const std::string& train = "") {
    fs::create_directories(dir_ / "records");
    std::ofstream(dir_ / "records" / "wit.txt")
        << "Brevity is the soul of wit.\n%\nA fool thinks himself to be wise.\n%\n"
           "Though this be madness, yet there is method in it.\n%\nAll that glitters is not "
           "gold.\n";
    std::ofstream(dir_ / "records" / "love.txt")
        << "Love looks not with the eyes, but with the mind.\n%\nThe course of true love never "
           "did run smooth.\n%\nLove all, trust a few, do wrong to none.\n%\nSpeak low, if you "
           "speak love.\n";
    return write_run(name, "finetune", base,
                     "data: {train: " + (train.empty() ? (dir_ / "records").string() : train) +
                         ", val_fraction: 0.25}\n"
                         "optimizer: {name: adamw, lr: 1.0e-2}\n"
                         "train: {batch_size: 4, max_steps: 12, eval_every: 6, save_every: 4, "
                         "log_every: 1, sample_tokens: 1}\n"
                         "lora: " + (lora.empty() ? std::string("{rank: 0}") : lora) + "\n"
                         "finetune: {end_of_text: \"%\\n\"}\n");
  }

  // Losses of a run's `split` lines are finite, and the last is below the first by `drop`.
  static void expect_falls(const fs::path& run, const std::string& split, double drop,
                           const std::string& key = "loss") {
    const std::map<int64_t, double> l = losses(run, split, key);
    ASSERT_GE(l.size(), 2u) << run;
    for (const auto& [step, v] : l) EXPECT_TRUE(std::isfinite(v)) << run << " step " << step;
    EXPECT_LT(l.rbegin()->second, l.begin()->second - drop)
        << run << " " << split << " " << key << ": " << l.begin()->second << " -> "
        << l.rbegin()->second;
  }

  // forge validate of `config` counts `key` ("parameters", "trainable parameters") as the
  // tensors of `run`'s latest checkpoint hold.
  void expect_validate_counts(const std::string& config, const std::string& key,
                              const fs::path& run) {
    const int64_t held = read_checkpoint_info(resolve_checkpoint(run)).model_numel();
    auto [code, out] = forge_output("validate " + config);
    ASSERT_EQ(code, 0) << out;
    const std::string line = "# " + key + ": " + std::to_string(held);
    const size_t at = out.find(line);
    ASSERT_NE(at, std::string::npos) << run << " holds " << held << "\n" << out;
    EXPECT_FALSE(std::isdigit(static_cast<unsigned char>(out[at + line.size()]))) << out;
  }

  static inline fs::path suite_;
  static inline bool base_ok_ = false;
  fs::path base_;
  // The hub's layout of a random tiny Llama (tests/golden/make_llama_goldens.py): 300 ids read as
  // bytes, linear rotary scaling, head_dim 8, SwiGLU 40, untied.
  const fs::path hub_ = fs::absolute("tests/golden/hf/llama");
};

// A hub directory as the base, its adapters named as PEFT names them.
TEST_F(LlamaRecipes, FullAndLoRAFineTunesOfAHubLlamaStartAtItAndFall) {
  const std::string lora = std::string("{rank: 4, alpha: 8, targets: ") + kHubTargets + "}";
  ASSERT_EQ(forge("train " + write_finetune("full", hub_, "")), 0);
  ASSERT_EQ(forge("train " + write_finetune("lora", hub_, lora)), 0);
  expect_falls(dir_ / "full", "val", 0.1);
  expect_falls(dir_ / "lora", "val", 0.05);
  expect_falls(dir_ / "lora", "train", 0.05);
  // LoRA starts exactly at the base (B = 0).
  EXPECT_EQ(losses(dir_ / "full", "val").at(0), losses(dir_ / "lora", "val").at(0));
  EXPECT_EQ(losses(dir_ / "full", "train").at(1), losses(dir_ / "lora", "train").at(1));

  // The hub names put adapters on the seven projections of each block, q, k and v apart (k and v
  // project to the 2 key/value heads of 8), and forge validate counts what training injected.
  const CheckpointInfo info = read_checkpoint_info(resolve_checkpoint(dir_ / "lora"));
  std::set<std::string> adapted;
  for (const TensorSpec& t : info.model) adapted.insert(t.name.substr(0, t.name.rfind('.')));
  std::set<std::string> want;
  for (const char* b : {"blocks.0.", "blocks.1."})
    for (const char* m : {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.gate", "mlp.up",
                          "mlp.proj"})
      want.insert(std::string(b) + m);
  EXPECT_EQ(adapted, want);
  const int64_t per_block = 4 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 2 * (32 + 40) + (40 + 32));
  EXPECT_EQ(info.model_numel(), 2 * per_block);
  auto [code, out] = forge_output("validate " + write_finetune("v", hub_, lora));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("# trainable parameters: " + std::to_string(2 * per_block) + " ("),
            std::string::npos)
      << out;

  // forge eval and generate take the LoRA run: the base, its adapters injected by their hub names.
  std::tie(code, out) = forge_output("eval " + (dir_ / "lora").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_loss " + g6(losses(dir_ / "lora", "val").at(12)) + "\n"),
            std::string::npos)
      << out;
  std::tie(code, out) = forge_output("generate --checkpoint " + (dir_ / "lora").string() +
                                     " --prompt Love --max-new-tokens 8 --seed 1");
  EXPECT_EQ(code, 0) << out;
}

TEST_F(LlamaRecipes, SFTWithLoRATrainsOnTheCompletions) {
  testing::write_file(dir_ / "sft.jsonl", testing::kSFT);
  const std::string lora = "{rank: 8, alpha: 16, targets: [all-linear]}";
  ASSERT_EQ(forge("train " + write_finetune("sft", base_, lora, (dir_ / "sft.jsonl").string())), 0);
  expect_falls(dir_ / "sft", "train", 0.3);
}

TEST_F(LlamaRecipes, KilledAndRestartedLoRARunOfAHubLlamaIsExact) {
  const std::string lora = "{rank: 4, alpha: 8, targets: [q_proj, v_proj, down_proj]}";
  ASSERT_EQ(forge("train " + write_finetune("straight", hub_, lora)), 0);
  const std::string killed = write_finetune("killed", hub_, lora);
  EXPECT_EQ(forge("train " + killed, "FORGE_TEST_SIGKILL_AFTER_STEP=5"), 128 + SIGKILL);
  EXPECT_EQ(read_checkpoint_info(*latest_checkpoint(dir_ / "killed")).step, 4);
  ASSERT_EQ(forge("train " + killed), 0);
  const std::vector<std::string> keys = {"loss", "grad_norm", "lr"};
  EXPECT_EQ(train_lines(dir_ / "straight", keys).size(), 12u);
  EXPECT_EQ(train_lines(dir_ / "killed", keys), train_lines(dir_ / "straight", keys));
  EXPECT_EQ(saved_tensors(dir_ / "killed"), saved_tensors(dir_ / "straight"));  // bitwise
}

// The preference recipes: a reward model whose head reads the last real token of the untied base,
// DPO of LoRA adapters on the hub Llama named by their hub names (its reference is that model with
// the adapters off), and PPO of the base against the reward model with its own value model, whose
// rollouts decode through the grouped-query KV cache.
TEST_F(LlamaRecipes, RewardModelDPOAndPPOTrainOnTheBase) {
  write_word_pairs(dir_ / "pairs.jsonl", 48, 1);
  write_word_pairs(dir_ / "val.jsonl", 16, 2);
  auto preference = [&](const std::string& name, const std::string& recipe,
                        const fs::path& base, const std::string& extra) {
    return write_run(name, recipe, base,
                     "data: {train: " + (dir_ / "pairs.jsonl").string() +
                         ", val: " + (dir_ / "val.jsonl").string() + "}\n"
                         "preference: {max_prompt_length: 16}\n"
                         "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.0}\n"
                         "train: {batch_size: 8, max_steps: 12, eval_every: 6, log_every: 1, "
                         "sample_tokens: 1}\n" +
                         extra);
  };
  ASSERT_EQ(forge("train " + preference("rm", "reward_model", base_, "")), 0);
  // Its head replaces the untied LM head, which forge validate does not count.
  expect_validate_counts(preference("rm", "reward_model", base_, ""), "parameters", dir_ / "rm");
  expect_falls(dir_ / "rm", "val", 0.05);
  EXPECT_GT(losses(dir_ / "rm", "val", "reward_acc").rbegin()->second, 0.7);

  const std::string lora = std::string("lora: {rank: 4, alpha: 8, targets: ") + kHubTargets + "}\n";
  ASSERT_EQ(forge("train " + preference("dpo", "dpo", hub_, lora)), 0);
  EXPECT_NEAR(losses(dir_ / "dpo", "val").at(0), std::log(2.0), 1e-6);
  EXPECT_NEAR(losses(dir_ / "dpo", "train").at(1), std::log(2.0), 1e-6);
  expect_falls(dir_ / "dpo", "val", 0.01);
  for (const TensorSpec& t : read_checkpoint_info(resolve_checkpoint(dir_ / "dpo")).model)
    EXPECT_NE(t.name.find("lora_"), std::string::npos) << t.name;  // adapters only

  std::ofstream prompt_file(dir_ / "prompts.jsonl");
  for (const char* p : {"ROMEO:", "JULIET:", "First Citizen:", "MENENIUS:", "All:", "KING:",
                        "Second Citizen:", "BRUTUS:"})
    prompt_file << nlohmann::json({{"prompt", p}}).dump() << "\n";
  prompt_file.close();
  const std::string prompts = (dir_ / "prompts.jsonl").string();
  const std::string ppo = write_run(
      "ppo", "ppo", base_,
      "data: {train: " + prompts + ", val: " + prompts + "}\nppo: {reward_model: " +
          (dir_ / "rm").string() +
          ", rollout_batch: 8, ppo_epochs: 2, max_new_tokens: 12, generation_batch_size: 8}\n"
          "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.0}\n"
          "train: {batch_size: 4, max_steps: 3, eval_every: 3, eval_batches: 1, log_every: 1, "
          "sample_tokens: 1}\n");
  ASSERT_EQ(forge("train " + ppo), 0);
  // The policy and the value model train; the latter is the reward model, without an LM head.
  expect_validate_counts(ppo, "trainable parameters", dir_ / "ppo");
  // The first rollout's policy is its reference: no KL, ratio 1 before the first update.
  EXPECT_EQ(losses(dir_ / "ppo", "train", "kl").at(1), 0.0);
  EXPECT_NEAR(losses(dir_ / "ppo", "train", "ratio").at(1), 1.0, 0.05);
  EXPECT_EQ(losses(dir_ / "ppo", "val", "score").at(0),
            losses(dir_ / "ppo", "val", "reference_score").at(0));
  for (const char* key : {"loss", "score", "value_loss", "approx_kl", "entropy", "grad_norm"})
    for (const auto& [step, v] : losses(dir_ / "ppo", "train", key))
      EXPECT_TRUE(std::isfinite(v)) << key << " at step " << step;
  EXPECT_GT(losses(dir_ / "ppo", "val", "kl").at(3), 0.0);  // the policy moved off its reference
  auto [code, out] = forge_output("eval " + (dir_ / "ppo").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_score " + g6(losses(dir_ / "ppo", "val", "score").at(3)) + "\n"),
            std::string::npos)
      << out;
}

TEST_F(LlamaRecipes, ClassifyLearnsThreeClassesFromTheBase) {
  fs::create_directories(dir_ / "records");
  const std::map<std::string, std::vector<std::string>> own = {
      {"bird", {"wings", "feather", "nest", "tweet"}},
      {"cat", {"meow", "whisker", "purr", "mouse"}},
      {"dog", {"bark", "fetch", "bone", "leash"}}};
  const std::vector<std::string> filler = {"the", "a", "and", "of", "was", "on", "in", "it"};
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  for (const auto& [label, words] : own) {
    std::ofstream out(dir_ / "records" / (label + ".txt"));
    for (int r = 0; r < 30; ++r) {
      out << (r ? "\n%\n" : "") << filler[next(8)] << " " << words[next(4)] << " "
          << filler[next(8)] << " " << words[next(4)];
    }
  }
  const std::string config = write_run(
      "classify", "classify", base_,
      "data: {train: " + (dir_ / "records").string() + ", val_fraction: 0.2}\n"
      "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.0}\n"
      "train: {batch_size: 8, max_steps: 30, eval_every: 15, log_every: 1, sample_tokens: 1}\n"
      "classify: {labels: [bird, cat, dog], max_len: 40, hidden: 16, dropout: 0.0}\n");
  ASSERT_EQ(forge("train " + config), 0);
  // The classifier keeps the base's body, not its untied LM head.
  expect_validate_counts(config, "parameters", dir_ / "classify");
  expect_falls(dir_ / "classify", "val", 0.1);
  EXPECT_GT(losses(dir_ / "classify", "val", "acc").at(30), 0.5);
}

// The base as teacher of a one-block student started from its block 0 (grouped-query like it),
// and of a narrower multi-query student from its own init, whose cosine loss goes through a
// learned projection to the teacher's width; the hub Llama as teacher of a one-block student
// started from its block 1, read from the hub's tensor names.
TEST_F(LlamaRecipes, DistillsIntoSmallerLlamas) {
  auto student = [&](const std::string& name, const std::string& model,
                     const std::string& distill, const fs::path& teacher) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: distill\nseed: 3\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {arch: gpt, context: 40, " << kLlama << ", dropout: 0.0, " << model << "}\n"
        << "data: {train: " << (suite_ / "corpus.txt").string() << ", val_fraction: 0.1}\n"
        << "distill: {teacher: " << teacher.string() << ", " << distill << "}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 12, eval_every: 6, eval_batches: 2, log_every: 1, "
           "sample_tokens: 1}\n";
    return (dir_ / (name + ".yaml")).string();
  };
  ASSERT_EQ(forge("train " +
                  student("deep", "d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, "
                                  "ffn_hidden: 64",
                          "init_from_teacher: every_other, alpha_cos: 0.5", base_)),
            0);
  ASSERT_EQ(forge("train " + student("narrow", "d_model: 16, n_layers: 1, n_heads: 2, "
                                               "n_kv_heads: 1, ffn_hidden: 32",
                                     "alpha_cos: 0.5", base_)),
            0);
  ASSERT_EQ(forge("train " + student("hub", "d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, "
                                            "head_dim: 8, ffn_hidden: 40, norm_eps: 1.0e-6, "
                                            "rope_scaling: {type: linear, factor: 2.0}",
                                     "init_from_teacher: blocks, teacher_blocks: [1]", hub_)),
            0);
  for (const char* run : {"deep", "narrow", "hub"}) {
    expect_falls(dir_ / run, "train", 0.05);
    expect_falls(dir_ / run, "val", 0.01);
  }
  expect_falls(dir_ / "narrow", "val", 0.01, "kd_loss");
  // From the teacher's embeddings, final norm, head and first block, the student starts near it
  // and stays there; the narrow one from its own init is far.
  EXPECT_LT(losses(dir_ / "deep", "train", "kd_loss").at(1), 0.1);
  EXPECT_LT(losses(dir_ / "deep", "val", "kd_loss").at(12), 0.1);
  EXPECT_GT(losses(dir_ / "narrow", "train", "kd_loss").at(1), 1.0);
}

}  // namespace
}  // namespace forge
