// Recipe finetune through the forge binary, from a tiny base GPT trained in SetUp: fixed-seed
// losses for full and LoRA fine-tuning on record files, the initial evaluation equal to the base's,
// adapter-only checkpoints, kill-and-resume of a LoRA run and a changed base, SFT on JSONL
// (masking, resume, in bf16 on a bf16 base, changed and bad lines; packed: resume and its config
// error), multi-turn SFT on conversations (padded and packed) and generate --chat on its run,
// eval/generate on a LoRA run, merged logits equal to the adapters', the errors of init_from, the
// trainable count of `forge validate`, and the finetune: and lora: sections read into their
// structs.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "core/ops.h"
#include "data/chat_sft.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "nn/lora.h"
#include "core/durable_file.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/finetune.h"
#include "runtime/lora_config.h"
#include "runtime/metrics.h"
#include "runtime/registry.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/recipes/recipe_test.h"
#include "tests/recipes/section_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class FinetuneRecipe : public testing::RecipeTest {
 protected:
  void SetUp() override {
    RecipeTest::SetUp();
    base_ = dir_ / "base";
    ASSERT_EQ(forge("train " + write_base_config("base", 7).string()), 0);
    base_file_ = resolve_checkpoint(base_);
    // Two small record files in the fortunes format.
    fs::create_directories(dir_ / "records");
    std::ofstream(dir_ / "records" / "wit.txt")
        << "Brevity is the soul of wit.\n%\nA fool thinks himself to be wise.\n%\n"
           "Though this be madness, yet there is method in it.\n%\nAll that glitters is not gold.\n";
    std::ofstream(dir_ / "records" / "love.txt")
        << "Love looks not with the eyes, but with the mind.\n%\nThe course of true love never "
           "did run smooth.\n%\nLove all, trust a few, do wrong to none.\n%\nSpeak low, if you "
           "speak love.\n";
  }

  // The base: a d_model 32, 2-layer GPT trained 20 steps on the corpus into dir_/name.
  fs::path write_base_config(const std::string& name, int seed) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: gpt_pretrain\nseed: " << seed << "\noutput_dir: " << (dir_ / name).string()
        << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 32, d_model: 32, n_layers: 2, "
           "n_heads: 2, dropout: 0.0}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 20, log_every: 10, sample_tokens: 1}\n";
    return dir_ / (name + ".yaml");
  }

  // A finetune config over the records (or `train`), LoRA when rank > 0, writing to dir_/name
  // (or `output_dir`).
  fs::path write_config(const std::string& name, int rank, const std::string& extra = "",
                        const std::string& train = "", const fs::path& output_dir = {}) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: finetune\nseed: 3\noutput_dir: "
        << (output_dir.empty() ? dir_ / name : output_dir).string() << "\n"
        << "model: {init_from: " << base_.string() << "}\n"
        << "data: {train: " << (train.empty() ? (dir_ / "records").string() : train)
        << ", val_fraction: 0.25}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 12, eval_every: 6, save_every: 4, log_every: 1, "
           "sample_tokens: 4}\n"
        << "lora: {rank: " << rank << ", alpha: 16}\n"
        << "finetune: {end_of_text: \"%\\n\"}\n"
        << extra;
    return dir_ / (name + ".yaml");
  }

  // The SFT records as dir_/name.jsonl.
  fs::path write_sft(const std::string& name, const std::string& text = testing::kSFT) {
    testing::write_file(dir_ / (name + ".jsonl"), text);
    return dir_ / (name + ".jsonl");
  }

  static std::vector<std::string> lines(const fs::path& run) {
    return RecipeTest::train_lines(run, {"loss", "grad_norm", "lr"});
  }
  fs::path base_, base_file_;
};

