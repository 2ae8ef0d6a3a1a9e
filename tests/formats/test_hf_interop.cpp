// Hugging Face interop (formats/hf_model.h) against the PyTorch goldens of
// tests/golden/make_hf_goldens.py: a GPT-2 and a BERT directory load with their logits equal to
// PyTorch's; `forge export --format hf` writes back the very tensors, names and config; a
// directory is a starting point for model.init_from; PEFT export holds the adapters under PEFT's
// names; broken directories and non-finite weights are refused naming the file and the key or
// tensor; a bad --data path is one error line; a model with a task head is not exported.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/safetensors.h"
#include "nn/lora.h"
#include "runtime/config.h"
#include "formats/hf_model.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kGolden = fs::path(FORGE_SOURCE_DIR) / "tests/golden/hf";

Tensor ids_tensor(const std::vector<double>& v, int64_t rows) {
  Tensor t = empty({rows, int64_t(v.size()) / rows}, DType::i64);
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = int64_t(v[i]);
  return t;
}

// Largest |got - want| over the positions `keep` selects (all when empty).
double max_diff(const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<bool>& keep = {}) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (keep.empty() || keep[i]) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  return worst;
}

double gpt2_error(nn::GPT& model) {
  const testing::Goldens g = testing::load_goldens("hf.txt");
  NoGradGuard no_grad;
  Tensor logits = model.forward(ids_tensor(testing::golden_values(g, "gpt2.ids", "hf.txt"), 2));
  return max_diff(logits.to_vector<float>(), testing::golden_values(g, "gpt2.logits", "hf.txt"));
}

// MLM logits at real positions (padded positions are not part of the contract) and NSP logits.
double bert_error(nn::Bert& model) {
  const testing::Goldens g = testing::load_goldens("hf.txt");
  auto values = [&](const char* name) { return testing::golden_values(g, name, "hf.txt"); };
  Tensor ids = ids_tensor(values("bert.ids"), 2), segments = ids_tensor(values("bert.segments"), 2);
  Tensor mask = ids_tensor(values("bert.mask"), 2);
  NoGradGuard no_grad;
  nn::BertOutputs out = model.forward(ids, segments, mask);
  const int64_t V = model.config().vocab_size;
  Tensor mlm = model.mlm_logits(out.hidden);
  std::vector<bool> keep;
  for (double m : values("bert.mask")) keep.insert(keep.end(), size_t(V), m != 0);
  return std::max(max_diff(mlm.to_vector<float>(), values("bert.mlm_logits"), keep),
                  max_diff(model.nsp_logits(out.pooled).to_vector<float>(),
                           values("bert.nsp_logits")));
}

class HFInterop : public testing::RecipeTest {
 protected:
  static void edit_config(const fs::path& dir, const std::function<void(json&)>& edit) {
    json j = json::parse(testing::read_file(dir / "config.json"));
    edit(j);
    testing::write_file(dir / "config.json", j.dump());
  }
  // Every tensor of a safetensors file (all F32 in the GPT-2 golden).
  static NamedTensors all_tensors(const fs::path& file) {
    SafetensorsFile f(file);
    NamedTensors out;
    for (const SafetensorsEntry& e : f.entries()) out.push_back({e.name, f.read_f32(e.name)});
    return out;
  }
};

TEST_F(HFInterop, Gpt2DirectoryGivesPyTorchsLogits) {
  LoadedGPT loaded = load_gpt(resolve_checkpoint(kGolden / "gpt2"));
  EXPECT_EQ(loaded.config.model.d_model, 32);
  EXPECT_EQ(loaded.config.model.context, 16);
  EXPECT_EQ(loaded.config.data.tokenizer, (kGolden / "gpt2").string());
  EXPECT_LE(gpt2_error(*loaded.model), 1e-5);
}

TEST_F(HFInterop, BertDirectoryGivesPyTorchsLogits) {
  LoadedBert loaded = load_bert(resolve_checkpoint(kGolden / "bert"));
  EXPECT_EQ(loaded.config.model.norm_placement, "post");
  EXPECT_EQ(loaded.config.get<int64_t>("bert.type_vocab_size"), 2);
  EXPECT_LE(bert_error(*loaded.model), 1e-5);
}

