// forge generate --prompts end to end on a briefly trained GPT run: one JSONL record a sample in the
// documented key order, the same records for any --batch-size and on stdout as in --output, the
// stop text ending samples, and the exit code of each bad input (a bad JSONL prompt line names
// file:line and the field on one line; sizes that cannot fit are refused before the model loads;
// a repeated option is refused); a padded vocabulary's extra ids are never sampled.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>

#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::write_file;

class GenerateCli : public testing::RecipeTest {
 protected:
  void SetUp() override {
    RecipeTest::SetUp();
    std::ofstream(dir_ / "run.yaml")
        << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << run().string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 32, d_model: 16, n_layers: 1, "
           "n_heads: 2}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 1.0e-2}\n"
        << "train: {batch_size: 4, max_steps: 30, eval_every: 0, save_every: 30, "
           "sample_tokens: 1}\n";
    ASSERT_EQ(forge("train " + (dir_ / "run.yaml").string()), 0);
    write_file(dir_ / "prompts.txt", "ROMEO:\nJULIET:\n\nTo be, or not\n");
  }

  fs::path run() const { return dir_ / "run"; }

  // `forge generate --checkpoint RUN ARGS`: the exit code, stdout and stderr.
  struct Result {
    int code;
    std::string out, err;
  };
  Result generate(const std::string& args) {
    const std::string cmd = std::string(FORGE_BINARY) + " generate --checkpoint " +
                            run().string() + " " + args + " >" + (dir_ / "out").string() +
                            " 2>" + (dir_ / "err").string();
    const int status = std::system(cmd.c_str());
    return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status),
            read_file(dir_ / "out"), read_file(dir_ / "err")};
  }
};

std::vector<nlohmann::ordered_json> records(const std::string& jsonl) {
  std::vector<nlohmann::ordered_json> out;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

TEST_F(GenerateCli, WritesOneRecordPerSampleWhateverTheBatchSize) {
  const std::string sampling = "--prompts " + (dir_ / "prompts.txt").string() +
                               " --num-samples 2 --max-new-tokens 8 --seed 5";
  const fs::path file = dir_ / "samples.jsonl";
  const Result to_file = generate(sampling + " --batch-size 4 --output " + file.string());
  ASSERT_EQ(to_file.code, 0) << to_file.err;
  EXPECT_TRUE(to_file.out.empty());
  EXPECT_NE(to_file.err.find("6 samples of 3 prompts, 48 tokens"), std::string::npos)
      << to_file.err;
  const std::string jsonl = read_file(file);
  const std::vector<nlohmann::ordered_json> rows = records(jsonl);
  ASSERT_EQ(rows.size(), 6u);
  const std::vector<std::string> prompts = {"ROMEO:", "JULIET:", "To be, or not"};
  const std::vector<std::string> keys = {"prompt", "prompt_index", "sample_index", "completion",
                                         "tokens", "logprob", "finished"};
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<std::string> got;
    for (const auto& item : rows[r].items()) got.push_back(item.key());
    EXPECT_EQ(got, keys);
    EXPECT_EQ(rows[r]["prompt_index"], r / 2);
    EXPECT_EQ(rows[r]["sample_index"], r % 2);
    EXPECT_EQ(rows[r]["prompt"], prompts[r / 2]);
    EXPECT_EQ(rows[r]["tokens"].size(), 8u);
    EXPECT_FALSE(rows[r]["finished"]);
    EXPECT_LT(rows[r]["logprob"].get<double>(), 0.0);
  }
  EXPECT_NE(rows[0]["tokens"], rows[1]["tokens"]);
  // One row at a time, printed to stdout: the same samples (log-probabilities up to rounding).
  const Result one = generate(sampling + " --batch-size 1");
  ASSERT_EQ(one.code, 0) << one.err;
  const std::vector<nlohmann::ordered_json> again = records(one.out);
  ASSERT_EQ(again.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(again[r]["tokens"], rows[r]["tokens"]) << r;
    EXPECT_EQ(again[r]["completion"], rows[r]["completion"]) << r;
    EXPECT_NEAR(again[r]["logprob"].get<double>(), rows[r]["logprob"].get<double>(), 1e-4) << r;
  }

  // The stop text, two tokens here, ends a sample once generated (the model has learned spaces).
  const Result stopped = generate("--prompts " + (dir_ / "prompts.txt").string() +
                                  " --num-samples 2 --seed 5 --stop 'e ' --max-new-tokens 19");
  ASSERT_EQ(stopped.code, 0) << stopped.err;
  int finished = 0;
  const std::vector<int64_t> stop = {'e', ' '};
  for (const auto& row : records(stopped.out)) {
    const std::vector<int64_t> tokens = row["tokens"];
    const auto first = std::search(tokens.begin(), tokens.end(), stop.begin(), stop.end());
    if (row["finished"]) {
      ++finished;
      EXPECT_EQ(first, tokens.end() - 2);
    } else {
      EXPECT_EQ(first, tokens.end());
      EXPECT_EQ(tokens.size(), 19u);
    }
  }
  EXPECT_LT(finished, 6);
  EXPECT_GT(finished, 0);
  EXPECT_NE(stopped.err.find(std::to_string(finished) + " ended at the stop text"),
            std::string::npos)
      << stopped.err;
}