TEST_F(FinetuneRecipe, FullAndLoRAStartAtTheBaseAndLogTheExpectedLosses) {
  ASSERT_EQ(forge("train " + write_config("full", 0).string()), 0);
  ASSERT_EQ(forge("train " + write_config("lora", 8).string()), 0);
  std::map<int64_t, double> full = losses(dir_ / "full", "val"), lora = losses(dir_ / "lora", "val");
  ASSERT_EQ(full.size(), 3u);  // steps 0, 6, 12
  ASSERT_EQ(lora.size(), 3u);
  // LoRA starts exactly at the base model (B = 0), so both initial evaluations agree, and they are
  // what `forge eval` gives for the base's checkpoint on the same split.
  EXPECT_EQ(full.at(0), lora.at(0));
  auto [code, out] = forge_output(
      "eval " + write_config("base_eval", 0, "", "", base_).string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_loss " + g6(full.at(0)) + "\n"), std::string::npos)
      << "val_loss " << g6(full.at(0)) << " missing in:\n" << out;
  EXPECT_LT(full.at(12), full.at(0));
  EXPECT_LT(lora.at(12), lora.at(0));

  std::map<int64_t, double> train_full = losses(dir_ / "full", "train"),
                            train_lora = losses(dir_ / "lora", "train");
  ASSERT_EQ(train_full.size(), 12u);
  ASSERT_EQ(train_lora.size(), 12u);
  // The first step's loss is the base's on the same batch for both.
  EXPECT_EQ(train_full.at(1), train_lora.at(1));
  // Values from these fixed seeds (any ISA within 1e-3). At this lr the adapters move the loss by
  // little more than 1e-3 in 12 steps, so the LoRA losses mostly pin the base and the data; the
  // gradient norms pin the adapters (they scale with alpha / rank and see only lora_B at step 1).
  EXPECT_NEAR(train_full.at(1), 3.5757, 1e-3);
  EXPECT_NEAR(train_full.at(6), 3.3266, 2e-3);
  EXPECT_NEAR(train_full.at(12), 3.1951, 3e-3);
  EXPECT_NEAR(train_lora.at(1), 3.5757, 1e-3);
  EXPECT_NEAR(train_lora.at(6), 3.6111, 2e-3);
  EXPECT_NEAR(train_lora.at(12), 3.6157, 3e-3);
  std::map<int64_t, double> norm_full = losses(dir_ / "full", "train", "grad_norm"),
                            norm_lora = losses(dir_ / "lora", "train", "grad_norm");
  EXPECT_NEAR(norm_full.at(1), 1.0722, 2e-3);
  EXPECT_NEAR(norm_lora.at(1), 0.03948, 2e-4);
  EXPECT_NEAR(norm_lora.at(12), 0.01609, 3e-4);
  EXPECT_NEAR(full.at(0), 3.4294, 2e-3);
  EXPECT_NEAR(full.at(12), 3.1930, 3e-3);
  EXPECT_NEAR(lora.at(12), 3.4285, 3e-3);
}

// LoRA+ (lora.lr_ratio): B trains at the ratio times A's rate. B starts at zero and A gets no
// gradient while B is zero, so one AdamW update (m / sqrt(v) = +-1, no weight decay) leaves A as it
// was and moves each element of B with a gradient by exactly lr * ratio.
TEST_F(FinetuneRecipe, LoRAPlusTrainsBAtTheRatioTimesTheRate) {
  const std::string one_step =
      " train.max_steps=1 train.save_every=1 optimizer.weight_decay=0 train.clip_grad_norm=0";
  ASSERT_EQ(forge("train " + write_config("plain", 2).string() + one_step), 0);
  ASSERT_EQ(forge("train " + write_config("plus", 2).string() + one_step + " lora.lr_ratio=4"), 0);
  const auto plain = saved_tensors(dir_ / "plain"), plus = saved_tensors(dir_ / "plus");
  ASSERT_EQ(plain.size(), plus.size());
  const double lr = 3.0e-3;
  int checked = 0;
  for (const auto& [name, b] : plus) {
    if (!name.ends_with(".lora_B")) continue;
    ++checked;
    float largest = 0, largest_plain = 0;
    for (float v : b) largest = std::max(largest, std::fabs(v));
    for (float v : plain.at(name)) largest_plain = std::max(largest_plain, std::fabs(v));
    EXPECT_NEAR(largest, 4 * lr, 1e-3 * lr) << name;
    EXPECT_NEAR(largest_plain, lr, 1e-3 * lr) << name;
    const std::string a = name.substr(0, name.size() - 1) + "A";
    EXPECT_EQ(plus.at(a), plain.at(a)) << a;
  }
  EXPECT_EQ(checked, 2 * 4);  // qkv, proj, fc and mlp.proj of 2 blocks
}

TEST_F(FinetuneRecipe, AdapterCheckpointHoldsOnlyAdaptersAndReferencesTheBase) {
  ASSERT_EQ(forge("train " + write_config("lora", 2).string() + " train.max_steps=4"), 0);
  const fs::path file = resolve_checkpoint(dir_ / "lora");
  CheckpointInfo info = read_checkpoint_info(file);
  EXPECT_EQ(info.step, 4);
  ASSERT_EQ(info.model.size(), 2u * 4u * 2u);  // A and B of qkv, proj, fc, mlp.proj in 2 blocks
  // r (in + out) each: qkv 32 -> 96, proj 32 -> 32, fc 32 -> 128, mlp.proj 128 -> 32.
  EXPECT_EQ(info.model_numel(), 2 * 2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32)));
  for (const TensorSpec& t : info.model) {
    const bool adapter = t.name.ends_with(".lora_A") || t.name.ends_with(".lora_B");
    EXPECT_TRUE(adapter) << t.name;
  }
  // The adapters' AdamW moments (and a step count each), none for the frozen base.
  EXPECT_LE(info.optim_numel(), 2 * info.model_numel() + int64_t(info.model.size()));
  ASSERT_EQ(info.references.count("model"), 1u);
  EXPECT_EQ(info.references.at("model").digest, file_digest(base_file_, ExitCode::checkpoint));
  EXPECT_EQ(fs::path(info.references.at("model").path), base_file_);
  // Rank 2 adapters are 6% of the base's weights; with the file's fixed overhead (metadata, the
  // config, checksums) the checkpoint stays under a sixth of the base's.
  EXPECT_LT(fs::file_size(file), fs::file_size(base_file_) / 6)
      << fs::file_size(file) << " vs base " << fs::file_size(base_file_);
}

TEST_F(FinetuneRecipe, KilledAndRestartedLoRARunLogsTheSameLossesAndAdapters) {
  ASSERT_EQ(forge("train " + write_config("straight", 8).string()), 0);
  fs::path killed = write_config("killed", 8);
  // Dies by SIGKILL after step 5 (checkpoint at 4), then resumes from step 4.
  EXPECT_EQ(forge("train " + killed.string(), "FORGE_TEST_SIGKILL_AFTER_STEP=5"), 128 + SIGKILL);
  EXPECT_EQ(read_checkpoint_info(*latest_checkpoint(dir_ / "killed")).step, 4);
  ASSERT_EQ(forge("train " + killed.string()), 0);
  std::vector<std::string> a = lines(dir_ / "straight"), b = lines(dir_ / "killed");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  auto want = saved_tensors(dir_ / "straight"), got = saved_tensors(dir_ / "killed");
  ASSERT_EQ(want.size(), 16u);
  EXPECT_EQ(got, want);  // bitwise
}

