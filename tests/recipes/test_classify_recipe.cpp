// Recipe classify through the forge binary, on three classes of synthetic records (each class has
// its own words among shared filler) and a tiny base GPT trained in SetUp: a fixed-seed run with
// asserted accuracy, eval and predict and the report's confusion matrix, kill-and-resume with the
// loader cursor (in fp32 and bf16), each block's learning rate and the step it starts training
// under layer_lr_decay, STLR and gradual unfreezing, data errors, a BERT classifier, and the
// classify: section's struct.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "nn/classifier.h"
#include "optim/groups.h"
#include "optim/schedule.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/classify.h"
#include "runtime/confusion.h"
#include "tests/recipes/recipe_test.h"
#include "tests/recipes/section_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class ClassifyRecipe : public testing::RecipeTest {
 protected:
  void SetUp() override {
    RecipeTest::SetUp();
    train_tiny_base(16);
    if (HasFatalFailure()) return;
    write_records(dir_ / "records");
  }

  // 30 records per class: five to nine words of shared filler with two of the class's own words at
  // places drawn from a fixed LCG, so that no class is recognisable from its first bytes alone.
  static void write_records(const fs::path& dir) {
    fs::create_directories(dir);
    const std::vector<std::string> filler = {"the", "a", "and", "of", "was", "on", "in", "it"};
    const std::map<std::string, std::vector<std::string>> own = {
        {"bird", {"wings", "feather", "nest", "tweet"}},
        {"cat", {"meow", "whisker", "purr", "mouse"}},
        {"dog", {"bark", "fetch", "bone", "leash"}}};
    uint64_t state = 12345;
    auto next = [&](uint64_t n) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % n;
    };
    for (const auto& [label, words] : own) {
      std::ofstream out(dir / (label + ".txt"));
      for (int r = 0; r < 30; ++r) {
        std::vector<std::string> text;
        for (uint64_t w = 0, n = 5 + next(5); w < n; ++w) text.push_back(filler[next(8)]);
        for (int k = 0; k < 2; ++k) {
          // Two statements: the order of draws inside one call's arguments is the compiler's.
          const auto at = long(next(text.size() + 1));
          text.insert(text.begin() + at, words[next(4)]);
        }
        for (size_t w = 0; w < text.size(); ++w) out << (w ? " " : "") << text[w];
        out << (r + 1 < 30 ? "\n%\n" : "\n");
      }
    }
  }

  static constexpr const char* kOptimizer = "{name: adamw, lr: 3.0e-3, weight_decay: 0.0}";
  static constexpr const char* kTrain =
      "{batch_size: 8, max_steps: 40, eval_every: 20, save_every: 4, log_every: 1}";

  fs::path write_config(const std::string& name, const std::string& optimizer = kOptimizer,
                        const std::string& train = kTrain, const std::string& extra = "") {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: classify\nseed: 3\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {init_from: " << (dir_ / "base").string() << "}\n"
        << "data: {train: " << (dir_ / "records").string() << ", val_fraction: 0.2}\n"
        << "optimizer: " << optimizer << "\ntrain: " << train << "\n"
        << "classify: {max_len: 40, hidden: 16, dropout: 0.0}\n"
        << extra;
    return dir_ / (name + ".yaml");
  }
};

