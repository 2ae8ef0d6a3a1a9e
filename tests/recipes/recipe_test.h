// What recipe tests share: twelve SFT records, a fresh directory per test holding the first 40 KB
// of Tiny Shakespeare as corpus.txt, the forge binary run as a user would run it (with or without
// its output, in bf16 on any CPU), the step-by-step numbers of a run's train lines and the tensors
// of its latest checkpoint (for comparing an interrupted run with an uninterrupted one).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernels/matmul.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/metrics.h"

namespace forge::testing {

// The environment of a train.precision bf16 run: it runs natively where the CPU multiplies bf16
// and emulated elsewhere (the same products, f32 sums in another order), so CI checks the bf16
// path on every CPU.
inline std::string bf16_env() { return kernels::bf16_native() ? "" : "FORGE_BF16_EMULATION=1"; }

// Twelve short instruction records (prompt + completion + "%\n" fit the context of 32 + 1).
inline constexpr const char* kSFT =
    R"({"prompt": "Capital of France?", "completion": " Paris"}
{"prompt": "Capital of Italy?", "completion": " Rome"}
{"prompt": "Capital of Spain?", "completion": " Madrid"}
{"prompt": "Capital of Peru?", "completion": " Lima"}
{"prompt": "Opposite of up?", "completion": " down"}
{"prompt": "Opposite of hot?", "completion": " cold"}
{"prompt": "Opposite of old?", "completion": " new"}
{"prompt": "Opposite of wet?", "completion": " dry"}
{"prompt": "Colour of snow?", "completion": " white"}
{"prompt": "Colour of grass?", "completion": " green"}
{"prompt": "Colour of sky?", "completion": " blue"}
{"prompt": "Colour of coal?", "completion": " black"}
)";

class RecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("forge_recipe_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ifstream in("data/samples/tinyshakespeare.txt", std::ios::binary);
    std::string text(40000, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    std::ofstream(dir_ / "corpus.txt", std::ios::binary) << text;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A tiny byte-level GPT trained 20 steps on corpus.txt into <dir>/base (config <dir>/base.yaml):
  // the pretrained model that fine-tuning recipes start from.
  void train_tiny_base(int64_t context) {
    std::ofstream(dir_ / "base.yaml")
        << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << (dir_ / "base").string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: " << context
        << ", d_model: 32, n_layers: 2, n_heads: 2, dropout: 0.0}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 20, log_every: 10, sample_tokens: 1}\n";
    ASSERT_EQ(forge("train " + (dir_ / "base.yaml").string()), 0);
  }

  // n pairs: a prompt of 8 to 15 corpus bytes, and two responses that share a few filler words and
  // end in a good word (chosen) or a bad one (rejected), drawn from a fixed LCG.
  static void write_word_pairs(const std::filesystem::path& file, int n, uint64_t seed) {
    const std::vector<std::string> filler = {"the", "a", "and", "of", "my", "to", "in", "it"};
    const std::vector<std::string> good = {"love", "joy", "sweet", "fair"};
    const std::vector<std::string> bad = {"death", "woe", "hate", "foul"};
    uint64_t state = seed;
    auto next = [&](uint64_t k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % k;
    };
    std::ifstream in("data/samples/tinyshakespeare.txt", std::ios::binary);
    std::string corpus(20000, '\0');
    in.read(corpus.data(), std::streamsize(corpus.size()));
    std::ofstream out(file);
    for (int i = 0; i < n; ++i) {
      const uint64_t at = next(19000);
      const uint64_t len = 8 + next(8);
      std::string shared;
      for (uint64_t w = 0, words = 1 + next(3); w < words; ++w) shared += filler[next(8)] + " ";
      const std::string g = good[next(4)];
      const std::string b = bad[next(4)];
      out << nlohmann::json({{"prompt", corpus.substr(at, len)},
                             {"chosen", shared + g},
                             {"rejected", shared + b}})
                 .dump()
          << "\n";
    }
  }

  // n prompts of 6 to 13 bytes of corpus.txt, from a fixed LCG (ppo's and grpo's).
  std::vector<std::string> corpus_prompts(int n, uint64_t seed) const {
    std::ifstream in(dir_ / "corpus.txt", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string corpus = text.str();
    uint64_t state = seed;
    auto next = [&](uint64_t k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % k;
    };
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      const uint64_t at = next(30000);
      out.push_back(corpus.substr(at, 6 + next(8)));
    }
    return out;
  }

  // Runs the forge binary; returns its exit code (128 + signal when killed).
  static int forge(const std::string& args, const std::string& env = "") {
    std::string cmd = env + " " + FORGE_BINARY + " " + args + " >/dev/null 2>&1";
    int status = std::system(cmd.c_str());
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
  }

  // Runs the forge binary; its exit code (128 + signal when killed) and stdout + stderr.
  std::pair<int, std::string> forge_output(const std::string& args, const std::string& env = "") {
    const std::filesystem::path out = dir_ / "forge.out";
    std::string cmd = env + " " + FORGE_BINARY + " " + args + " >" + out.string() + " 2>&1";
    int status = std::system(cmd.c_str());
    int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::ifstream in(out, std::ios::binary);
    return {code, std::string(std::istreambuf_iterator<char>(in), {})};
  }

  // Every tensor of a run's latest checkpoint, by name.
  static std::map<std::string, std::vector<float>> saved_tensors(const std::filesystem::path& run) {
    const std::filesystem::path file = resolve_checkpoint(run);
    CheckpointData data = load_checkpoint(file, read_checkpoint_info(file).model);
    std::map<std::string, std::vector<float>> out;
    for (const NamedTensor& t : data.model) out[t.name] = t.tensor.to_vector<float>();
    return out;
  }

  // `key` of each of a run's `split` lines, by step.
  static std::map<int64_t, double> losses(const std::filesystem::path& run,
                                          const std::string& split,
                                          const std::string& key = "loss") {
    std::map<int64_t, double> out;
    for (const auto& r : read_metrics(run / "metrics.jsonl"))
      if (r.split == split) out[r.step] = *r.number(key);
    return out;
  }

  // A value as `forge eval` prints it.
  static std::string g6(double x) {
    char s[32];
    std::snprintf(s, sizeof s, "%.6g", x);
    return s;
  }

  // "step key1 key2 ..." of each train line; elapsed_s and tokens_per_s differ between runs, so
  // callers name the keys that must not.
  static std::vector<std::string> train_lines(const std::filesystem::path& run,
                                              const std::vector<std::string>& keys) {
    std::vector<std::string> lines;
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto rec = parse_metrics_line(line);
      if (!rec || rec->split != "train") continue;
      std::string out = std::to_string(rec->step);
      for (const std::string& key : keys) {
        out += ' ';
        out += std::to_string(*rec->number(key));
      }
      lines.push_back(out);
    }
    return lines;
  }

  // The bf16 half of a recipe's kill-and-resume test: `train(name)` is the forge command line
  // (without the env) that trains run `name` under dir_; it runs as "fp32", then with the `bf16`
  // overrides as "bf16" and as "bf16_killed", killed after step `kill_after` and resumed. The bf16
  // run's `steps` train lines (`keys`) must differ from fp32's (its products were rounded) and the
  // resumed run's lines and checkpoint tensors equal the uninterrupted one's, bitwise.
  void expect_bf16_differs_and_resumes_exactly(
      const std::function<std::string(const std::string&)>& train, const std::string& bf16,
      const std::vector<std::string>& keys, size_t steps, int kill_after) {
    const std::string env = bf16_env();
    ASSERT_EQ(forge(train("fp32")), 0);
    ASSERT_EQ(forge(train("bf16") + bf16, env), 0);
    const std::string killed = train("bf16_killed") + bf16;
    EXPECT_EQ(forge(killed, env + " FORGE_TEST_SIGKILL_AFTER_STEP=" + std::to_string(kill_after)),
              128 + SIGKILL);
    ASSERT_EQ(forge(killed, env), 0);
    const std::vector<std::string> narrow = train_lines(dir_ / "bf16", keys);
    ASSERT_EQ(narrow.size(), steps);
    EXPECT_NE(train_lines(dir_ / "fp32", keys), narrow);  // the products were rounded
    EXPECT_EQ(train_lines(dir_ / "bf16_killed", keys), narrow);
    EXPECT_EQ(saved_tensors(dir_ / "bf16_killed"), saved_tensors(dir_ / "bf16"));  // bitwise
  }

  std::filesystem::path dir_;
};

}  // namespace forge::testing