// A bf16 base (model.frozen_dtype: bf16) starts at the base's loss up to bf16's rounding, trains
// about as the fp32 base does, resumes exactly, and forge validate counts its weights at 2 bytes.
TEST_F(FinetuneRecipe, LoRAOnABf16BaseTracksTheFp32BaseAndResumesExactly) {
  const std::string bf16 = " model.frozen_dtype=bf16";
  ASSERT_EQ(forge("train " + write_config("fp32_base", 8).string()), 0);
  ASSERT_EQ(forge("train " + write_config("bf16_base", 8).string() + bf16), 0);
  fs::path killed = write_config("bf16_killed", 8);
  EXPECT_EQ(forge("train " + killed.string() + bf16, "FORGE_TEST_SIGKILL_AFTER_STEP=5"),
            128 + SIGKILL);
  ASSERT_EQ(forge("train " + killed.string() + bf16), 0);
  EXPECT_EQ(lines(dir_ / "bf16_base"), lines(dir_ / "bf16_killed"));
  EXPECT_EQ(saved_tensors(dir_ / "bf16_base"), saved_tensors(dir_ / "bf16_killed"));
  EXPECT_NE(lines(dir_ / "fp32_base"), lines(dir_ / "bf16_base"));
  std::map<int64_t, double> fp32 = losses(dir_ / "fp32_base", "val"),
                            narrowed = losses(dir_ / "bf16_base", "val");
  ASSERT_EQ(narrowed.size(), 3u);
  for (const auto& [step, loss] : fp32) EXPECT_NEAR(narrowed.at(step), loss, 1e-2) << step;
  // The weights a LoRA run keeps are nearly all the frozen base's: 2 bytes each instead of 4.
  auto state_bytes = [&](std::vector<std::string> overrides) {
    const RunConfig c = load_config(write_config("estimate", 8).string(), overrides);
    const MemoryEstimate e = find_recipe(c.recipe).estimate(c);
    return std::pair{e.state_bytes, e.parameters - e.trainable_parameters};
  };
  const auto [fp32_bytes, frozen] = state_bytes({});
  EXPECT_DOUBLE_EQ(fp32_bytes - state_bytes({"model.frozen_dtype=bf16"}).first, 2.0 * frozen);
}

TEST_F(FinetuneRecipe, ResumingALoRARunRefusesAChangedBase) {
  fs::path cfg = write_config("lora", 8);
  ASSERT_EQ(forge("train " + cfg.string() + " train.max_steps=6"), 0);
  // Another base (seed 8) over the base's checkpoint file: same path, other weights.
  ASSERT_EQ(forge("train " + write_base_config("other", 8).string()), 0);
  const std::string old_digest = file_digest(base_file_, ExitCode::checkpoint);
  fs::copy_file(resolve_checkpoint(dir_ / "other"), base_file_,
                fs::copy_options::overwrite_existing);
  // With the digests Forge records next to it, else they reject the file as damaged first.
  fs::copy_file(digest_path(resolve_checkpoint(dir_ / "other")), digest_path(base_file_),
                fs::copy_options::overwrite_existing);
  fs::copy_file(dir_ / "other" / "checkpoints" / "LATEST", base_file_.parent_path() / "LATEST",
                fs::copy_options::overwrite_existing);
  const std::string new_digest = file_digest(base_file_, ExitCode::checkpoint);
  ASSERT_NE(old_digest, new_digest);
  auto [code, out] = forge_output("train " + cfg.string() + " train.max_steps=12");
  EXPECT_EQ(code, 4) << out;
  EXPECT_NE(out.find("now has digest " + new_digest), std::string::npos) << out;
  EXPECT_NE(out.find(old_digest), std::string::npos) << out;
}

// The SFT loss by hand: -log softmax(logits)[target] in double over the completion and
// end-of-text positions of each row, nothing over the prompt or the padding.
TEST_F(FinetuneRecipe, SFTLossScoresOnlyCompletionAndEndOfText) {
  nn::GPTConfig g;
  g.vocab_size = 256;
  g.context = 32;
  g.d_model = 16;
  g.n_layers = 1;
  g.n_heads = 2;
  Generator gen(5);
  nn::GPT model(g, gen);
  model.eval();
  std::unique_ptr<Tokenizer> bytes = make_tokenizer("bytes");
  const std::vector<int32_t> eot = end_of_text_ids(*bytes, "%\n");
  ASSERT_EQ(eot, (std::vector<int32_t>{'%', '\n'}));
  auto data = std::make_shared<const SFTDataset>(tokenize_sft(
      {{"Say hi:", " hi"}, {"Count to three please:", " 1 2 3"}}, *bytes, eot, 33));
  ASSERT_EQ(data->prompt_len, (std::vector<int64_t>{7, 22}));
  SFTBatch batch = SFTLoader::make_batch(*data, {0, 1});
  NoGradGuard no_grad;
  MicroBatchLoss got = sft_loss(model, batch);

  Tensor logits = model.forward(batch.ids).contiguous();  // [B, L-1, V]
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  ASSERT_EQ(B, 2);
  ASSERT_EQ(T, 22 + 6 + 2 - 1);  // the longer row, less its last token
  std::vector<double> z = logits.to_vector<double>();
  double want = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& row = data->tokens[size_t(b)];
    // Position j predicts row[j + 1]; scored when row[j + 1] is completion or end-of-text.
    for (int64_t j = data->prompt_len[size_t(b)] - 1; j + 1 < int64_t(row.size()); ++j) {
      const double* zj = &z[size_t((b * T + j) * V)];
      double m = zj[0];
      for (int64_t v = 1; v < V; ++v) m = std::max(m, zj[v]);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(zj[v] - m);
      want += -(zj[row[size_t(j + 1)]] - m - std::log(s));
      ++count;
    }
  }
  EXPECT_EQ(count, (3 + 2) + (6 + 2));
  EXPECT_EQ(got.num_targets, count);
  EXPECT_EQ(batch.num_targets, count);
  EXPECT_NEAR(got.loss_sum.item(), want, 1e-5 * want);
}

