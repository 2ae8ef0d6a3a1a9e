// The tokenizer a hub directory gets (formats/hf_model.cpp): tokenizer.json, else SentencePiece's
// tokenizer.model, else vocab.json + merges.txt, said by forge inspect and used by forge generate
// and tokenize; and the hub's tokenizer files, tokenizer_config.json and generation_config.json
// carried over by `forge export --format hf`. The directories are the tiny Llama fixture with its
// vocabulary widened to the tokenizer's (bpe.model's 1000 pieces, sp_bpe's 1565 tokens).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "formats/hf_model.h"
#include "nn/generate.h"
#include "runtime/components.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kGolden = fs::path(FORGE_SOURCE_DIR) / "tests/golden";
constexpr int64_t kPieces = 1000;

class HFTokenizers : public testing::RecipeTest {
 protected:
  using Edit = std::function<void(const std::string& name, std::vector<float>& rows, int64_t width)>;
  // dir/model.safetensors with `edit` applied to every tensor's values (it may add rows).
  static void rewrite_weights(const fs::path& dir, const Edit& edit) {
    const SafetensorsFile weights(dir / "model.safetensors");
    NamedTensors tensors;
    for (const SafetensorsEntry& e : weights.entries()) {
      const Tensor t = weights.read_f32(e.name);
      std::vector<float> values = t.to_vector<float>();
      const int64_t width = t.size(t.dim() - 1);
      edit(e.name, values, width);
      Shape shape = t.shape();
      shape[0] = int64_t(values.size()) / (t.dim() == 2 ? width : 1);
      tensors.push_back({e.name, from_vector(values, shape)});
    }
    write_safetensors(dir / "model.safetensors", tensors, {}, ExitCode::checkpoint);
  }
  // tests/golden/hf/llama with `vocab` token rows (row i a copy of row i mod 300 of the 300 it
  // has) and config.json saying so.
  fs::path llama_with_vocabulary(const std::string& name, int64_t vocab) {
    const fs::path dir = dir_ / name;
    fs::copy(kGolden / "hf/llama", dir);
    rewrite_weights(dir, [&](const std::string& tensor, std::vector<float>& rows, int64_t width) {
      if (tensor != "model.embed_tokens.weight" && tensor != "lm_head.weight") return;
      const size_t had = rows.size();
      rows.resize(size_t(vocab * width));
      for (size_t k = had; k < rows.size(); ++k) rows[k] = rows[k % had];
    });
    json config = json::parse(testing::read_file(dir / "config.json"));
    config["vocab_size"] = vocab;
    testing::write_file(dir / "config.json", config.dump());
    return dir;
  }
  // The Llama fixture carrying bpe.model as its tokenizer.model, with the settings files a hub
  // Llama 2 has beside it.
  fs::path sentencepiece_llama() {
    const fs::path dir = llama_with_vocabulary("spm_llama", kPieces);
    fs::copy_file(kGolden / "sentencepiece/bpe.model", dir / "tokenizer.model");
    testing::write_file(dir / "tokenizer_config.json",
                        R"({"add_bos_token": true, "add_eos_token": false})");
    testing::write_file(dir / "special_tokens_map.json", R"({"bos_token": "<s>"})");
    testing::write_file(dir / "generation_config.json", R"({"bos_token_id": 1})");
    return dir;
  }
};

TEST_F(HFTokenizers, TokenizerModelIsTheHubDirectorysTokenizer) {
  const fs::path dir = sentencepiece_llama();
  EXPECT_EQ(stored_config(dir).data.tokenizer, dir.string());
  EXPECT_NE(hf_load_summary(dir).find("tokenizer the directory's tokenizer.model (SentencePiece)"),
            std::string::npos)
      << hf_load_summary(dir);
  auto [code, out] = forge_output("inspect " + dir.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("tokenizer the directory's tokenizer.model (SentencePiece)"),
            std::string::npos)
      << out;
  // generate encodes the prompt and decodes the continuation with it, keeping the space of a
  // continuation that starts with "▁" (which decoding it alone drops): the head's row of "▁" is
  // set to give the prompt's next position twice the largest logit magnitude, so "▁" comes next.
  const auto tok = make_tokenizer(dir.string());
  const std::vector<int32_t> prompt = tok->encode("Hello");
  std::vector<float> logits;
  {
    NoGradGuard no_grad;
    Tensor x = empty({1, int64_t(prompt.size())}, DType::i64);
    for (size_t i = 0; i < prompt.size(); ++i) x.data<int64_t>()[i] = prompt[i];
    logits = load_gpt(resolve_checkpoint(dir)).model->forward(x).to_vector<float>();
  }
  logits.erase(logits.begin(), logits.end() - kPieces);  // the last position's
  size_t big = 0;
  for (size_t v = 0; v < logits.size(); ++v)
    if (std::fabs(logits[v]) > std::fabs(logits[big])) big = v;
  ASSERT_GT(std::fabs(logits[big]), 0.0f);
  const int64_t meta = 889;  // "▁" in bpe.model
  rewrite_weights(dir, [&](const std::string& tensor, std::vector<float>& rows, int64_t width) {
    if (tensor != "lm_head.weight") return;
    const float scale = logits[big] > 0 ? 2.0f : -2.0f;
    for (int64_t c = 0; c < width; ++c)
      rows[size_t(meta * width + c)] = scale * rows[big * size_t(width) + size_t(c)];
  });
  nn::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.vocab_limit = kPieces;
  greedy.max_new_tokens = 4;
  std::vector<int32_t> ids = prompt;
  const std::vector<int64_t> continuation =
      nn::generate(*load_gpt(resolve_checkpoint(dir)).model, {ids.begin(), ids.end()}, greedy);
  ASSERT_EQ(continuation[0], meta);
  ids.insert(ids.end(), continuation.begin(), continuation.end());
  const std::string expected = "Hello" + tok->decode(ids).substr(tok->decode(prompt).size());
  EXPECT_EQ(expected.substr(0, 6), "Hello ") << expected;
  std::tie(code, out) = forge_output("generate --checkpoint " + dir.string() +
                                     " --prompt Hello --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, expected + "\n");
  // "Hello" is "▁H" "ell" "o" in bpe.model; GPT-2's files beside it lose to it.
  fs::copy_file(kGolden / "hf/gpt2/vocab.json", dir / "vocab.json");
  fs::copy_file(kGolden / "hf/gpt2/merges.txt", dir / "merges.txt");
  std::tie(code, out) = forge_output("tokenize --tokenizer " + dir.string() + " --text Hello");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("360 458 892"), std::string::npos) << out;
}