TEST_F(HFInterop, ExportWritesBackTheSameTensorsConfigAndTokenizer) {
  // GPT-2: Forge reads GPT2Model's names and writes GPT2LMHeadModel's ("transformer." prefix,
  // tied head left out); the attention-mask buffers are not written.
  ASSERT_EQ(forge("export --checkpoint " + (kGolden / "gpt2").string() + " --format hf --output " +
                  (dir_ / "gpt2_out").string()),
            0);
  NamedTensors original = all_tensors(kGolden / "gpt2/model.safetensors");
  std::erase_if(original, [](const NamedTensor& t) { return t.name.ends_with(".attn.bias"); });
  NamedTensors exported = all_tensors(dir_ / "gpt2_out/model.safetensors");
  ASSERT_EQ(exported.size(), original.size());
  std::map<std::string, std::vector<float>> by_name;
  for (const NamedTensor& t : exported) by_name[t.name] = t.tensor.to_vector<float>();
  for (const NamedTensor& t : original)
    EXPECT_EQ(by_name["transformer." + t.name], t.tensor.to_vector<float>()) << t.name;
  json in = json::parse(testing::read_file(kGolden / "gpt2/config.json"));
  json out = json::parse(testing::read_file(dir_ / "gpt2_out/config.json"));
  for (const char* key : {"model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                          "layer_norm_epsilon", "activation_function", "tie_word_embeddings"})
    EXPECT_EQ(out[key], in[key]) << key;
  EXPECT_EQ(out["n_inner"], 128);
  EXPECT_EQ(out["eos_token_id"], 256);
  EXPECT_EQ(testing::read_file(dir_ / "gpt2_out/vocab.json"),
            testing::read_file(kGolden / "gpt2/vocab.json"));
  EXPECT_EQ(testing::read_file(dir_ / "gpt2_out/merges.txt"),
            testing::read_file(kGolden / "gpt2/merges.txt"));
  // And Forge reads its own export back to the same logits.
  EXPECT_LE(gpt2_error(*load_gpt(dir_ / "gpt2_out").model), 1e-5);

  // BERT: query, key and value come back apart, in BertForPreTraining's names.
  ASSERT_EQ(forge("export --checkpoint " + (kGolden / "bert").string() + " --format hf --output " +
                  (dir_ / "bert_out").string()),
            0);
  SafetensorsFile golden(kGolden / "bert/model.safetensors");
  SafetensorsFile bert(dir_ / "bert_out/model.safetensors");
  for (const SafetensorsEntry& e : golden.entries()) {
    if (e.name == "bert.embeddings.position_ids" || e.name.starts_with("cls.predictions.decoder"))
      continue;
    ASSERT_NE(bert.find(e.name), nullptr) << e.name;
    EXPECT_EQ(bert.read_f32(e.name).to_vector<float>(), golden.read_f32(e.name).to_vector<float>())
        << e.name;
  }
  EXPECT_EQ(bert.entries().size(), golden.entries().size() - 3);
  json bert_config = json::parse(testing::read_file(dir_ / "bert_out/config.json"));
  EXPECT_EQ(bert_config["intermediate_size"], 48);
  EXPECT_EQ(bert_config["architectures"][0], "BertForPreTraining");
  EXPECT_EQ(testing::read_file(dir_ / "bert_out/vocab.txt"),
            testing::read_file(kGolden / "bert/vocab.txt"));
  EXPECT_LE(bert_error(*load_bert(dir_ / "bert_out").model), 1e-5);
}

// The other direction through PyTorch itself: the golden script runs Forge's export with its own
// GPT-2 and BERT forward passes. Needs Debian's python3-torch, which the build does not.
TEST_F(HFInterop, PyTorchReadsForgesExportToTheGoldenOutputs) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3-torch: the PyTorch read-back is not checked here";
  const std::string script =
      "/usr/bin/python3 " + std::string(FORGE_SOURCE_DIR) + "/tests/golden/make_hf_goldens.py";
  for (const char* model : {"gpt2", "bert"}) {
    const fs::path out = dir_ / model;
    ASSERT_EQ(forge("export --checkpoint " + (kGolden / model).string() + " --format hf --output " +
                    out.string()),
              0);
    EXPECT_EQ(std::system((script + " --check " + out.string() + " >/dev/null").c_str()), 0)
        << model;
  }
}

TEST_F(HFInterop, DirectoryIsAStartingPointForInitFrom) {
  std::ofstream(dir_ / "ft.yaml") << "recipe: finetune\noutput_dir: " << (dir_ / "ft").string()
                                  << "\nmodel: {init_from: " << (kGolden / "gpt2").string()
                                  << "}\ndata: {train: " << (dir_ / "corpus.txt").string()
                                  << "}\ntrain: {batch_size: 2, max_steps: 1}\n";
  RunConfig config = load_config((dir_ / "ft.yaml").string());
  // The architecture and the tokenizer come from config.json and the directory.
  EXPECT_EQ(config.model.n_layers, 2);
  EXPECT_EQ(config.model.vocab_size, 257);
  EXPECT_EQ(config.data.tokenizer, (kGolden / "gpt2").string());
  Generator gen(5);
  nn::GPT model(gpt_config(config.model), gen);
  init_weights(model, config);
  EXPECT_LE(gpt2_error(model), 1e-5);

  // A distillation teacher: the student takes its vocabulary, tokenizer and block 0 from it, and
  // the run references the directory by its weights' digest.
  std::ofstream(dir_ / "distill.yaml")
      << "recipe: distill\noutput_dir: " << (dir_ / "student").string()
      << "\nmodel: {arch: gpt, context: 16, d_model: 32, n_layers: 1, n_heads: 4}\n"
      << "data: {train: " << (dir_ / "corpus.txt").string() << "}\n"
      << "distill: {teacher: " << (kGolden / "gpt2").string() << ", init_from_teacher: every_other}"
      << "\ntrain: {batch_size: 2, max_steps: 2, eval_batches: 1, sample_tokens: 1}\n";
  ASSERT_EQ(forge("train " + (dir_ / "distill.yaml").string()), 0);
  EXPECT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "student")).references.at("teacher"),
            (ModelReference{(kGolden / "gpt2").string(), checkpoint_digest(kGolden / "gpt2")}));
  EXPECT_EQ(losses(dir_ / "student", "val", "teacher_loss").size(), 1u);

  // A config that contradicts the directory is an error naming both.
  std::ofstream(dir_ / "bad.yaml") << "recipe: finetune\nmodel: {init_from: "
                                   << (kGolden / "gpt2").string() << ", d_model: 64}\n"
                                   << "data: {train: " << (dir_ / "corpus.txt").string() << "}\n";
  testing::expect_error(ExitCode::usage, "model.d_model: the config says 64",
                        [&] { load_config((dir_ / "bad.yaml").string()); });
}