TEST_F(FinetuneRecipe, SFTRunTrainsResumesAndRejectsChangedOrBadData) {
  const std::string jsonl = write_sft("sft").string();
  ASSERT_EQ(forge("train " + write_config("sft", 8, "", jsonl).string()), 0);
  std::map<int64_t, double> train = losses(dir_ / "sft", "train"), val = losses(dir_ / "sft", "val");
  ASSERT_EQ(train.size(), 12u);
  ASSERT_EQ(val.size(), 3u);
  // Values from this fixed seed (any ISA within 1e-3).
  EXPECT_NEAR(train.at(1), 4.1417, 2e-3);
  EXPECT_NEAR(train.at(6), 4.2812, 2e-3);
  EXPECT_NEAR(train.at(12), 3.9993, 3e-3);
  EXPECT_NEAR(val.at(0), 3.8672, 2e-3);
  EXPECT_NEAR(val.at(12), 3.8489, 3e-3);

  // Killed after step 5 and resumed from step 4: the loader's cursor continues the same batches.
  fs::path killed = write_config("sft_killed", 8, "", jsonl);
  EXPECT_EQ(forge("train " + killed.string(), "FORGE_TEST_SIGKILL_AFTER_STEP=5"), 128 + SIGKILL);
  ASSERT_EQ(forge("train " + killed.string()), 0);
  EXPECT_EQ(lines(dir_ / "sft_killed"), lines(dir_ / "sft"));

  // The records change under a stopped run: its cursor belongs to other data.
  const std::string changed = write_sft("changed").string();
  fs::path stopped = write_config("sft_changed", 8, "", changed);
  ASSERT_EQ(forge("train " + stopped.string() + " train.max_steps=4"), 0);
  write_sft("changed", std::string(testing::kSFT) +
                           R"({"prompt": "Colour of blood?", "completion": " red"})" + "\n");
  auto [code, out] = forge_output("train " + stopped.string());
  EXPECT_EQ(code, 4) << out;
  EXPECT_NE(out.find("training data changed"), std::string::npos) << out;

  // A prompt that is not a string: a data error naming the line and the field.
  const std::string bad = write_sft("bad", R"({"prompt": "a", "completion": "b"}
{"prompt": 1, "completion": "x"}
)").string();
  auto [bad_code, bad_out] = forge_output("train " + write_config("bad", 8, "", bad).string());
  EXPECT_EQ(bad_code, 3) << bad_out;
  EXPECT_NE(bad_out.find("bad.jsonl:2"), std::string::npos) << bad_out;
  EXPECT_NE(bad_out.find("prompt"), std::string::npos) << bad_out;
}

// The SFT run above with bf16 products over a bf16 base (the LoRA path with both settings): it
// differs from fp32's, ends near its loss, and a killed run resumes onto the same batches and
// adapters bitwise.
TEST_F(FinetuneRecipe, SFTRunInBf16OnABf16BaseStaysNearFp32AndResumesExactly) {
  const std::string jsonl = write_sft("sft").string();
  expect_bf16_differs_and_resumes_exactly(
      [&](const std::string& name) { return "train " + write_config(name, 8, "", jsonl).string(); },
      " train.precision=bf16 model.frozen_dtype=bf16", {"loss", "grad_norm", "lr"}, 12, 5);
  if (HasFatalFailure()) return;
  // Measured: 3.84893 in fp32, 3.84898 in bf16 native, 3.84895 emulated.
  EXPECT_NEAR(losses(dir_ / "bf16", "val").at(12), losses(dir_ / "fp32", "val").at(12), 5e-4);
}

// Conversations short enough for the base's 32-token context, in a template of one letter a role.
constexpr const char* kChatTemplate =
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}";

std::string chat_line(const std::vector<std::pair<std::string, std::string>>& turns) {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& [role, content] : turns)
    messages.push_back({{"role", role}, {"content", content}});
  return nlohmann::json{{"messages", messages}}.dump() + "\n";
}

std::string chat_records() {
  std::string out;
  const char* pairs[][4] = {{"France?", "Paris", "Italy?", "Rome"},
                            {"Spain?", "Madrid", "Peru?", "Lima"},
                            {"Up?", "down", "Hot?", "cold"},
                            {"Old?", "new", "Wet?", "dry"},
                            {"Snow?", "white", "Grass?", "green"},
                            {"Sky?", "blue", "Coal?", "black"}};
  for (const auto& p : pairs) {
    out += chat_line({{"user", p[0]}, {"assistant", p[1]}, {"user", p[2]}, {"assistant", p[3]}});
    out += chat_line({{"system", "Be brief."}, {"user", p[2]}, {"assistant", p[3]}});
  }
  return out;
}

