// Hub directories of the Llama family (formats/hf_model.h) against the PyTorch goldens of
// tests/golden/make_llama_goldens.py: Llama (F32, grouped-query, linear rope scaling), Qwen2 (BF16
// in two shards, tied, q/k/v biases), Mistral (F16, multi-head, head_dim != hidden / heads) and a
// Llama 3 rope scaling give PyTorch's logits and greedy continuations; the commands take such a
// directory; and every broken one (config.json, the shard index, the shards) is exit 4 naming the
// file and the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/durable_file.h"
#include "formats/hf_model.h"
#include "nn/generate.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kGolden = fs::path(FORGE_SOURCE_DIR) / "tests/golden/hf";
constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// A fixture's logits on its golden ids within 1e-4 of PyTorch's, and its greedy continuation of
// the first row equal to PyTorch's, token for token.
void expect_pytorchs_outputs(const std::string& fixture) {
  const testing::Goldens g = testing::load_goldens("llama.txt");
  auto values = [&](const std::string& key) -> const std::vector<double>& {
    return testing::golden_values(g, fixture + "." + key, "llama.txt");
  };
  LoadedGPT loaded = load_gpt(resolve_checkpoint(kGolden / fixture));
  const std::vector<double>& ids = values("ids");
  Tensor x = empty({2, int64_t(ids.size()) / 2}, DType::i64);
  for (size_t i = 0; i < ids.size(); ++i) x.data<int64_t>()[i] = int64_t(ids[i]);
  std::vector<float> logits;
  {
    NoGradGuard no_grad;
    logits = loaded.model->forward(x).to_vector<float>();
  }
  const std::vector<double>& want = values("logits");
  ASSERT_EQ(logits.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(double(logits[i]) - want[i]));
  EXPECT_LE(worst, 1e-4) << fixture;

  nn::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = int64_t(values("greedy").size());
  const std::vector<int64_t> prompt(ids.begin(), ids.begin() + x.size(1));
  const std::vector<int64_t> got = nn::generate(*loaded.model, prompt, greedy);
  const std::vector<int64_t> expected(values("greedy").begin(), values("greedy").end());
  EXPECT_EQ(got, expected) << fixture;
}

class HFLlama : public testing::RecipeTest {
 protected:
  // A copy of a fixture to break.
  fs::path copy_of(const std::string& fixture) {
    const fs::path dir = dir_ / (fixture + "_" + std::to_string(copies_++));
    fs::copy(kGolden / fixture, dir);
    return dir;
  }
  static void edit_json(const fs::path& file, const std::function<void(json&)>& edit) {
    json j = json::parse(testing::read_file(file));
    edit(j);
    testing::write_file(file, j.dump());
  }
  // The safetensors header of `file` edited in place; the data stays as it is.
  static void edit_header(const fs::path& file, const std::function<void(json&)>& edit) {
    const std::string bytes = testing::read_file(file);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    json header = json::parse(bytes.substr(8, n));
    edit(header);
    const std::string text = header.dump();
    const uint64_t size = text.size();
    std::string out(reinterpret_cast<const char*>(&size), 8);
    testing::write_file(file, out + text + bytes.substr(8 + n));
  }
  // Exit 4 from the reader and from forge inspect, in one line holding `file` and `part`.
  void expect_refused(const fs::path& dir, const fs::path& file, const std::string& part) {
    testing::expect_error(ExitCode::checkpoint, part, [&] { read_hf_info(dir); });
    const auto [code, output] = forge_output("inspect " + dir.string());
    EXPECT_EQ(code, 4) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
    EXPECT_NE(output.find(file.string() + ": "), std::string::npos) << output;
    EXPECT_NE(output.find(part), std::string::npos) << output;
  }
  int copies_ = 0;
};

TEST_F(HFLlama, MistralF16MultiHeadGivesPyTorchsLogitsAndContinuation) {
  expect_pytorchs_outputs("mistral");
}

TEST_F(HFLlama, Llama3RopeScalingGivesPyTorchsLogitsAndContinuation) {
  expect_pytorchs_outputs("llama3_scaled");
}

TEST_F(HFLlama, LlamaF32GroupedQueryGivesPyTorchsLogitsAndContinuation) {
  expect_pytorchs_outputs("llama");
}

TEST_F(HFLlama, Qwen2Bf16ShardedGivesPyTorchsLogitsAndContinuation) {
  expect_pytorchs_outputs("qwen2");
}