TEST_F(HFInterop, BrokenDirectoriesAreRefusedNamingTheFileAndKeyOrTensor) {
  auto refused = [&](const fs::path& dir, const std::string& part) {
    testing::expect_error(ExitCode::checkpoint, part, [&] { load_gpt(resolve_checkpoint(dir)); });
    EXPECT_EQ(forge("inspect " + dir.string()), 4) << part;
  };
  int copies = 0;
  // The GPT-2 golden with config.json edited.
  auto edited = [&](const std::function<void(json&)>& edit) {
    fs::path dir = dir_ / ("copy" + std::to_string(copies++));
    fs::copy(kGolden / "gpt2", dir);
    edit_config(dir, edit);
    return dir;
  };
  refused(edited([](json& j) { j.erase("n_embd"); }), "config.json: missing key 'n_embd'");
  refused(edited([](json& j) { j["activation_function"] = "relu"; }),
          "activation_function 'relu' is not supported");
  refused(edited([](json& j) { j["n_layer"] = "two"; }), "n_layer: expected a positive integer");
  refused(edited([](json& j) { j["model_type"] = "falcon"; }),
          "model_type 'falcon' is not supported");
  // More layers than the weights hold, and another width: the tensor is named.
  refused(edited([](json& j) { j["n_layer"] = 3; }), "no tensor 'h.2.ln_1.weight'");
  refused(edited([](json& j) { j["n_embd"] = 64; }),
          "tensor 'wte.weight' makes Forge's tok_emb.weight [257, 32], but config.json implies "
          "[257, 64]");

  // A tensor the architecture has no place for.
  fs::path extra = edited([](json&) {});
  NamedTensors tensors = all_tensors(extra / "model.safetensors");
  tensors.push_back({"h.0.attn.rotary.inv_freq", zeros({4})});
  write_safetensors(extra / "model.safetensors", tensors, {}, ExitCode::checkpoint);
  refused(extra, "tensor 'h.0.attn.rotary.inv_freq' is not part of a gpt2 model");

  // Damaged weights: the safetensors reader names the file.
  fs::path damaged = edited([](json&) {});
  std::string bytes = testing::read_file(damaged / "model.safetensors");
  testing::write_file(damaged / "model.safetensors", bytes.substr(0, bytes.size() - 1));
  refused(damaged, (damaged / "model.safetensors").string());

  // No tokenizer files, and a vocabulary that is not GPT-2's.
  fs::path no_tokenizer = edited([](json&) {});
  fs::remove(no_tokenizer / "merges.txt");
  refused(no_tokenizer, "no tokenizer beside it (expected tokenizer.json, or vocab.json and merges.txt");
}