// Multi-turn SFT: fixed-seed losses, kill-and-resume onto the same batches, a bad line, a config
// without a template; then generate --chat answers with the reply alone, as the model continues
// the rendered conversation greedily up to the template's end of turn.
TEST_F(FinetuneRecipe, ChatSFTTrainsResumesAndGenerateAnswersAConversation) {
  testing::write_file(dir_ / "chat.jinja", kChatTemplate);
  const std::string jsonl = write_sft("chat", chat_records()).string();
  const std::string with_template = " data.chat_template=" + (dir_ / "chat.jinja").string();
  ASSERT_EQ(forge("train " + write_config("chat_run", 0, "", jsonl).string() + with_template), 0);
  std::map<int64_t, double> train = losses(dir_ / "chat_run", "train"),
                            val = losses(dir_ / "chat_run", "val");
  ASSERT_EQ(train.size(), 12u);
  ASSERT_EQ(val.size(), 3u);
  // Values from this fixed seed (any ISA within 1e-3).
  EXPECT_NEAR(train.at(1), 3.7504, 2e-3);
  EXPECT_NEAR(train.at(12), 3.0306, 3e-3);
  EXPECT_NEAR(val.at(0), 3.4623, 2e-3);
  EXPECT_NEAR(val.at(12), 2.9321, 3e-3);

  const std::string killed = write_config("chat_killed", 0, "", jsonl).string() + with_template;
  EXPECT_EQ(forge("train " + killed, "FORGE_TEST_SIGKILL_AFTER_STEP=5"), 128 + SIGKILL);
  ASSERT_EQ(forge("train " + killed), 0);
  EXPECT_EQ(lines(dir_ / "chat_killed"), lines(dir_ / "chat_run"));
  EXPECT_EQ(forge("train " + write_config("chat_packed", 0, "", jsonl).string() + with_template +
                  " finetune.packing=true"),
            0);

  const std::string bad =
      write_sft("bad_chat", chat_records() + R"({"messages": [{"role": "bot", "content": "x"}]})" +
                                "\n")
          .string();
  auto [bad_code, bad_out] =
      forge_output("train " + write_config("bad_chat", 0, "", bad).string() + with_template);
  EXPECT_EQ(bad_code, 3) << bad_out;
  EXPECT_NE(bad_out.find("bad_chat.jsonl:13: messages[0].role: unknown role \"bot\""),
            std::string::npos) << bad_out;
  auto [none_code, none_out] =
      forge_output("train " + write_config("no_template", 0, "", jsonl).string());
  EXPECT_EQ(none_code, 2) << none_out;
  EXPECT_NE(none_out.find("set data.chat_template to a .jinja file"), std::string::npos)
      << none_out;
  // Conversations validated on prompt/completion records: refused before either file is read.
  const std::string plain = write_sft("plain").string();
  auto [kind_code, kind_out] = forge_output("train " +
                                            write_config("mixed", 0, "", jsonl).string() +
                                            with_template + " data.val=" + plain);
  EXPECT_EQ(kind_code, 2) << kind_out;
  EXPECT_NE(kind_out.find("data.val '" + plain + "' is not the same kind of data as data.train"),
            std::string::npos)
      << kind_out;

  // The reply generate --chat prints is the greedy continuation of the rendered conversation,
  // cut before the end of turn ("\n"). The tiny model's greedy reply is often empty; a non-empty
  // one is preferred when one of a few user messages gives it. Each must end within the tokens.
  LoadedGPT loaded = load_gpt(resolve_checkpoint(dir_ / "chat_run"));
  const ChatTemplate chat_template(kChatTemplate, "test", "", "");
  auto bytes = make_tokenizer("bytes");
  nn::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 16;
  std::string user, want;
  for (const char* ask : {"Snow?", "Sky?", "Up?", "Old?", "France?", "Hot?", "Wet?", "Coal?"}) {
    const std::vector<int32_t> prompt =
        bytes->encode(chat_template.render({{"system", "Be brief."}, {"user", ask}}, true));
    const std::vector<int64_t> ids =
        nn::generate(*loaded.model, {prompt.begin(), prompt.end()}, greedy);
    const std::string text = bytes->decode({ids.begin(), ids.end()});
    ASSERT_NE(text.find('\n'), std::string::npos) << ask << ": " << text;
    if (user.empty() || want == "\n") {
      user = ask;
      want = text.substr(0, text.find('\n')) + "\n";
    }
  }
  testing::write_file(dir_ / "conversation.json",
                      R"({"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": ")" + user + R"("}]})");
  const std::string generate = "generate --checkpoint " + (dir_ / "chat_run").string() +
                               " --temperature 0 --max-new-tokens 16 ";
  auto [c1, reply1] = forge_output(generate + "--chat " + (dir_ / "conversation.json").string());
  EXPECT_EQ(c1, 0) << reply1;
  EXPECT_EQ(reply1, want);
  auto [c2, reply2] = forge_output(generate + "--user '" + user + "' --system 'Be brief.'");
  EXPECT_EQ(c2, 0) << reply2;
  EXPECT_EQ(reply2, want);
  // The run exported as a hub directory whose tokenizer_config.json ends a turn with "$" and whose
  // generation_config.json lists "\n" (id 10) as an end of turn: the reply stops at that id.
  const fs::path hub = dir_ / "chat_hub";
  ASSERT_EQ(forge("export --checkpoint " + (dir_ / "chat_run").string() + " --format hf --output " +
                  hub.string()),
            0);
  const char* hub_template =
      "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}${% endfor %}"
      "{% if add_generation_prompt %}a:{% endif %}";
  testing::write_file(hub / "tokenizer_config.json",
                      nlohmann::json{{"chat_template", hub_template}}.dump());
  testing::write_file(hub / "generation_config.json", R"({"eos_token_id": [10]})");
  {
    LoadedGPT from_hub = load_gpt(resolve_checkpoint(hub));
    const std::vector<int32_t> prompt = bytes->encode(ChatTemplate(hub_template, "hub", "", "")
                                                          .render({{"user", user}}, true));
    const std::vector<int64_t> ids =
        nn::generate(*from_hub.model, {prompt.begin(), prompt.end()}, greedy);
    const std::string text = bytes->decode({ids.begin(), ids.end()});
    ASSERT_NE(text.find('\n'), std::string::npos) << text;
    ASSERT_LT(text.find('\n'), text.find('$')) << text;  // the id ends it, not the text
    auto [c, reply] = forge_output("generate --checkpoint " + hub.string() + " --user '" + user +
                                   "' --temperature 0 --max-new-tokens 16");
    EXPECT_EQ(c, 0) << reply;
    EXPECT_EQ(reply, text.substr(0, text.find('\n')) + "\n");
  }
  auto [c3, usage] = forge_output(generate + "--system 'Be brief.' --prompt x");
  EXPECT_EQ(c3, 2) << usage;
  testing::write_file(dir_ / "conversation.json",
                      R"({"messages": [{"role": "user", "content": 3}]})");
  auto [c4, bad_chat] = forge_output(generate + "--chat " + (dir_ / "conversation.json").string());
  EXPECT_EQ(c4, 3) << bad_chat;
  EXPECT_NE(bad_chat.find("conversation.json: messages[0].content: must be a string, got number"),
            std::string::npos) << bad_chat;
  // A conversation that leaves the 32-token context no room for a reply is refused, not cut.
  auto [c5, too_long] = forge_output(generate + "--user '" + std::string(40, 'x') + "'");
  EXPECT_EQ(c5, 3) << too_long;
  EXPECT_NE(too_long.find("tokens, but the model's context holds 32"), std::string::npos)
      << too_long;
}