// From random init: the 20-step base's final hidden states are nearly the same for every byte (it
// has learned little more than byte frequencies), too little signal for 40 steps; a random
// embedding keeps the bytes apart.
TEST_F(ClassifyRecipe, AShortRunLearnsTheClassesAndEvalPredictAndReportAgree) {
  std::ofstream(dir_ / "run.yaml")
      << "recipe: classify\nseed: 3\noutput_dir: " << (dir_ / "run").string() << "\n"
      << "model: {arch: gpt, vocab_size: 256, context: 16, d_model: 32, n_layers: 2, n_heads: 2, "
         "dropout: 0.0}\n"
      << "data: {tokenizer: bytes, train: " << (dir_ / "records").string()
      << ", val_fraction: 0.2}\n"
      << "optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.0}\n"
      << "train: " << kTrain << "\n"
      << "classify: {max_len: 40, hidden: 16, dropout: 0.0}\n";
  ASSERT_EQ(forge("train " + (dir_ / "run.yaml").string()), 0);
  const std::map<int64_t, double> acc = losses(dir_ / "run", "val", "acc"),
                                  f1 = losses(dir_ / "run", "val", "macro_f1"),
                                  loss = losses(dir_ / "run", "val");
  ASSERT_EQ(acc.size(), 2u);  // steps 20 and 40
  // Values from this fixed seed (GCC and Clang builds agree to 1e-6): 18 held-out records, 6 a
  // class, all right at the end.
  EXPECT_NEAR(losses(dir_ / "run", "train").at(1), 1.16461, 1e-3);
  EXPECT_NEAR(losses(dir_ / "run", "train", "grad_norm").at(1), 6.01244, 6e-3);
  EXPECT_NEAR(loss.at(20), 0.93357, 2e-3);
  EXPECT_NEAR(loss.at(40), 0.55493, 2e-3);
  EXPECT_NEAR(acc.at(40), 1.0, 1e-9);
  EXPECT_NEAR(f1.at(40), 1.0, 1e-9);
  const std::map<int64_t, double> train_acc = losses(dir_ / "run", "train", "acc");
  ASSERT_EQ(train_acc.size(), 40u);
  EXPECT_GE(losses(dir_ / "run", "train", "macro_f1").at(40), 0.0);

  // The stored labels (sorted, as no classify.labels were given) and the final matrix.
  const RunConfig stored = stored_config(resolve_checkpoint(dir_ / "run"));
  EXPECT_EQ(stored.get<std::vector<std::string>>("classify.labels"),
            (std::vector<std::string>{"bird", "cat", "dog"}));
  std::ifstream in(confusion_path(dir_ / "run"));
  const std::optional<Confusion> m =
      Confusion::from_json(std::string(std::istreambuf_iterator<char>(in), {}));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->total(), 18);
  EXPECT_DOUBLE_EQ(m->accuracy(), acc.at(40));
  std::ifstream report(dir_ / "run" / "report.html");
  const std::string html(std::istreambuf_iterator<char>(report), {});
  EXPECT_NE(html.find("<h2>Classes</h2>"), std::string::npos);
  EXPECT_NE(html.find("aria-label=\"confusion matrix\""), std::string::npos);

  auto [code, out] = forge_output("eval " + (dir_ / "run").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_acc " + g6(acc.at(40)) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("val_macro_f1 " + g6(f1.at(40)) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("confusion (rows: true label, columns: predicted)"), std::string::npos) << out;

  testing::write_file(dir_ / "texts.txt",
                      "bark the fetch a bone of leash\n\n"
                      "meow and purr the mouse of whisker\n");
  auto [pcode, pout] = forge_output("predict --checkpoint " + (dir_ / "run").string() +
                                    " --input " + (dir_ / "texts.txt").string());
  ASSERT_EQ(pcode, 0) << pout;
  EXPECT_EQ(pout.rfind("dog\t", 0), 0u) << pout;  // one line per non-blank line
  EXPECT_NE(pout.find("\ncat\t"), std::string::npos) << pout;
  EXPECT_EQ(std::count(pout.begin(), pout.end(), '\n'), 2) << pout;
  testing::write_file(dir_ / "texts.jsonl",
                      "{\"text\": \"tweet tweet wings\", \"label\": \"bird\"}\n");
  auto [jcode, jout] = forge_output("predict --checkpoint " + (dir_ / "run").string() +
                                    " --input " + (dir_ / "texts.jsonl").string());
  ASSERT_EQ(jcode, 0) << jout;
  EXPECT_EQ(jout.rfind("bird\t", 0), 0u) << jout;

  // predict needs a recipe that predicts.
  auto [bcode, bout] = forge_output("predict --checkpoint " + (dir_ / "base").string() +
                                    " --input " + (dir_ / "texts.txt").string());
  EXPECT_EQ(bcode, 2) << bout;
  EXPECT_NE(bout.find("is a gpt_pretrain checkpoint"), std::string::npos) << bout;
}