// Sizes in config.json are bounded as the Forge keys they become before a layout is looped over
// or a shape implied (n_layer 2^31 built 2^31 layers' names and ran out of memory), JSON nesting is
// bounded, and a directory whose entries are symlink loops is named, not an internal error.
TEST_F(HFInterop, ConfigSizesNestingAndSymlinkLoopsAreRefusedNamingTheFileAndKey) {
  int copies = 0;
  auto copy_of = [&](const char* model) {
    fs::path dir = dir_ / ("bounded" + std::to_string(copies++));
    fs::copy(kGolden / model, dir);
    return dir;
  };
  auto refused = [&](const fs::path& dir, const std::string& part) {
    testing::expect_error(ExitCode::checkpoint, part, [&] { read_hf_info(dir); });
  };
  for (const char* key : {"n_layer", "n_embd", "n_head", "vocab_size", "n_positions"}) {
    const fs::path dir = copy_of("gpt2");
    edit_config(dir, [&](json& j) { j[key] = int64_t{1} << 31; });
    refused(dir, "config.json: " + std::string(key) + ": expected a positive integer up to ");
  }
  const fs::path layers = copy_of("gpt2");
  edit_config(layers, [](json& j) { j["n_layer"] = 1025; });
  refused(layers, "config.json: n_layer: expected a positive integer up to 1024 (Forge's "
                  "model.n_layers), got 1025");
  const fs::path inner = copy_of("gpt2");
  edit_config(inner, [](json& j) { j["n_inner"] = 64 * j["n_embd"].get<int64_t>() + 1; });
  refused(inner, "n_inner: expected a positive integer up to ");
  for (const char* key : {"num_hidden_layers", "hidden_size", "num_attention_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings",
                          "type_vocab_size"}) {
    const fs::path dir = copy_of("bert");
    edit_config(dir, [&](json& j) { j[key] = int64_t{1} << 31; });
    refused(dir, "config.json: " + std::string(key) + ": expected a positive integer up to ");
  }

  const fs::path deep = copy_of("gpt2");
  std::string text = testing::read_file(deep / "config.json");
  text.insert(text.rfind('}'), ", \"x\": " + std::string(100000, '[') + std::string(100000, ']'));
  testing::write_file(deep / "config.json", text);
  refused(deep, "config.json: not valid JSON: arrays and objects nested deeper than 128 levels");

  for (const char* file : {"config.json", "model.safetensors"}) {
    const fs::path dir = copy_of("gpt2");
    fs::remove(dir / file);
    fs::create_symlink(file, dir / file);
    EXPECT_TRUE(is_hf_directory(dir)) << file;
    refused(dir, (dir / file).string() + ": Too many levels of symbolic links");
  }
  const fs::path loop = dir_ / "loop";
  fs::create_symlink(loop, loop);
  testing::expect_error(ExitCode::checkpoint,
                        loop.string() + ": cannot be read: Too many levels of symbolic links",
                        [&] { resolve_checkpoint(loop); });
}