// Packed SFT: short records, several to a row of the base's 32 positions, over four epochs. Killed
// after step 5 and resumed from step 4, the record cursor packs the same batches. Packing other
// data than JSONL records is a config error.
TEST_F(FinetuneRecipe, PackedSFTRunResumesExactlyAndPackingNeedsJSONL) {
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += R"({"prompt": "q)" + std::to_string(i) + R"(?", "completion": " )" +
            std::string(size_t(1 + i % 7), char('a' + i % 5)) + "\"}\n";
  const std::string jsonl = write_sft("short", text).string();
  const std::string packing = " finetune.packing=true";
  ASSERT_EQ(forge("train " + write_config("packed", 0, "", jsonl).string() + packing), 0);
  const std::vector<std::string> uninterrupted = lines(dir_ / "packed");
  ASSERT_EQ(uninterrupted.size(), 12u);
  fs::path killed = write_config("packed_killed", 0, "", jsonl);
  EXPECT_EQ(forge("train " + killed.string() + packing, "FORGE_TEST_SIGKILL_AFTER_STEP=5"),
            128 + SIGKILL);
  ASSERT_EQ(forge("train " + killed.string() + packing), 0);
  EXPECT_EQ(lines(dir_ / "packed_killed"), uninterrupted);

  auto [code, out] =
      forge_output("validate " + write_config("packed_records", 0).string() + packing);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("finetune.packing packs JSONL instruction records, but data.train '"),
            std::string::npos)
      << out;
}

TEST_F(FinetuneRecipe, EvalAndGenerateTakeALoRARunAndMergingKeepsTheLogits) {
  ASSERT_EQ(forge("train " + write_config("lora", 8).string()), 0);
  auto [code, out] = forge_output("eval " + (dir_ / "lora").string());
  ASSERT_EQ(code, 0) << out;
  const double final_val = losses(dir_ / "lora", "val").at(12);
  EXPECT_NE(out.find("val_loss " + g6(final_val) + "\n"), std::string::npos)
      << "val_loss " << g6(final_val) << " missing in:\n" << out;

  const std::string generate =
      "generate --checkpoint " + (dir_ / "lora").string() + " --prompt Love --max-new-tokens 20 "
      "--seed 1";
  auto [g1, text1] = forge_output(generate);
  auto [g2, text2] = forge_output(generate);
  EXPECT_EQ(g1, 0) << text1;
  EXPECT_EQ(g2, 0) << text2;
  EXPECT_EQ(text1, text2);
  EXPECT_EQ(text1.rfind("Love", 0), 0u) << text1;
  // --stop ends the sample after the first stop text it generates (the prompt does not count).
  const size_t space = text1.find(' ', 4);
  ASSERT_NE(space, std::string::npos) << text1;
  auto [g3, stopped] = forge_output(generate + " --stop ' '");
  EXPECT_EQ(g3, 0) << stopped;
  EXPECT_EQ(stopped, text1.substr(0, space + 1) + "\n");
  EXPECT_EQ(forge("inspect " + (dir_ / "lora").string()), 0);

  // The adapters are trained (B != 0), so merging them into the weights is a real change.
  LoadedGPT loaded = load_gpt(resolve_checkpoint(dir_ / "lora"));
  Tensor x = empty({1, 32}, DType::i64);
  for (int64_t t = 0; t < 32; ++t) x.data<int64_t>()[t] = (t * 37 + 11) % 256;
  NoGradGuard no_grad;
  std::vector<float> adapters = loaded.model->forward(x).to_vector<float>();
  nn::merge_lora(*loaded.model);
  std::vector<float> merged = loaded.model->forward(x).to_vector<float>();
  ASSERT_EQ(adapters.size(), merged.size());
  double max_diff = 0;
  for (size_t i = 0; i < merged.size(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(adapters[i] - merged[i])));
  EXPECT_LE(max_diff, 1e-5);
  LoadedGPT base = load_gpt(base_file_);
  std::vector<float> plain = base.model->forward(x).to_vector<float>();
  double moved = 0;
  for (size_t i = 0; i < plain.size(); ++i)
    moved = std::max(moved, double(std::fabs(plain[i] - merged[i])));
  EXPECT_GT(moved, 1e-3);  // the fine-tune changed the logits

  // A LoRA run is a starting point too: a plain GPT initialised from it holds the merged weights.
  Generator other_init(99);
  nn::GPT started(base.model->config(), other_init);
  load_initial_weights(started, resolve_checkpoint(dir_ / "lora"));
  std::vector<float> from_run = started.forward(x).to_vector<float>();
  double gap = 0;
  for (size_t i = 0; i < merged.size(); ++i)
    gap = std::max(gap, double(std::fabs(from_run[i] - merged[i])));
  EXPECT_LE(gap, 1e-5);
}