TEST_F(ClassifyRecipe, AKilledAndRestartedRunContinuesTheLoaderAndTheScheduleExactly) {
  auto config = [&](const std::string& name) {
    return write_config(name, "{name: adamw, lr: 3.0e-3, layer_lr_decay: 2.6, unfreeze_every: 3}",
                        "{batch_size: 8, max_steps: 12, save_every: 4, log_every: 1}",
                        "schedule: {name: stlr, cut_frac: 0.25, ratio: 32}\n");
  };
  ASSERT_EQ(forge("train " + config("straight").string()), 0);
  const fs::path killed = config("killed");
  // Dies after step 7 (checkpoint at 4, mid-epoch: 48 training records make 6 batches of 8).
  EXPECT_EQ(forge("train " + killed.string(), "FORGE_TEST_SIGKILL_AFTER_STEP=7"), 128 + SIGKILL);
  EXPECT_EQ(read_checkpoint_info(*latest_checkpoint(dir_ / "killed")).step, 4);
  ASSERT_EQ(forge("train " + killed.string()), 0);
  const std::vector<std::string> keys = {"loss", "acc", "grad_norm", "lr"};
  const std::vector<std::string> a = train_lines(dir_ / "straight", keys),
                                 b = train_lines(dir_ / "killed", keys);
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(saved_tensors(dir_ / "killed"), saved_tensors(dir_ / "straight"));  // bitwise
}

// The resume test's run (discriminative rates, STLR, gradual unfreezing) with bf16 products: it
// differs from fp32's, ends near its loss, and a killed run resumes bitwise.
TEST_F(ClassifyRecipe, ABf16RunStaysNearFp32AndResumesExactly) {
  auto config = [&](const std::string& name) {
    return write_config(name, "{name: adamw, lr: 3.0e-3, layer_lr_decay: 2.6, unfreeze_every: 3}",
                        "{batch_size: 8, max_steps: 12, save_every: 4, log_every: 1}",
                        "schedule: {name: stlr, cut_frac: 0.25, ratio: 32}\n");
  };
  expect_bf16_differs_and_resumes_exactly(
      [&](const std::string& name) { return "train " + config(name).string(); },
      " train.precision=bf16", {"loss", "acc", "grad_norm", "lr"}, 12, 7);
  if (HasFatalFailure()) return;
  // Measured: 1.10468 in fp32, 1.10387 in bf16 native, 1.10385 emulated.
  EXPECT_NEAR(losses(dir_ / "bf16", "val").at(12), losses(dir_ / "fp32", "val").at(12), 5e-3);
}