// A NaN or an infinity in the weights is a checkpoint error naming the tensor, for every command
// that reads the directory, as training refuses a non-finite parameter.
TEST_F(HFInterop, NonFiniteWeightsAreRefusedNamingTheTensor) {
  for (float bad : {std::nanf(""), INFINITY}) {
    const fs::path dir = dir_ / (std::isnan(bad) ? "nan" : "inf");
    fs::copy(kGolden / "gpt2", dir);
    NamedTensors tensors = all_tensors(dir / "model.safetensors");
    for (NamedTensor& t : tensors)
      if (t.name == "h.0.attn.c_attn.weight") t.tensor.data<float>()[5] = bad;
    write_safetensors(dir / "model.safetensors", tensors, {}, ExitCode::checkpoint);
    testing::expect_error(ExitCode::checkpoint, "tensor 'h.0.attn.c_attn.weight' holds a NaN",
                          [&] { load_gpt(resolve_checkpoint(dir)); });
    testing::write_file(dir_ / "text.txt", "to be or not to be");
    for (const std::string& command :
         {"inspect " + dir.string(),
          "eval " + dir.string() + " --data " + (dir_ / "text.txt").string(),
          "generate --checkpoint " + dir.string() + " --prompt a --max-new-tokens 2"}) {
      const auto [code, output] = forge_output(command);
      EXPECT_EQ(code, 4) << command << "\n" << output;
      EXPECT_NE(output.find("h.0.attn.c_attn.weight"), std::string::npos) << output;
    }
  }
}