// What config.json becomes in Forge's keys, with transformers' defaults for what it leaves out.
TEST_F(HFLlama, ConfigJsonBecomesGptOptions) {
  const RunConfig llama = stored_config(kGolden / "llama");
  EXPECT_EQ(llama.recipe, "gpt_pretrain");
  const ModelConfig& m = llama.model;
  EXPECT_EQ(m.arch, "gpt");
  EXPECT_EQ(m.norm, "rmsnorm");
  EXPECT_EQ(m.position, "rotary");
  EXPECT_EQ(m.mlp, "swiglu");
  EXPECT_FALSE(m.bias);
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_FALSE(m.fused_qkv);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.vocab_size, 300);
  EXPECT_EQ(m.context, 64);
  EXPECT_EQ(m.d_model, 32);
  EXPECT_EQ(m.n_heads, 4);
  EXPECT_EQ(m.n_kv_heads, 2);
  EXPECT_EQ(m.head_dim, 8);
  EXPECT_EQ(m.ffn_hidden, 40);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_EQ(m.rope_scaling, "linear");
  EXPECT_EQ(m.rope_factor, 2.0);
  // No tokenizer Forge reads: bytes, which the note says.
  EXPECT_EQ(llama.data.tokenizer, "bytes");
  EXPECT_NE(hf_load_summary(kGolden / "llama").find("tokenizer bytes"), std::string::npos);

  const RunConfig qwen2 = stored_config(kGolden / "qwen2");
  EXPECT_TRUE(qwen2.model.qkv_bias);
  EXPECT_TRUE(qwen2.model.tie_embeddings);
  EXPECT_EQ(qwen2.model.rope_theta, 1e6);
  EXPECT_EQ(qwen2.model.rope_scaling, "none");
  EXPECT_EQ(qwen2.data.tokenizer, (kGolden / "qwen2").string());
  EXPECT_EQ(hf_load_summary(kGolden / "qwen2"),
            "weights BF16 in 2 files, 46.3 KiB stored, 92.6 KiB as f32 once loaded; tokenizer "
            "the directory's tokenizer.json");

  const ModelConfig mistral = stored_config(kGolden / "mistral").model;
  EXPECT_EQ(mistral.n_kv_heads, 4);
  EXPECT_EQ(mistral.head_dim, 12);

  const ModelConfig scaled = stored_config(kGolden / "llama3_scaled").model;
  EXPECT_EQ(scaled.head_dim, 16);  // hidden_size / num_attention_heads
  EXPECT_EQ(scaled.rope_scaling, "llama3");
  EXPECT_EQ(scaled.rope_factor, 8.0);
  EXPECT_EQ(scaled.rope_low_freq_factor, 1.0);
  EXPECT_EQ(scaled.rope_high_freq_factor, 4.0);
  EXPECT_EQ(scaled.rope_original_context, 64);

  // Absent keys take transformers' defaults: Mistral's sliding window is 4096, longer than this
  // context; "default" rope scaling is none.
  const fs::path defaults = copy_of("mistral");
  edit_json(defaults / "config.json", [](json& j) {
    j.erase("sliding_window");
    j["rope_scaling"] = {{"rope_type", "default"}};
  });
  EXPECT_EQ(stored_config(defaults).model.rope_scaling, "none");
  // Qwen2's sliding window means nothing while use_sliding_window is false, or when it is longer
  // than the context.
  const fs::path window = copy_of("qwen2");
  edit_json(window / "config.json", [](json& j) { j["use_sliding_window"] = true; });
  EXPECT_NO_THROW(read_hf_info(window));
}

// A directory with config.json and the shard index is a model directory; without either it is
// not one.
TEST_F(HFLlama, ShardedDirectoriesAreModelDirectories) {
  EXPECT_TRUE(is_hf_directory(kGolden / "qwen2"));
  const fs::path dir = copy_of("qwen2");
  fs::remove(dir / kIndex);
  EXPECT_FALSE(is_hf_directory(dir));
  // Both: model.safetensors wins, as in transformers.
  const fs::path both = copy_of("qwen2");
  fs::copy_file(kGolden / "mistral/model.safetensors", both / "model.safetensors");
  expect_refused(both, both / "model.safetensors",
                 "tensor 'model.embed_tokens.weight' makes Forge's tok_emb.weight [256, 32], but "
                 "config.json implies [300, 32]");
}

// A run records the digest of the model it started from and refuses to resume when it changed; a
// sharded model changes with any shard, even one rewritten in place at the same size.
TEST_F(HFLlama, ADigestOfAShardedModelCoversEveryShard) {
  const fs::path dir = copy_of("qwen2");
  const std::string before = checkpoint_digest(dir);
  EXPECT_EQ(before, checkpoint_digest(dir));
  std::string bytes = testing::read_file(dir / kShard2);
  bytes.back() ^= 1;  // the last byte of the last tensor's data
  testing::write_file(dir / kShard2, bytes);
  EXPECT_NE(checkpoint_digest(dir), before);
  // A single-file model keeps the plain digest of its model.safetensors.
  EXPECT_EQ(checkpoint_digest(kGolden / "llama"),
            file_digest(kGolden / "llama/model.safetensors", ExitCode::checkpoint));
}