// Which tensors an update changed and by how much, from consecutive checkpoints. AdamW's first
// update of a parameter moves every element with a gradient by lr * lr_mult (m / sqrt(v) = +-1
// after bias correction; weight decay is off), so the largest change of a tensor on the step it
// starts training is that block's learning rate.
TEST_F(ClassifyRecipe, EachBlockStartsOnItsUnfreezingStepAtItsDiscriminativeRate) {
  const int64_t N = 2, steps = 9;
  write_config("ulmfit",
               "{name: adamw, lr: 1.0e-2, weight_decay: 0.0, layer_lr_decay: 2.0, "
               "unfreeze_every: 2}",
               "{batch_size: 8, max_steps: 9, save_every: 1, keep_last: 0, log_every: 1, "
               "clip_grad_norm: 0}",
               "schedule: {name: stlr, cut_frac: 0.3, ratio: 32}\n");
  ASSERT_EQ(forge("train " + (dir_ / "ulmfit.yaml").string()), 0);

  // The logged rate is STLR's (ULMFiT eq. 3) at each step.
  const std::map<int64_t, double> lr = losses(dir_ / "ulmfit", "train", "lr");
  optim::ScheduleSpec stlr{
      .name = "stlr", .base_lr = 1e-2, .max_steps = steps, .cut_frac = 0.3, .ratio = 32};
  for (int64_t s = 1; s <= steps; ++s)
    EXPECT_DOUBLE_EQ(lr.at(s), optim::learning_rate(stlr, s - 1)) << "step " << s;
  // cut = floor(9 * 0.3) = 2: the rate rises for 2 updates, peaks, then falls to lr / 32.
  EXPECT_NEAR(lr.at(3), 1e-2, 1e-12);
  EXPECT_NEAR(lr.at(1), 1e-2 / 32, 1e-12);

  // Layers of the 2-block model: embeddings -1, blocks 0 and 1, and 2 for ln_f and the head.
  auto layer_of = [](const std::string& name) -> int64_t {
    if (auto b = optim::block_index(name)) return *b;
    return name.starts_with("tok_emb") || name.starts_with("pos_emb") ? -1 : 2;
  };
  std::map<int64_t, std::map<std::string, std::vector<float>>> at;
  for (int64_t s = 1; s <= steps; ++s)
    at[s] = [&] {
      CheckpointData d =
          load_checkpoint(checkpoint_path(dir_ / "ulmfit", s),
                          read_checkpoint_info(checkpoint_path(dir_ / "ulmfit", s)).model);
      std::map<std::string, std::vector<float>> out;
      for (const NamedTensor& t : d.model) out[t.name] = t.tensor.to_vector<float>();
      return out;
    }();
  // Update u (logged as step u) is the optimizer's step u - 1: layer l trains from step
  // (2 - l) * N, the embeddings from 3 N.
  for (int64_t u = 2; u <= steps; ++u) {
    for (const auto& [name, now] : at[u]) {
      const std::vector<float>& before = at[u - 1].at(name);
      double largest = 0;
      for (size_t i = 0; i < now.size(); ++i)
        largest = std::max(largest, std::fabs(double(now[i]) - double(before[i])));
      const int64_t l = layer_of(name);
      const int64_t first = (2 - l) * N;  // the optimizer step it starts on
      if (u - 1 < first) {
        EXPECT_EQ(largest, 0.0) << name << " changed in update " << u;
      } else if (u - 1 == first && name.find("bias") == std::string::npos) {
        const double rate = lr.at(u) / std::pow(2.0, double(std::max<int64_t>(0, 1 - l)));
        EXPECT_NEAR(largest, rate, 0.02 * rate) << name << " in update " << u;
      }
    }
  }
  // Every layer has trained by the end.
  for (const auto& [name, last] : at[steps]) EXPECT_NE(last, at[1].at(name)) << name;
}

TEST_F(ClassifyRecipe, BadRecordsAndLabelsAreDataErrorsNamingTheFileAndLine) {
  testing::write_file(dir_ / "bad.jsonl",
                      "{\"text\": \"a\", \"label\": \"x\"}\n"
                      "{\"text\": \"b\", \"labl\": \"y\"}\n");
  auto [code, out] = forge_output("train " + write_config("bad").string() +
                                  " data.train=" + (dir_ / "bad.jsonl").string());
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find((dir_ / "bad.jsonl").string() + ":2: unknown field \"labl\""),
            std::string::npos)
      << out;

  testing::write_file(dir_ / "one.jsonl",
                      "{\"text\": \"a\", \"label\": \"x\"}\n"
                      "{\"text\": \"b\", \"label\": \"x\"}\n");
  std::tie(code, out) = forge_output("train " + write_config("one").string() +
                                     " data.train=" + (dir_ / "one.jsonl").string());
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("the records have 1 label; a classifier needs at least 2"), std::string::npos)
      << out;

  std::tie(code, out) =
      forge_output("train " + write_config("missing").string() + " classify.labels=[cat,horse]");
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("no record has the label 'horse' (the data has: bird, cat, dog)"),
            std::string::npos)
      << out;

  std::tie(code, out) =
      forge_output("train " + write_config("same").string() + " classify.labels=[cat,cat]");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("classify.labels: list two or more distinct labels"), std::string::npos)
      << out;
}

TEST_F(ClassifyRecipe, ChosenLabelsKeepTheirOrderAndJsonlRecordsTrainToo) {
  // JSONL records of two of the classes, labels in the config's order.
  std::string jsonl;
  for (const std::string label : {"cat", "dog"}) {
    std::ifstream in(dir_ / "records" / (label + ".txt"));
    for (std::string line; std::getline(in, line);)
      if (line != "%") jsonl += "{\"text\": \"" + line + "\", \"label\": \"" + label + "\"}\n";
  }
  testing::write_file(dir_ / "two.jsonl", jsonl);
  ASSERT_EQ(forge("train " + write_config("two").string() + " data.train=" +
                  (dir_ / "two.jsonl").string() + " classify.labels=[dog,cat] train.max_steps=8"),
            0);
  const RunConfig stored = stored_config(resolve_checkpoint(dir_ / "two"));
  EXPECT_EQ(stored.get<std::vector<std::string>>("classify.labels"),
            (std::vector<std::string>{"dog", "cat"}));
  EXPECT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "two")).step, 8);
}