// forge eval of a directory with a bad --data path reports it once, not once per split.
TEST_F(HFInterop, EvalOfABadDataPathIsOneErrorLine) {
  for (const std::string& data :
       {(dir_ / "missing.txt").string(), dir_.string(), std::string("''")}) {
    const auto [code, output] =
        forge_output("eval " + (kGolden / "gpt2").string() + " --data " + data);
    EXPECT_EQ(code, 2) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

// A reward model or a classifier is intact but has a task head no export format holds: every
// format and --merge say so (exit 2), none blames the checkpoint (exit 4); generate too.
TEST_F(HFInterop, ExportOfAModelWithATaskHeadIsAUsageError) {
  train_tiny_base(16);
  const std::string base = (dir_ / "base.yaml").string() + " model.init_from=" +
                           (dir_ / "base").string() + " train.max_steps=1 train.eval_every=0";
  write_word_pairs(dir_ / "pairs.jsonl", 8, 3);
  ASSERT_EQ(forge("train " + base + " recipe=reward_model data.train=" +
                  (dir_ / "pairs.jsonl").string() + " output_dir=" + (dir_ / "rm").string()),
            0);
  testing::write_file(dir_ / "labels.jsonl", "{\"text\": \"to be\", \"label\": \"a\"}\n"
                                             "{\"text\": \"or not\", \"label\": \"b\"}\n");
  ASSERT_EQ(forge("train " + base + " recipe=classify data.train=" +
                  (dir_ / "labels.jsonl").string() + " data.val_fraction=0 output_dir=" +
                  (dir_ / "classifier").string()),
            0);
  for (const char* run : {"rm", "classifier"})
    for (const char* how : {"--format hf", "--format peft", "--format gguf", "--merge"}) {
      const std::string command = "export --checkpoint " + (dir_ / run).string() + " " + how +
                                  " --output " + (dir_ / "out").string();
      const auto [code, output] = forge_output(command);
      EXPECT_EQ(code, 2) << command << "\n" << output;
      EXPECT_NE(output.find("with a task head ('head."), std::string::npos) << output;
      EXPECT_FALSE(fs::exists(dir_ / "out")) << command;
    }
  const auto [code, output] =
      forge_output("generate --checkpoint " + (dir_ / "rm").string() + " --prompt a");
  EXPECT_EQ(code, 2) << output;
  EXPECT_NE(output.find("the model of a reward_model run"), std::string::npos) << output;
}

TEST_F(HFInterop, PeftExportHoldsTheAdaptersUnderPeftNames) {
  std::ofstream(dir_ / "base.yaml")
      << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << (dir_ / "base").string()
      << "\nmodel: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 2, "
         "n_heads: 2}\ndata: {tokenizer: bytes, train: "
      << (dir_ / "corpus.txt").string() << "}\ntrain: {batch_size: 2, max_steps: 2}\n";
  ASSERT_EQ(forge("train " + (dir_ / "base.yaml").string()), 0);
  std::ofstream(dir_ / "lora.yaml")
      << "recipe: finetune\nseed: 3\noutput_dir: " << (dir_ / "lora").string()
      << "\nmodel: {init_from: " << (dir_ / "base").string() << "}\ndata: {train: "
      << (dir_ / "corpus.txt").string() << "}\noptimizer: {name: adamw, lr: 1.0e-2}\n"
      << "train: {batch_size: 2, max_steps: 3}\n"
      << "lora: {rank: 2, alpha: 4, targets: [\"*.attn.qkv\", \"blocks.1.mlp.proj\"]}\n";
  ASSERT_EQ(forge("train " + (dir_ / "lora.yaml").string()), 0);
  ASSERT_EQ(forge("export --checkpoint " + (dir_ / "lora").string() + " --format peft --output " +
                  (dir_ / "peft").string()),
            0);
  LoadedGPT loaded = load_gpt(resolve_checkpoint(dir_ / "lora"));
  std::map<std::string, std::vector<float>> adapters;
  for (const NamedTensor& t : loaded.model->named_state())
    adapters[t.name] = t.tensor.to_vector<float>();
  SafetensorsFile peft(dir_ / "peft/adapter_model.safetensors");
  const std::map<std::string, std::string> expected = {
      {"base_model.model.transformer.h.0.attn.c_attn", "blocks.0.attn.qkv"},
      {"base_model.model.transformer.h.1.attn.c_attn", "blocks.1.attn.qkv"},
      {"base_model.model.transformer.h.1.mlp.c_proj", "blocks.1.mlp.proj"}};
  ASSERT_EQ(peft.entries().size(), 2 * expected.size());
  for (const auto& [hf, forge_module] : expected)
    for (const char* ab : {"A", "B"}) {
      const std::string name = hf + ".lora_" + ab + ".weight";
      ASSERT_NE(peft.find(name), nullptr) << name;
      EXPECT_EQ(peft.read_f32(name).to_vector<float>(), adapters.at(forge_module + ".lora_" + ab))
          << name;
    }
  json config = json::parse(testing::read_file(dir_ / "peft/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 4.0);
  EXPECT_EQ(config["fan_in_fan_out"], true);
  EXPECT_EQ(config["target_modules"],
            json({"transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn",
                  "transformer.h.1.mlp.c_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], resolve_checkpoint(dir_ / "base").string());

  // The adapters merged with --format hf equal the LoRA model's logits.
  ASSERT_EQ(forge("export --checkpoint " + (dir_ / "lora").string() + " --format hf --output " +
                  (dir_ / "merged").string()),
            0);
  Tensor x = empty({1, 16}, DType::i64);
  for (int64_t t = 0; t < 16; ++t) x.data<int64_t>()[t] = (t * 37 + 11) % 256;
  NoGradGuard no_grad;
  std::vector<float> lora = loaded.model->forward(x).to_vector<float>();
  std::vector<float> merged = load_gpt(dir_ / "merged").model->forward(x).to_vector<float>();
  double gap = 0;
  for (size_t i = 0; i < lora.size(); ++i)
    gap = std::max(gap, double(std::fabs(lora[i] - merged[i])));
  EXPECT_LE(gap, 1e-5);

  // A rotary GPT with GPT-2's MLP and biases is neither a GPT-2 nor a Llama: refused naming what
  // it has, nothing written.
  std::ofstream(dir_ / "llama.yaml")
      << "recipe: gpt_pretrain\noutput_dir: " << (dir_ / "llama").string()
      << "\nmodel: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
         "n_heads: 2, norm: rmsnorm, position: rotary}\ndata: {tokenizer: bytes, train: "
      << (dir_ / "corpus.txt").string() << "}\ntrain: {batch_size: 2, max_steps: 1}\n";
  ASSERT_EQ(forge("train " + (dir_ / "llama.yaml").string()), 0);
  auto [llama_code, llama_out] =
      forge_output("export --checkpoint " + (dir_ / "llama").string() + " --format hf --output " +
                   (dir_ / "llama_hf").string());
  EXPECT_EQ(llama_code, 2);
  EXPECT_NE(llama_out.find("Hugging Face export writes a rotary GPT as Llama's architecture "
                           "(rmsnorm, swiglu MLP, no biases or q/k/v biases only); this model has "
                           "gelu MLP, biases"),
            std::string::npos)
      << llama_out;
  EXPECT_FALSE(fs::exists(dir_ / "llama_hf"));

  // A plain checkpoint has no adapters to write.
  auto [code, out] = forge_output("export --checkpoint " + (dir_ / "base").string() +
                                  " --format peft --output " + (dir_ / "none").string());
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("holds no LoRA adapters"), std::string::npos) << out;
}

}  // namespace
}  // namespace forge