TEST_F(GenerateCli, BadInputsExitWithTheirCodes) {
  write_file(dir_ / "bad.jsonl", "{\"prompt\": \"a\"}\n{\"promt\": \"b\"}\n");
  const Result bad = generate("--prompts " + (dir_ / "bad.jsonl").string());
  EXPECT_EQ(bad.code, 3);
  EXPECT_EQ(bad.err, "forge: data error: " + (dir_ / "bad.jsonl").string() +
                         ":2: unknown field \"promt\" (a prompt record has \"prompt\")\n");
  const std::string prompts = " --prompts " + (dir_ / "prompts.txt").string();
  EXPECT_EQ(generate("--prompts " + (dir_ / "missing.txt").string()).code, 3);
  EXPECT_EQ(generate("--num-samples 2").code, 2);
  EXPECT_EQ(generate("--prompt x" + prompts).code, 2);
  EXPECT_EQ(generate(prompts + " --num-samples 0").code, 2);
  const Result too_many = generate(prompts + " --max-new-tokens 8 --num-samples 4294967296");
  EXPECT_EQ(too_many.code, 2);
  EXPECT_NE(too_many.err.find("--num-samples 4294967296"), std::string::npos) << too_many.err;
  EXPECT_EQ(generate(prompts + " --batch-size 0").code, 2);
  EXPECT_EQ(generate(prompts + " --output " + (dir_ / "no" / "such.jsonl").string()).code, 2);
  const Result too_long = generate(prompts + " --max-new-tokens 20");  // 13 + 20 > context 32
  EXPECT_EQ(too_long.code, 2);
  EXPECT_NE(too_long.err.find("prompt 2 is 13 tokens"), std::string::npos) << too_long.err;
  // --prompt keeps printing the prompt and its sample, sliding past the context.
  const Result single = generate("--prompt ROMEO: --max-new-tokens 40");
  EXPECT_EQ(single.code, 0) << single.err;
  EXPECT_EQ(single.out.rfind("ROMEO:", 0), 0u);
}

// Sizes that cannot fit are refused naming the flag before the model loads: --num-samples whose
// completions outgrow the machine's memory and a --batch-size whose batch does; neither allocates
// or loops first.
TEST_F(GenerateCli, SizesThatCannotFitAreRefusedBeforeTheModelLoads) {
  const std::string prompts = " --prompts " + (dir_ / "prompts.txt").string();
  const auto start = std::chrono::steady_clock::now();
  const Result huge = generate(prompts + " --max-new-tokens 8 --num-samples 1000000000");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_NE(huge.err.find("--num-samples 1000000000 completions need at least"), std::string::npos)
      << huge.err;
  // About a thousandth of the memory in completions (about 200 bytes each) fits; a batch of them
  // all holds a key-value cache and logits (about 2 KB a row) that does not.
  const std::optional<MemoryLimit> memory = machine_memory();
  ASSERT_TRUE(memory);
  const int64_t samples = int64_t(memory->bytes / 3 / 1000);
  const Result batch = generate(prompts + " --max-new-tokens 8 --num-samples " +
                                std::to_string(samples) + " --batch-size 1000000000");
  EXPECT_EQ(batch.code, 2) << batch.err;
  EXPECT_NE(batch.err.find("generate: --batch-size 1000000000: the completions and a batch of"),
            std::string::npos)
      << batch.err;
}

// A model whose vocabulary (320) is padded past its tokenizer's (bytes, 256) never samples an id
// the tokenizer cannot decode, whatever the temperature, alone or batched.
TEST_F(GenerateCli, APaddedVocabularySamplesOnlyTheTokenizersIds) {
  ASSERT_EQ(forge("train " + (dir_ / "run.yaml").string() + " model.vocab_size=320 output_dir=" +
                  (dir_ / "padded").string() + " train.max_steps=2 train.save_every=2"),
            0);
  const std::string checkpoint = std::string(FORGE_BINARY) + " generate --checkpoint " +
                                 (dir_ / "padded").string();
  for (const std::string& args :
       {std::string(" --prompt ROMEO: --max-new-tokens 60 --temperature 3"),
        " --prompts " + (dir_ / "prompts.txt").string() +
            " --max-new-tokens 16 --num-samples 8 --temperature 3 --top-k 0"}) {
    const int status = std::system((checkpoint + args + " >" + (dir_ / "out").string() + " 2>" +
                                    (dir_ / "err").string())
                                       .c_str());
    ASSERT_EQ(WEXITSTATUS(status), 0) << args << "\n" << read_file(dir_ / "err");
  }
  for (const nlohmann::ordered_json& row : records(read_file(dir_ / "out")))
    for (int64_t token : row["tokens"]) EXPECT_LT(token, 256);
}

// An option given twice is refused naming it, not silently replaced by the second.
TEST_F(GenerateCli, RepeatedOptionsAreRefused) {
  const std::string prompts = " --prompts " + (dir_ / "prompts.txt").string();
  const Result prompt = generate("--prompt a --prompt b");
  EXPECT_EQ(prompt.code, 2);
  EXPECT_EQ(prompt.err, "forge: usage error: generate: option --prompt given twice\n");
  const Result output = generate(prompts + " --output " + (dir_ / "x.jsonl").string() +
                                 " --output=" + (dir_ / "y.jsonl").string());
  EXPECT_EQ(output.code, 2);
  EXPECT_NE(output.err.find("option --output given twice"), std::string::npos) << output.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.jsonl") || fs::exists(dir_ / "y.jsonl"));
}

}  // namespace
}  // namespace forge