// A value printed by forge eval ("val_loss 2.71828"), or NaN when the line is missing.
static double printed_metric(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + " ");
  return at == std::string::npos ? std::nan("") : std::stod(out.substr(at + key.size() + 1));
}

// forge eval takes what export --merge writes (a checkpoint file, scored with the config stored in
// it), and a run directory that was moved is scored on its own checkpoints, not on those of the
// output_dir its config.yaml still names.
TEST_F(FinetuneRecipe, EvalTakesAMergedCheckpointFileAndAMovedRun) {
  ASSERT_EQ(forge("train " + write_config("lora", 8).string()), 0);
  auto [code, out] = forge_output("eval " + (dir_ / "lora").string());
  ASSERT_EQ(code, 0) << out;
  const double adapters = printed_metric(out, "val_loss");

  const std::string merged = (dir_ / "merged.h5").string();
  ASSERT_EQ(forge("export --checkpoint " + (dir_ / "lora").string() + " --merge --output " +
                  merged),
            0);
  auto [merged_code, merged_out] = forge_output("eval " + merged);
  ASSERT_EQ(merged_code, 0) << merged_out;
  EXPECT_NEAR(printed_metric(merged_out, "val_loss"), adapters, 1e-4) << merged_out;

  std::filesystem::rename(dir_ / "lora", dir_ / "moved");
  auto [moved_code, moved_out] = forge_output("eval " + (dir_ / "moved").string());
  ASSERT_EQ(moved_code, 0) << moved_out;
  EXPECT_EQ(printed_metric(moved_out, "val_loss"), adapters) << moved_out;
}

TEST_F(FinetuneRecipe, InitFromErrors) {
  fs::path cfg = write_config("err", 8);
  EXPECT_EQ(forge("train " + cfg.string() + " model.init_from=" + (dir_ / "nope").string()), 4);
  auto [code, out] = forge_output("train " + cfg.string() + " model.d_model=64");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("model.d_model: the config says 64, but model.init_from"), std::string::npos)
      << out;
  EXPECT_NE(out.find("trained with 32"), std::string::npos) << out;
  std::ofstream(dir_ / "no_init.yaml")
      << "recipe: finetune\noutput_dir: " << (dir_ / "no_init").string() << "\n"
      << "model: {arch: gpt, vocab_size: 256, context: 32, d_model: 32, n_layers: 2, "
         "n_heads: 2}\n"
      << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string() << "}\n";
  auto [no_init, no_init_out] = forge_output("train " + (dir_ / "no_init.yaml").string());
  EXPECT_EQ(no_init, 2) << no_init_out;
  EXPECT_NE(no_init_out.find("model.init_from"), std::string::npos) << no_init_out;
}

TEST_F(FinetuneRecipe, ValidateCountsTheAdapterParameters) {
  const int64_t r = 4;
  auto [code, out] = forge_output("validate " + write_config("v", int(r)).string());
  ASSERT_EQ(code, 0) << out;
  // r (in + out) for each Linear the default targets (*.attn.*, *.mlp.*) match, from the shapes
  // of the base's weights: attn.qkv, attn.proj, mlp.fc and mlp.proj, as before the default also
  // covered attention projected apart.
  LoadedGPT base = load_gpt(base_file_);
  int64_t want = 0, layers = 0;
  for (const NamedTensor& p : base.model->named_parameters()) {
    const std::string& n = p.name;
    const bool targeted = n.ends_with(".attn.qkv.weight") || n.ends_with(".attn.proj.weight") ||
                          (n.find(".mlp.") != std::string::npos && n.ends_with(".weight"));
    if (!targeted) continue;
    want += r * (p.tensor.size(0) + p.tensor.size(1));
    ++layers;
  }
  EXPECT_EQ(layers, 8);
  EXPECT_EQ(want, 4 * 2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32)));
  EXPECT_NE(out.find("# trainable parameters: " + std::to_string(want) + " ("), std::string::npos)
      << out;
  // lora.train_also adds the base parameters it names (the embeddings, the final norm), and a
  // pattern that names none is a config error before anything is loaded.
  const std::string config = write_config("v", int(r)).string();
  std::tie(code, out) =
      forge_output("validate " + config + " 'lora.train_also=[tok_emb.weight, \"ln_f.*\"]'");
  ASSERT_EQ(code, 0) << out;
  const int64_t also = 256 * 32 + 2 * 32;
  EXPECT_NE(out.find("# trainable parameters: " + std::to_string(want + also) + " ("),
            std::string::npos)
      << out;
  // Hugging Face's o_proj, down_proj are this base's attn.proj and mlp.proj; its q, k and v are
  // one matrix, which q_proj cannot name: a config error at lora.targets saying what to do.
  std::tie(code, out) = forge_output("validate " + config + " 'lora.targets=[o_proj, down_proj]'");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("# trainable parameters: " + std::to_string(4 * 2 * (32 + 32 + 128 + 32)) +
                     " ("),
            std::string::npos)
      << out;
  std::tie(code, out) = forge_output("validate " + config + " 'lora.targets=[q_proj, o_proj]'");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("lora.targets: 'q_proj' is Hugging Face's name for attn.q, but this model "
                     "projects q, k and v with one matrix ('blocks.0.attn.qkv'); set "
                     "model.fused_qkv: false to adapt them apart, or target attn.qkv"),
            std::string::npos)
      << out;
  std::tie(code, out) = forge_output("validate " + config + " 'lora.train_also=[tok_emb.wieght]'");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("lora.train_also: 'tok_emb.wieght' matches no parameter"), std::string::npos)
      << out;
  // Without adapters (rank 0) the keys that act on them would do nothing: refused.
  const std::string full = write_config("full", 0).string();
  std::tie(code, out) = forge_output("validate " + full + " lora.lr_ratio=16");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("lora.lr_ratio: sets the rate of the adapters' B, but lora.rank is 0"),
            std::string::npos)
      << out;
  std::tie(code, out) = forge_output("validate " + full + " 'lora.train_also=[\"ln_f.*\"]'");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("lora.train_also: names what trains beside the adapters, but lora.rank is 0"),
            std::string::npos)
      << out;
  EXPECT_EQ(forge_output("validate " + full).first, 0);
}