TEST_F(ClassifyRecipe, ABertClassifierTrainsFromRandomInit) {
  std::ofstream(dir_ / "bert.yaml")
      << "recipe: classify\nseed: 3\noutput_dir: " << (dir_ / "bert").string() << "\n"
      << "model: {arch: bert, vocab_size: 260, context: 48, d_model: 32, n_layers: 2, n_heads: 2, "
         "dropout: 0.0}\n"
      << "data: {tokenizer: bytes, special_tokens: [\"[PAD]\", \"[CLS]\", \"[SEP]\", \"[MASK]\"], "
         "train: "
      << (dir_ / "records").string() << ", val_fraction: 0.2}\n"
      << "optimizer: {name: adamw, lr: 3.0e-3}\n"
      << "train: {batch_size: 8, max_steps: 40, eval_every: 20, log_every: 1}\n"
      << "classify: {max_len: 48, dropout: 0.0}\n";
  auto [code, out] = forge_output("train " + (dir_ / "bert.yaml").string());
  ASSERT_EQ(code, 0) << out;
  const std::map<int64_t, double> loss = losses(dir_ / "bert", "val");
  ASSERT_EQ(loss.size(), 2u);
  // Values from this fixed seed (GCC and Clang builds agree to 1e-6).
  EXPECT_NEAR(losses(dir_ / "bert", "train").at(1), 1.09833, 1e-3);
  EXPECT_NEAR(losses(dir_ / "bert", "train", "grad_norm").at(1), 0.32531, 4e-4);
  EXPECT_NEAR(loss.at(20), 1.09693, 2e-3);
  EXPECT_NEAR(loss.at(40), 0.75139, 2e-3);
  EXPECT_NEAR(losses(dir_ / "bert", "val", "acc").at(40), 11.0 / 18, 1e-9);
  std::set<std::string> names;
  for (const TensorSpec& t : read_checkpoint_info(resolve_checkpoint(dir_ / "bert")).model)
    names.insert(t.name);
  EXPECT_TRUE(names.count("pooler.weight"));
  EXPECT_TRUE(names.count("head.out.weight"));
  EXPECT_FALSE(names.count("nsp.weight"));
  // A BERT reads at most its context.
  std::tie(code, out) =
      forge_output("validate " + (dir_ / "bert.yaml").string() + " classify.max_len=64");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("classify.max_len: a BERT reads at most model.context tokens (48)"),
            std::string::npos)
      << out;
}

TEST(ClassifySection, HoldsEveryKeyOfTheSection) {
  testing::expect_every_key_reaches_its_field<ClassifySection>(
      classify_section(),
      "recipe: classify\nmodel: {init_from: base}\ndata: {tokenizer: bytes, train: records}\n",
      classify_settings,
      {{{"classify.labels=[neg, pos]"},
        [](const ClassifySection& s) {
          EXPECT_EQ(s.labels, (std::vector<std::string>{"neg", "pos"}));
        }},
       {{"classify.records=lines"},
        [](const ClassifySection& s) { EXPECT_EQ(s.records, RecordFormat::lines); }},
       {{"classify.records=file"},
        [](const ClassifySection& s) { EXPECT_EQ(s.records, RecordFormat::file); }},
       {{"classify.max_len=12"}, [](const ClassifySection& s) { EXPECT_EQ(s.max_len, 12); }},
       {{"classify.hidden=7"}, [](const ClassifySection& s) { EXPECT_EQ(s.hidden, 7); }},
       {{"classify.dropout=0.3"}, [](const ClassifySection& s) { EXPECT_EQ(s.dropout, 0.3); }}});
}

}  // namespace
}  // namespace forge