// forge inspect, validate, eval --data and generate on a directory; inspect and validate say what
// loading it takes and which tokenizer it gets.
TEST_F(HFLlama, CommandsTakeADirectory) {
  const std::string mistral = (kGolden / "mistral").string();
  auto [code, out] = forge_output("inspect " + mistral);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("forge_version: none (a Hugging Face mistral directory)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("weights F16 in 1 file, 71.3 KiB stored, 142.6 KiB as f32 once loaded; "
                     "tokenizer bytes"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("integrity: ok"), std::string::npos) << out;

  std::tie(code, out) =
      forge_output("eval " + mistral + " --data " + (dir_ / "corpus.txt").string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_loss "), std::string::npos) << out;

  // Sharded BF16 weights through the command line too.
  for (const std::string& dir : {mistral, (kGolden / "qwen2").string()}) {
    std::tie(code, out) = forge_output("generate --checkpoint " + dir +
                                       " --prompt ab --max-new-tokens 4 --temperature 0");
    EXPECT_EQ(code, 0) << out;
  }

  std::ofstream(dir_ / "ft.yaml") << "recipe: finetune\nmodel: {init_from: "
                                  << (kGolden / "qwen2").string()
                                  << ", context: 16}\ndata: {train: "
                                  << (dir_ / "corpus.txt").string() << "}\n";
  std::tie(code, out) = forge_output("validate " + (dir_ / "ft.yaml").string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("# model.init_from " + (kGolden / "qwen2").string() +
                     ": weights BF16 in 2 files, 46.3 KiB stored, 92.6 KiB as f32 once loaded"),
            std::string::npos)
      << out;
}

// config.json: what Forge cannot compute, sizes that disagree with each other or the weights.
TEST_F(HFLlama, BadConfigsAreRefusedNamingTheKey) {
  struct Case {
    const char* fixture;
    std::function<void(json&)> edit;
    std::string part;
  };
  const std::vector<Case> cases = {
      {"llama", [](json& j) { j["model_type"] = "falcon"; },
       "model_type 'falcon' is not supported (gpt2, bert, llama, mistral or qwen2)"},
      {"llama", [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       "rope_scaling.rope_type 'yarn' is not supported (linear, llama3 or none)"},
      {"llama", [](json& j) { j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; },
       "rope_scaling.type 'dynamic' is not supported"},
      {"llama", [](json& j) { j["rope_scaling"] = {{"factor", 2.0}}; },
       "missing key 'rope_scaling.rope_type'"},
      {"llama", [](json& j) { j["rope_scaling"] = "linear"; },
       "rope_scaling: expected an object or null"},
      {"llama", [](json& j) { j["rope_scaling"]["factor"] = 0.5; },
       "rope_scaling.factor: expected a number >= 1.0, got 0.5"},
      {"llama3_scaled", [](json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; },
       "rope_scaling.high_freq_factor 1.0 must exceed low_freq_factor 1.0"},
      {"llama3_scaled",
       [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = int64_t{1} << 31; },
       "rope_scaling.original_max_position_embeddings: expected a positive integer up to"},
      {"llama", [](json& j) { j["num_key_value_heads"] = 3; },
       "num_key_value_heads 3 does not divide num_attention_heads 4"},
      {"llama3_scaled", [](json& j) { j["num_attention_heads"] = 6; },
       "num_attention_heads 6 does not divide hidden_size 32 (and no head_dim is given)"},
      {"mistral", [](json& j) { j["head_dim"] = 7; }, "head_dim 7 is odd"},
      {"llama", [](json& j) { j["num_hidden_layers"] = int64_t{1} << 31; },
       "num_hidden_layers: expected a positive integer up to 1024 (Forge's model.n_layers)"},
      {"llama", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act 'gelu' is not supported"},
      {"llama", [](json& j) { j["attention_bias"] = true; },
       "attention_bias true is not supported: it biases o_proj"},
      {"llama", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias true is not supported"},
      {"llama", [](json& j) { j["attention_dropout"] = 0.1; },
       "attention_dropout 0.1 is not supported"},
      {"llama", [](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps: expected a number > 0"},
      {"mistral", [](json& j) { j["sliding_window"] = 16; },
       "sliding_window 16 is smaller than max_position_embeddings 64"},
      {"qwen2", [](json& j) { j.update({{"use_sliding_window", true}, {"sliding_window", 32}}); },
       "use_sliding_window true with a sliding_window smaller than max_position_embeddings"},
      {"llama", [](json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; },
       "quantization_config: quantized weights are not supported"},
      {"llama", [](json& j) { j["vocab_size"] = 200; }, "no tokenizer beside it"}};
  for (const Case& c : cases) {
    const fs::path dir = copy_of(c.fixture);
    edit_json(dir / "config.json", c.edit);
    expect_refused(dir, dir / "config.json", c.part);
  }
  // Shapes that disagree with the weights: the tensor and both shapes are named.
  const fs::path wider = copy_of("llama");
  edit_json(wider / "config.json", [](json& j) { j["intermediate_size"] = 48; });
  expect_refused(wider, wider / "model.safetensors",
                 "tensor 'model.layers.0.mlp.gate_proj.weight' makes Forge's "
                 "blocks.0.mlp.gate.weight [40, 32], but config.json implies [48, 32]");
  const fs::path heads = copy_of("mistral");
  edit_json(heads / "config.json", [](json& j) { j["head_dim"] = 8; });
  expect_refused(heads, heads / "model.safetensors",
                 "tensor 'model.layers.0.self_attn.q_proj.weight' makes Forge's "
                 "blocks.0.attn.q.weight [48, 32], but config.json implies [32, 32]");
  // An untied head that is not there; a Qwen2 without its q/k/v biases.
  const fs::path untied = copy_of("qwen2");
  edit_json(untied / "config.json", [](json& j) { j["tie_word_embeddings"] = false; });
  expect_refused(untied, untied / kIndex, "no tensor 'lm_head.weight' (Forge's lm_head.weight)");
  const fs::path unbiased = copy_of("qwen2");
  edit_json(unbiased / "config.json", [](json& j) { j["model_type"] = "llama"; });
  expect_refused(unbiased, unbiased / kShard1,
                 "tensor 'model.layers.0.self_attn.q_proj.bias' is not part of a llama model");
}

// The index and the shards must agree exactly; every shard must be there.
TEST_F(HFLlama, BadShardsAreRefusedNamingTheFileAndTensor) {
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const fs::path missing = copy_of("qwen2");
  fs::remove(missing / kShard2);
  expect_refused(missing, missing / kShard2,
                 "missing: " + std::string(kIndex) + " places tensor '");

  const fs::path phantom = copy_of("qwen2");
  edit_json(phantom / kIndex,
            [](json& j) { j["weight_map"]["model.layers.9.mlp.up_proj.weight"] = kShard2; });
  expect_refused(phantom, phantom / kShard2,
                 "no tensor 'model.layers.9.mlp.up_proj.weight', which " + std::string(kIndex) +
                     " places in it");

  const fs::path unnamed = copy_of("qwen2");
  edit_json(unnamed / kIndex, [&](json& j) { j["weight_map"].erase(q); });
  expect_refused(unnamed, unnamed / kShard1,
                 "tensor '" + q + "' is not named by " + std::string(kIndex));

  const fs::path moved = copy_of("qwen2");
  edit_json(moved / kIndex, [&](json& j) { j["weight_map"][q] = kShard2; });
  expect_refused(moved, moved / kShard2, "no tensor '" + q + "', which");

  const fs::path elsewhere = copy_of("qwen2");
  edit_json(elsewhere / kIndex,
            [&](json& j) { j["weight_map"][q] = "../qwen2/" + std::string(kShard1); });
  expect_refused(elsewhere, elsewhere / kIndex,
                 "weight_map." + q + ": expected the name of a file in the directory");

  for (const std::string& text :
       {std::string("{"), std::string("{\"metadata\": {}}"), std::string("{\"weight_map\": {}}")}) {
    const fs::path bad = copy_of("qwen2");
    testing::write_file(bad / kIndex, text);
    expect_refused(bad, bad / kIndex, text == "{" ? "not valid JSON" : "weight_map: expected");
  }
}

// Weights stored as anything but F32, BF16 or F16 are refused naming the tensor and dtype, before
// any is read.
TEST_F(HFLlama, OtherDtypesAreRefusedNamingTheTensor) {
  const std::string emb = "model.embed_tokens.weight";
  const fs::path ints = copy_of("llama");
  edit_header(ints / "model.safetensors", [&](json& h) { h[emb]["dtype"] = "I32"; });
  expect_refused(ints, ints / "model.safetensors",
                 "tensor '" + emb + "' is I32: Forge reads F32, BF16 or F16 weights");
  // F64 on the same bytes: half the columns.
  const fs::path doubles = copy_of("llama");
  edit_header(doubles / "model.safetensors", [&](json& h) {
    h[emb]["dtype"] = "F64";
    h[emb]["shape"] = {300, 16};
  });
  expect_refused(doubles, doubles / "model.safetensors", "tensor '" + emb + "' is F64");
  // In a shard, the shard is named.
  const fs::path shard = copy_of("qwen2");
  edit_header(shard / kShard2, [](json& h) { h["model.norm.weight"]["dtype"] = "I16"; });
  expect_refused(shard, shard / kShard2, "tensor 'model.norm.weight' is I16");
}

}  // namespace
}  // namespace forge