TEST(FinetuneSection, HoldsEveryKeyOfTheSection) {
  testing::expect_every_key_reaches_its_field<FinetuneSection>(
      finetune_section(),
      "recipe: finetune\nmodel: {init_from: base}\ndata: {tokenizer: bytes, train: sft.jsonl}\n",
      finetune_settings,
      {{{"finetune.end_of_text=<|im_end|>"},
        [](const FinetuneSection& s) { EXPECT_EQ(s.end_of_text, "<|im_end|>"); }},
       {{"finetune.records=lines"},
        [](const FinetuneSection& s) { EXPECT_EQ(s.records, RecordFormat::lines); }},
       {{"finetune.records=file"},
        [](const FinetuneSection& s) { EXPECT_EQ(s.records, RecordFormat::file); }},
       {{"finetune.packing=true"}, [](const FinetuneSection& s) { EXPECT_TRUE(s.packing); }}});
}

TEST(LoRASection, HoldsEveryKeyOfTheSection) {
  testing::expect_every_key_reaches_its_field<LoRASection>(
      lora_section(),
      "recipe: finetune\nmodel: {init_from: base}\ndata: {tokenizer: bytes, train: x.txt}\n"
      "lora: {rank: 4}\n",
      lora_settings,
      {{{"lora.rank=2"}, [](const LoRASection& s) { EXPECT_EQ(s.rank, 2); }},
       {{"lora.alpha=8"}, [](const LoRASection& s) { EXPECT_EQ(s.alpha, 8.0); }},
       {{"lora.dropout=0.05"}, [](const LoRASection& s) { EXPECT_EQ(s.dropout, 0.05); }},
       {{"lora.targets=[\"*.attn.qkv\"]"},
        [](const LoRASection& s) {
          EXPECT_EQ(s.targets, (std::vector<std::string>{"*.attn.qkv"}));
        }},
       {{"lora.rslora=true"}, [](const LoRASection& s) { EXPECT_TRUE(s.rslora); }},
       {{"lora.lr_ratio=16"}, [](const LoRASection& s) { EXPECT_EQ(s.lr_ratio, 16.0); }},
       {{"lora.train_also=[\"ln_f.*\"]"},
        [](const LoRASection& s) {
          EXPECT_EQ(s.train_also, (std::vector<std::string>{"ln_f.*"}));
        }}});
}

// lora.targets' default adapts attention and the MLP whether q, k and v are one matrix (the
// layers it adapted before) or three (the Llama family's layout, where attn.qkv matches nothing).
TEST(LoRASection, DefaultTargetsAdaptAttentionAndTheMLPFusedOrNot) {
  const RunConfig c = load_config_string(
      "recipe: finetune\nmodel: {init_from: base}\ndata: {tokenizer: bytes, train: x.txt}\n"
      "lora: {rank: 4}\n",
      "x.yaml", {}, ConfigFiles::skip);
  const LoRASection lora = lora_settings(c);
  auto adapted = [](const nn::GPTConfig& g, const nn::LoRAConfig& l) {
    Generator gen(0);
    nn::GPT m(g, gen);
    return nn::inject_lora(m, l, gen);
  };
  nn::GPTConfig fused = testing::tiny_gpt_config(true), apart = fused;
  apart.fused_qkv = false;
  apart.n_kv_heads = 1;
  std::vector<std::string> want_fused, want_apart;
  for (const std::string b : {"blocks.0.", "blocks.1."}) {
    for (const char* m : {"attn.qkv", "attn.proj", "mlp.gate", "mlp.up", "mlp.proj"})
      want_fused.push_back(b + m);
    for (const char* m : {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.gate", "mlp.up",
                          "mlp.proj"})
      want_apart.push_back(b + m);
  }
  EXPECT_EQ(adapted(fused, lora), want_fused);
  EXPECT_EQ(adapted(apart, lora), want_apart);
  EXPECT_EQ(nn::lora_parameter_count(apart, lora), 2 * 4 * ((16 + 16) + 2 * (16 + 8) +
                                                            (16 + 16) + 3 * (16 + 48)));
}

}  // namespace
}  // namespace forge