// A hub Llama with tokenizer.json beside tokenizer.model (as Llama 2's repositories have both):
// tokenizer.json is the tokenizer, with the ids Hugging Face's library gives (h-tokref's sp_bpe
// fixture and its expected ids), and both files go along with an export.
TEST_F(HFTokenizers, TokenizerJsonComesFirst) {
  const fs::path fixture = kGolden / "tokenizers/sp_bpe";
  const json first = json::parse(testing::read_file(fixture / "expected.jsonl").substr(
      0, testing::read_file(fixture / "expected.jsonl").find('\n')));
  const fs::path dir = llama_with_vocabulary("json_llama", 1565);
  fs::copy_file(fixture / "tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(kGolden / "sentencepiece/bpe.model", dir / "tokenizer.model");
  EXPECT_EQ(stored_config(dir).data.tokenizer, dir.string());
  auto [code, out] = forge_output("inspect " + dir.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("; tokenizer the directory's tokenizer.json\n"), std::string::npos) << out;
  std::tie(code, out) = forge_output("tokenize --tokenizer " + dir.string() + " --text \"" +
                                     first["text"].get<std::string>() + "\"");
  EXPECT_EQ(code, 0) << out;
  std::string want;
  for (int64_t id : first["ids"]) want += (want.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(out, want + "\n");
  std::tie(code, out) = forge_output("generate --checkpoint " + dir.string() +
                                     " --prompt Hello --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(code, 0) << out;
  std::tie(code, out) = forge_output("export --checkpoint " + dir.string() +
                                     " --format hf --output " + (dir_ / "out").string());
  ASSERT_EQ(code, 0) << out;
  for (const char* file : {"tokenizer.json", "tokenizer.model"})
    EXPECT_EQ(testing::read_file(dir_ / "out" / file), testing::read_file(dir / file)) << file;
}

TEST_F(HFTokenizers, ExportCarriesTheHubsTokenizerFiles) {
  const fs::path dir = sentencepiece_llama();
  const auto [code, out] = forge_output("export --checkpoint " + dir.string() +
                                        " --format hf --output " + (dir_ / "out").string());
  ASSERT_EQ(code, 0) << out;
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json"})
    EXPECT_EQ(testing::read_file(dir_ / "out" / file), testing::read_file(dir / file)) << file;
  EXPECT_FALSE(fs::exists(dir_ / "out/vocab.json"));
  EXPECT_EQ(make_tokenizer((dir_ / "out").string())->encode("Hello"),
            (std::vector<int32_t>{360, 458, 892}));
}

// A run whose data.tokenizer names a .model file exports that file as tokenizer.model.
TEST_F(HFTokenizers, ExportWritesAModelFileAsTokenizerModel) {
  const fs::path model = dir_ / "spm/llama2.model";
  fs::create_directories(model.parent_path());
  fs::copy_file(kGolden / "sentencepiece/bpe.model", model);
  std::ofstream(dir_ / "run.yaml")
      << "recipe: gpt_pretrain\nseed: 1\noutput_dir: " << (dir_ / "run").string()
      << "\nmodel: {arch: gpt, vocab_size: " << kPieces
      << ", context: 16, d_model: 16, n_layers: 1, n_heads: 2, norm: rmsnorm, position: rotary, "
         "mlp: swiglu, bias: false}\ndata: {tokenizer: "
      << model.string() << ", train: " << (dir_ / "corpus.txt").string()
      << "}\ntrain: {batch_size: 2, max_steps: 1, sample_tokens: 1}\n";
  ASSERT_EQ(forge("train " + (dir_ / "run.yaml").string()), 0);
  const auto [code, out] = forge_output("export --checkpoint " + (dir_ / "run").string() +
                                        " --format hf --output " + (dir_ / "out").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(testing::read_file(dir_ / "out/tokenizer.model"), testing::read_file(model));
  EXPECT_EQ(json::parse(testing::read_file(dir_ / "out/config.json"))["bos_token_id"], 1);
}

}  // namespace
}  // namespace forge
