// Recipe distill on tiny GPT and BERT teachers trained in the tests: fixed-seed losses of both
// families, the loss exact under gradient accumulation (one batch of B against k micro-batches of
// B/k), a teacher that stays untouched and out of the student's checkpoints, the student's
// initialisation from teacher blocks and its errors, vocabulary / tokenizer / family mismatches,
// kill-and-resume (with the cosine projection saved beside the student; in fp32 and in bf16 with a
// bf16 teacher), a changed teacher on resume, `forge eval` and `forge validate`; the distill:
// section read into its struct.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/durable_file.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/distill.h"
#include "runtime/metrics.h"
#include "tests/recipes/recipe_test.h"
#include "tests/recipes/section_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class DistillRecipe : public testing::RecipeTest {
 protected:
  void SetUp() override {
    RecipeTest::SetUp();
    teacher_ = dir_ / "teacher";
    ASSERT_EQ(forge("train " + write_teacher("teacher", 7).string()), 0);
    teacher_file_ = resolve_checkpoint(teacher_);
  }

  // The GPT teacher: d_model 32, 4 layers, trained 20 steps on the corpus into dir_/name.
  fs::path write_teacher(const std::string& name, int seed) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: gpt_pretrain\nseed: " << seed << "\noutput_dir: " << (dir_ / name).string()
        << "\nmodel: {arch: gpt, vocab_size: 256, context: 32, d_model: 32, n_layers: 4, "
           "n_heads: 2, dropout: 0.0}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 20, log_every: 10, sample_tokens: 1}\n";
    return dir_ / (name + ".yaml");
  }

  // A GPT student of `d_model` and 2 layers distilled from the teacher for 12 steps into
  // dir_/name; `distill` is the body of the distill: section besides the teacher.
  fs::path write_student(const std::string& name, int d_model, const std::string& distill) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: distill\nseed: 3\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {arch: gpt, context: 32, d_model: " << d_model
        << ", n_layers: 2, n_heads: 2, dropout: 0.0}\n"
        << "data: {train: " << (dir_ / "corpus.txt").string() << ", val_fraction: 0.1}\n"
        << "distill: {teacher: " << teacher_.string() << ", " << distill << "}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 12, eval_every: 6, eval_batches: 2, save_every: 4, "
           "log_every: 1, sample_tokens: 4}\n";
    return dir_ / (name + ".yaml");
  }

  // A 2-layer BERT teacher (10 steps) and a 1-layer student of it from teacher block 1, the
  // DistilBERT weights 5 / 2 / 1.
  fs::path write_bert(const std::string& name, const std::string& recipe, int layers,
                      const std::string& extra) {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: " << recipe << "\nseed: 11\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {arch: bert, vocab_size: 260, context: 64, d_model: 32, n_layers: " << layers
        << ", n_heads: 2, ffn_mult: 2, dropout: 0.0, norm_eps: 1.0e-12}\n"
        << "data: {tokenizer: bytes, special_tokens: ['[PAD]', '[CLS]', '[SEP]', '[MASK]'], "
           "train: "
        << (dir_ / "corpus.txt").string() << ", val_fraction: 0.1}\n"
        << "bert: {paragraphs_per_document: 5, eval_pairs: 32}\n"
        << "optimizer: {name: adamw, lr: 2.0e-3}\n"
        << "train: {batch_size: 8, max_steps: 10, eval_every: 5, eval_batches: 2, save_every: 5, "
           "log_every: 1}\n"
        << extra;
    return dir_ / (name + ".yaml");
  }
  fs::path write_bert_student(const std::string& name, const std::string& extra = "") {
    return write_bert(name, "distill", 1,
                      "distill: {teacher: " + (dir_ / "bert_teacher").string() +
                          ", init_from_teacher: blocks, teacher_blocks: [1], alpha_kd: 5, "
                          "alpha_ce: 2, alpha_cos: 1}\n" + extra);
  }
  void train_bert_teacher() {
    ASSERT_EQ(forge("train " + write_bert("bert_teacher", "bert_pretrain", 2, "").string()), 0);
  }

  static std::map<int64_t, MetricsRecord> records(const fs::path& run, const std::string& split) {
    std::map<int64_t, MetricsRecord> out;
    for (const auto& r : read_metrics(run / "metrics.jsonl"))
      if (r.split == split) out.emplace(r.step, r);
    return out;
  }

  // The logged loss is exactly the weighted sum of its logged parts.
  static void expect_weighted_sum(const fs::path& run, double ce, double kd, double cos) {
    for (const auto& [step, r] : records(run, "train"))
      EXPECT_NEAR(*r.number("loss"),
                  ce * *r.number("ce_loss") + kd * *r.number("kd_loss") +
                      (cos > 0 ? cos * *r.number("cos_loss") : 0.0),
                  1e-5 * *r.number("loss"))
          << run << " step " << step;
  }

  // Train lines of two runs agree to `tolerance` in every key.
  static void expect_same_lines(const fs::path& a, const fs::path& b,
                                const std::vector<std::string>& keys, double tolerance) {
    auto x = records(a, "train"), y = records(b, "train");
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [step, r] : x)
      for (const std::string& key : keys)
        EXPECT_NEAR(*r.number(key), *y.at(step).number(key),
                    tolerance * std::max(1.0, std::fabs(*r.number(key))))
            << step << " " << key;
  }

  fs::path teacher_, teacher_file_;
};

TEST_F(DistillRecipe, GptRunLogsTheExpectedLosses) {
  ASSERT_EQ(forge("train " + write_student("gpt", 32, "init_from_teacher: every_other, "
                                                      "alpha_cos: 0.5").string()),
            0);
  auto train = records(dir_ / "gpt", "train"), val = records(dir_ / "gpt", "val");
  ASSERT_EQ(train.size(), 12u);
  ASSERT_EQ(val.size(), 2u);  // steps 6 and 12
  expect_weighted_sum(dir_ / "gpt", 0.5, 0.5, 0.5);
  // Values from these fixed seeds (any ISA within the tolerance). The student starts from teacher
  // blocks 0 and 2 with the teacher's embeddings and final norm, so its first KL is small.
  EXPECT_NEAR(*train.at(1).number("loss"), 1.7567, 2e-3);
  EXPECT_NEAR(*train.at(1).number("ce_loss"), 3.5111, 2e-3);
  EXPECT_NEAR(*train.at(1).number("kd_loss"), 4.3e-5, 2e-5);
  EXPECT_NEAR(*train.at(1).number("cos_loss"), 0.002327, 2e-4);
  EXPECT_NEAR(*train.at(1).number("grad_norm"), 0.45214, 2e-3);
  EXPECT_NEAR(*train.at(12).number("loss"), 1.6610, 3e-3);
  EXPECT_NEAR(*train.at(12).number("kd_loss"), 0.09258, 2e-3);
  const MetricsRecord& last = val.at(12);
  EXPECT_EQ(*last.number("tokens"), 3999);  // the whole split
  EXPECT_NEAR(*last.number("loss"), 3.3868, 3e-3);
  EXPECT_NEAR(*last.number("teacher_loss"), 3.5436, 2e-3);
  EXPECT_NEAR(*last.number("kd_loss"), 0.08569, 2e-3);
  EXPECT_NEAR(*last.number("top1_agree"), 0.0005, 1e-3);

  // From a random student, the forward KL(teacher || student) and the reverse KL(student ||
  // teacher) of the first batch differ (values from these seeds); the cross-entropy does not.
  for (const auto& [kl, want] : std::vector<std::pair<std::string, double>>{{"forward", 1.03355},
                                                                           {"reverse", 0.79250}}) {
    ASSERT_EQ(forge("train " + write_student(kl, 32, "kl: " + kl + ", alpha_cos: 0.5").string() +
                    " train.max_steps=1 train.eval_every=0"),
              0);
    const MetricsRecord first = records(dir_ / kl, "train").at(1);
    EXPECT_NEAR(*first.number("kd_loss"), want, 2e-3) << kl;
    EXPECT_NEAR(*first.number("ce_loss"), 5.5377, 2e-3) << kl;
  }

  // A student that is a copy of the teacher (every block, KL only): the KL's gradient is zero up to
  // rounding, which plain SGD leaves at that, so after a step the two still agree everywhere.
  ASSERT_EQ(forge("train " +
                  write_student("copy", 32, "init_from_teacher: blocks, teacher_blocks: [0, 1, 2, "
                                            "3], alpha_ce: 0, alpha_kd: 1").string() +
                  " model.n_layers=4 optimizer.name=sgd train.max_steps=1"),
            0);
  const MetricsRecord copy = records(dir_ / "copy", "val").at(1);
  EXPECT_NEAR(*copy.number("loss"), *copy.number("teacher_loss"), 1e-6);
  EXPECT_NEAR(*copy.number("kd_loss"), 0.0, 1e-6);
  EXPECT_EQ(*copy.number("top1_agree"), 1.0);
}

TEST_F(DistillRecipe, BertRunLogsTheExpectedLossesAndAccuracies) {
  train_bert_teacher();
  ASSERT_EQ(forge("train " + write_bert_student("bert").string()), 0);
  auto train = records(dir_ / "bert", "train"), val = records(dir_ / "bert", "val");
  ASSERT_EQ(train.size(), 10u);
  ASSERT_EQ(val.size(), 2u);
  expect_weighted_sum(dir_ / "bert", 2, 5, 1);
  for (const auto& [step, r] : train)  // the hard loss is bert_pretrain's: MLM mean + NSP mean
    EXPECT_NEAR(*r.number("ce_loss"), *r.number("mlm_loss") + *r.number("nsp_loss"), 1e-5) << step;
  // Values from these fixed seeds; the student starts from teacher block 1 and everything else.
  EXPECT_NEAR(*train.at(1).number("loss"), 10.7784, 5e-3);
  EXPECT_NEAR(*train.at(1).number("ce_loss"), 5.3832, 5e-3);
  EXPECT_NEAR(*train.at(1).number("kd_loss"), 4.4e-5, 2e-5);
  EXPECT_NEAR(*train.at(1).number("cos_loss"), 0.011808, 5e-4);
  EXPECT_NEAR(*train.at(10).number("loss"), 9.9448, 5e-3);
  EXPECT_NEAR(*train.at(10).number("kd_loss"), 0.06415, 2e-3);
  const MetricsRecord& last = val.at(10);
  EXPECT_EQ(*last.number("pairs"), 32);
  EXPECT_NEAR(*last.number("mlm_loss"), 4.0921, 5e-3);
  EXPECT_NEAR(*last.number("mlm_acc"), 0.1042, 5e-3);
  EXPECT_NEAR(*last.number("nsp_acc"), 0.5, 5e-3);
  EXPECT_NEAR(*last.number("teacher_loss"), 5.4713, 5e-3);
  EXPECT_NEAR(*last.number("kd_loss"), 0.07654, 2e-3);
  EXPECT_NEAR(*last.number("top1_agree"), 0.3090, 5e-3);
}

// Example b of micro-batch m is example m * B + b of the step, so k micro-batches of B / k are the
// batch of B. The KL and CE are means over the step's scored positions and the cosine a mean over
// its real ones (another count, and for BERT other padding per micro-batch): all must come out
// as for the one batch, with the same gradients (grad_norm and the weights after the run).
TEST_F(DistillRecipe, MicroBatchesGiveTheLossAndGradientsOfOneBatch) {
  const std::string distill = "alpha_kd: 0.7, alpha_ce: 0.2, alpha_cos: 0.4";  // a projection
  const fs::path cfg = write_student("whole", 16, distill);
  ASSERT_EQ(forge("train " + cfg.string() + " train.eval_every=0"), 0);
  ASSERT_EQ(forge("train " + cfg.string() + " train.eval_every=0 train.batch_size=2 "
                  "train.grad_accum=2 output_dir=" + (dir_ / "split").string()),
            0);
  const std::vector<std::string> keys = {"loss", "ce_loss", "kd_loss", "cos_loss", "grad_norm"};
  expect_same_lines(dir_ / "whole", dir_ / "split", keys, 2e-6);
  auto a = saved_tensors(dir_ / "whole"), b = saved_tensors(dir_ / "split");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_TRUE(a.count("cos_projection.weight"));
  for (const auto& [name, values] : a)
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_NEAR(values[i], b.at(name)[i], 1e-5) << name << "[" << i << "]";

  // BERT: a narrower student from its own init, so that the cosine term (through a projection)
  // weighs as much as the others, on documents of one speaker turn, so that pairs are shorter than
  // the context and micro-batches differ in padding and in the share of masked positions among
  // the real ones.
  train_bert_teacher();
  const std::string student = " train.eval_every=0 train.max_steps=3 model.d_model=16 "
                              "distill.init_from_teacher=none distill.teacher_blocks=[] "
                              "distill.alpha_cos=4 bert.paragraphs_per_document=1";
  const fs::path bert = write_bert_student("bert_whole");
  ASSERT_EQ(forge("train " + bert.string() + student), 0);
  ASSERT_EQ(forge("train " + bert.string() + student +
                  " train.batch_size=4 train.grad_accum=2 output_dir=" +
                  (dir_ / "bert_split").string()),
            0);
  expect_same_lines(dir_ / "bert_whole", dir_ / "bert_split",
                    {"loss", "ce_loss", "kd_loss", "cos_loss", "mlm_loss", "nsp_loss", "grad_norm"},
                    2e-6);
  auto c = saved_tensors(dir_ / "bert_whole"), d = saved_tensors(dir_ / "bert_split");
  ASSERT_TRUE(c.count("cos_projection.weight"));
  for (const auto& [name, values] : c)
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_NEAR(values[i], d.at(name)[i], 1e-5) << name << "[" << i << "]";
}

TEST_F(DistillRecipe, TheTeacherStaysUntouchedAndOutOfTheStudentsCheckpoints) {
  const std::string digest = file_digest(teacher_file_, ExitCode::checkpoint);
  const CheckpointInfo teacher_info = read_checkpoint_info(teacher_file_);
  const CheckpointData before = load_checkpoint(teacher_file_, teacher_info.model);
  ASSERT_EQ(forge("train " + write_student("run", 32, "alpha_cos: 1.0").string()), 0);

  EXPECT_EQ(file_digest(teacher_file_, ExitCode::checkpoint), digest);
  const CheckpointData after = load_checkpoint(teacher_file_, teacher_info.model);
  ASSERT_EQ(after.model.size(), before.model.size());
  for (size_t i = 0; i < before.model.size(); ++i)
    EXPECT_EQ(after.model[i].tensor.to_vector<float>(), before.model[i].tensor.to_vector<float>())
        << before.model[i].name;  // bitwise

  // The student's checkpoint: its own 2 blocks, a reference to the teacher, optimizer state for
  // the student's parameters only.
  const CheckpointInfo info = read_checkpoint_info(resolve_checkpoint(dir_ / "run"));
  for (const TensorSpec& t : info.model) {
    EXPECT_EQ(t.name.find("teacher"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("blocks.2."), std::string::npos) << t.name;
  }
  for (const TensorSpec& t : info.optim) EXPECT_EQ(t.name.find("teacher"), std::string::npos);
  ASSERT_EQ(info.references.count("teacher"), 1u);
  EXPECT_EQ(info.references.at("teacher").digest, digest);
  EXPECT_EQ(fs::path(info.references.at("teacher").path), teacher_file_);
  EXPECT_TRUE(info.auxiliary.empty());  // same width: no projection

  // The teacher the evaluations ran was the saved one, unchanged by training: every val line's
  // teacher_loss on the same batches is the same, and the final one is the teacher's own eval.
  auto val = records(dir_ / "run", "val");
  auto [code, out] = forge_output("eval " + teacher_.string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("val_loss " + g6(*val.at(12).number("teacher_loss")) + "\n"),
            std::string::npos)
      << *val.at(12).number("teacher_loss") << " in:\n" << out;
}

TEST_F(DistillRecipe, InitFromTeacherCopiesTheChosenBlocksAndTheRest) {
  const LoadedGPT teacher = load_gpt(teacher_file_);
  std::map<std::string, std::vector<float>> theirs;
  for (const NamedTensor& t : teacher.model->named_state())
    theirs[t.name] = t.tensor.to_vector<float>();
  nn::GPTConfig g = teacher.model->config();
  g.n_layers = 2;
  auto check = [&](const std::vector<int64_t>& blocks) {
    Generator gen(1);
    nn::GPT student(g, gen);
    InitReport report = init_student_from_teacher(student, teacher_file_, blocks);
    const NamedTensors state = student.named_state();
    EXPECT_EQ(report.copied, int64_t(state.size()));
    for (const NamedTensor& t : state) {
      std::string source = t.name;
      for (size_t s = 0; s < blocks.size(); ++s) {
        const std::string prefix = "blocks." + std::to_string(s) + ".";
        if (t.name.rfind(prefix, 0) == 0)
          source = "blocks." + std::to_string(blocks[s]) + "." + t.name.substr(prefix.size());
      }
      EXPECT_EQ(t.tensor.to_vector<float>(), theirs.at(source)) << t.name << " <- " << source;
    }
    // The teacher blocks left out are the only tensors not read.
    for (const std::string& name : report.unexpected) {
      const int64_t block = std::stoll(name.substr(7));
      EXPECT_EQ(std::find(blocks.begin(), blocks.end(), block), blocks.end()) << name;
    }
    const auto per_block = std::count_if(state.begin(), state.end(), [](const NamedTensor& t) {
      return t.name.rfind("blocks.0.", 0) == 0;
    });
    EXPECT_EQ(int64_t(report.unexpected.size()), 2 * per_block);
  };
  check({0, 2});  // every_other
  check({3, 1});  // an explicit list, in any order

  RunConfig config =
      load_config(write_student("every", 32, "init_from_teacher: every_other").string());
  EXPECT_EQ(teacher_blocks_for_student(config, 4), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(teacher_blocks_for_student(config, 3), (std::vector<int64_t>{0, 2}));
  testing::expect_error(ExitCode::usage, "has 2 blocks",
                        [&] { teacher_blocks_for_student(config, 2); });

  // Another width: the first tensor whose shape differs is named, with the file.
  g.d_model = 16;
  Generator gen(1);
  nn::GPT narrow(g, gen);
  testing::expect_error(ExitCode::checkpoint, teacher_file_.string() + ": tensor 'tok_emb.weight'",
                        [&] { init_student_from_teacher(narrow, teacher_file_, {0, 2}); });
}

// A teacher file is untrusted input: a tensor whose block number is malformed, out of range or
// beyond the teacher's model.n_layers is a checkpoint error naming the file and the tensor.
TEST_F(DistillRecipe, ATeacherTensorWithABadBlockNumberIsACheckpointErrorNamingIt) {
  const LoadedGPT teacher = load_gpt(teacher_file_);
  const CheckpointInfo info = read_checkpoint_info(teacher_file_);
  nn::GPTConfig g = teacher.model->config();
  g.n_layers = 2;
  int n = 0;
  for (const std::string block : {"x", "99999999999999999999", "-1", "4", "03"}) {
    CheckpointData data;
    data.step = 1;
    data.config_yaml = info.config_yaml;
    data.model = teacher.model->named_state();
    std::string bad;
    for (NamedTensor& t : data.model)
      if (bad.empty() && t.name.rfind("blocks.3.", 0) == 0) {
        t.name = "blocks." + block + "." + t.name.substr(9);
        bad = t.name;
      }
    const fs::path file = save_checkpoint(dir_ / ("bad_blocks_" + std::to_string(n++)), data, 0);
    Generator gen(1);
    nn::GPT student(g, gen);
    testing::expect_error(ExitCode::checkpoint, file.string() + ": tensor '" + bad + "'",
                          [&] { init_student_from_teacher(student, file, {0, 2}); });
  }
}

TEST_F(DistillRecipe, InitFromTeacherErrorsNameTheKeyOrTheTensor) {
  auto run = [&](const std::string& name, const std::string& distill,
                 const std::string& overrides = "") {
    return forge_output("train " + write_student(name, 32, distill).string() + " " + overrides);
  };
  auto [width, width_out] = run("width", "init_from_teacher: every_other", "model.d_model=16");
  EXPECT_EQ(width, 4) << width_out;
  EXPECT_NE(width_out.find("tok_emb.weight"), std::string::npos) << width_out;
  auto [deep, deep_out] = run("deep", "init_from_teacher: every_other", "model.n_layers=3");
  EXPECT_EQ(deep, 2) << deep_out;
  EXPECT_NE(deep_out.find("every_other takes teacher blocks 0, 2, ..., 4"), std::string::npos)
      << deep_out;
  auto [missing, missing_out] = run("missing", "init_from_teacher: blocks, teacher_blocks: [1, 7]");
  EXPECT_EQ(missing, 2) << missing_out;
  EXPECT_NE(missing_out.find("distill.teacher_blocks: block 7 is not in"), std::string::npos)
      << missing_out;
  auto [count, count_out] = run("count", "init_from_teacher: blocks, teacher_blocks: [1]");
  EXPECT_EQ(count, 2) << count_out;
  EXPECT_NE(count_out.find("names 1 teacher blocks; the student has model.n_layers 2"),
            std::string::npos)
      << count_out;
  auto [stray, stray_out] = run("stray", "teacher_blocks: [1, 2]");
  EXPECT_EQ(stray, 2) << stray_out;
  EXPECT_NE(stray_out.find("read only with distill.init_from_teacher: blocks"), std::string::npos)
      << stray_out;
}

TEST_F(DistillRecipe, VocabularyTokenizerAndFamilyMustBeTheTeachers) {
  const fs::path cfg = write_student("mismatch", 32, "alpha_kd: 1.0");
  const std::string teacher = "distill.teacher '" + teacher_.string() + "' was trained with ";
  for (const auto& [override_, want] : std::vector<std::pair<std::string, std::string>>{
           {"model.vocab_size=300",
            "model.vocab_size: the config says 300, but " + teacher + "256"},
           {"data.tokenizer=gpt2",
            "data.tokenizer: the config says gpt2, but " + teacher + "bytes"},
           {"data.special_tokens=[\"<x>\"]",
            "data.special_tokens: the config says [\"<x>\"], but " + teacher + "[]"},
           {"model.arch=bert", "model.arch: the config says bert, but " + teacher + "gpt"}}) {
    auto [code, out] = forge_output("train " + cfg.string() + " '" + override_ + "'");
    EXPECT_EQ(code, 2) << override_ << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << want << " missing in:\n" << out;
  }
  // Left out, they come from the teacher.
  RunConfig config = load_config(cfg.string());
  EXPECT_EQ(config.model.vocab_size, 256);
  EXPECT_EQ(config.data.tokenizer, "bytes");
}

TEST_F(DistillRecipe, KilledAndResumedRunIsExactAndRefusesAChangedTeacher) {
  const std::string distill = "alpha_cos: 0.5";  // width 16 of 32: a projection, saved and resumed
  ASSERT_EQ(forge("train " + write_student("straight", 16, distill).string()), 0);
  const fs::path killed = write_student("killed", 16, distill);
  EXPECT_EQ(forge("train " + killed.string(), "FORGE_TEST_SIGKILL_AFTER_STEP=5"), 128 + SIGKILL);
  EXPECT_EQ(read_checkpoint_info(*latest_checkpoint(dir_ / "killed")).step, 4);
  ASSERT_EQ(forge("train " + killed.string()), 0);
  const std::vector<std::string> keys = {"loss", "ce_loss", "kd_loss", "cos_loss", "grad_norm"};
  EXPECT_EQ(train_lines(dir_ / "straight", keys), train_lines(dir_ / "killed", keys));
  auto want = saved_tensors(dir_ / "straight");
  EXPECT_EQ(saved_tensors(dir_ / "killed"), want);  // bitwise
  ASSERT_EQ(want.count("cos_projection.weight"), 1u);
  EXPECT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "killed")).auxiliary,
            std::vector<std::string>{"cos_projection"});

  // Another teacher (seed 8) over the teacher's checkpoint file: same path, other weights.
  const fs::path stopped = write_student("stopped", 16, distill);
  ASSERT_EQ(forge("train " + stopped.string() + " train.max_steps=6"), 0);
  ASSERT_EQ(forge("train " + write_teacher("other", 8).string()), 0);
  const std::string old_digest = file_digest(teacher_file_, ExitCode::checkpoint);
  const fs::path other = resolve_checkpoint(dir_ / "other");
  fs::copy_file(other, teacher_file_, fs::copy_options::overwrite_existing);
  fs::copy_file(digest_path(other), digest_path(teacher_file_),
                fs::copy_options::overwrite_existing);
  fs::copy_file(dir_ / "other" / "checkpoints" / "LATEST", teacher_file_.parent_path() / "LATEST",
                fs::copy_options::overwrite_existing);
  const std::string new_digest = file_digest(teacher_file_, ExitCode::checkpoint);
  ASSERT_NE(old_digest, new_digest);
  auto [code, out] = forge_output("train " + stopped.string());
  EXPECT_EQ(code, 4) << out;
  EXPECT_NE(out.find("model 'teacher' was"), std::string::npos) << out;
  EXPECT_NE(out.find("now has digest " + new_digest), std::string::npos) << out;
}

// A bf16 student (train.precision) of a teacher held in bf16 (model.frozen_dtype): the run
// differs from fp32's, ends near its losses and the teacher's, and a killed run resumes bitwise,
// the cosine projection with it.
TEST_F(DistillRecipe, Bf16RunOfABf16TeacherStaysNearFp32AndResumesExactly) {
  const std::string distill = "alpha_cos: 0.5";
  expect_bf16_differs_and_resumes_exactly(
      [&](const std::string& name) { return "train " + write_student(name, 16, distill).string(); },
      " train.precision=bf16 model.frozen_dtype=bf16",
      {"loss", "ce_loss", "kd_loss", "cos_loss", "grad_norm"}, 12, 5);
  if (HasFatalFailure()) return;
  ASSERT_EQ(saved_tensors(dir_ / "bf16").count("cos_projection.weight"), 1u);
  const MetricsRecord fp32 = records(dir_ / "fp32", "val").at(12),
                      last = records(dir_ / "bf16", "val").at(12);
  // Measured: loss 4.78362 in fp32, 4.78353 in bf16 native, 4.78355 emulated; the teacher's
  // 3.54357 in fp32, 3.54364 in bf16; KL 0.56732 in fp32, 0.56714 in bf16 (native and emulated).
  EXPECT_NEAR(*last.number("loss"), *fp32.number("loss"), 1e-3);
  EXPECT_NEAR(*last.number("teacher_loss"), *fp32.number("teacher_loss"), 1e-3);
  EXPECT_NEAR(*last.number("kd_loss"), *fp32.number("kd_loss"), 2e-3);
}

TEST_F(DistillRecipe, EvalGenerateAndValidateOfADistillRun) {
  ASSERT_EQ(forge("train " + write_student("run", 16, "alpha_cos: 0.5").string()), 0);
  auto [code, out] = forge_output("eval " + (dir_ / "run").string());
  ASSERT_EQ(code, 0) << out;
  const MetricsRecord last = records(dir_ / "run", "val").at(12);
  for (const char* key : {"loss", "teacher_loss", "kd_loss", "top1_agree"})
    EXPECT_NE(out.find("val_" + std::string(key) + " " + g6(*last.number(key)) + "\n"),
              std::string::npos)
        << key << " " << g6(*last.number(key)) << " missing in:\n" << out;
  // The student's checkpoint holds the projection beside it; readers of the model skip it.
  auto [gen, text] = forge_output("generate --checkpoint " + (dir_ / "run").string() +
                                  " --prompt Love --max-new-tokens 8 --seed 1");
  EXPECT_EQ(gen, 0) << text;
  EXPECT_EQ(text.rfind("Love", 0), 0u) << text;
  auto [inspected, listing] = forge_output("inspect " + (dir_ / "run").string());
  EXPECT_EQ(inspected, 0) << listing;
  EXPECT_NE(listing.find("auxiliary cos_projection: trained beside the model"), std::string::npos)
      << listing;

  // Trained: the student and the projection; held: the teacher too.
  auto [valid, summary] = forge_output("validate " + (dir_ / "run.yaml").string());
  ASSERT_EQ(valid, 0) << summary;
  const int64_t student = read_checkpoint_info(resolve_checkpoint(dir_ / "run")).model_numel();
  const int64_t teacher = read_checkpoint_info(teacher_file_).model_numel();
  EXPECT_NE(summary.find("# parameters: " + std::to_string(student + teacher) + "\n"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("# trainable parameters: " + std::to_string(student) + " ("),
            std::string::npos)
      << summary;
}

TEST(DistillSection, HoldsEveryKeyOfTheSection) {
  testing::expect_every_key_reaches_its_field<DistillSection>(
      distill_section(),
      "recipe: distill\nmodel: {n_layers: 2}\ndata: {train: x.txt}\ndistill: {teacher: runs/t}\n",
      distill_settings,
      {{{"distill.teacher=runs/other"},
        [](const DistillSection& s) { EXPECT_EQ(s.teacher, "runs/other"); }},
       {{"distill.init_from_teacher=every_other"},
        [](const DistillSection& s) { EXPECT_EQ(s.init_from_teacher, TeacherInit::every_other); }},
       {{"distill.init_from_teacher=blocks", "distill.teacher_blocks=[3, 1]"},
        [](const DistillSection& s) { EXPECT_EQ(s.init_from_teacher, TeacherInit::blocks); }},
       {{"distill.teacher_blocks=[3, 1]", "distill.init_from_teacher=blocks"},
        [](const DistillSection& s) {
          EXPECT_EQ(s.teacher_blocks, (std::vector<int64_t>{3, 1}));
        }},
       {{"distill.temperature=4"}, [](const DistillSection& s) { EXPECT_EQ(s.temperature, 4.0); }},
       {{"distill.alpha_ce=0.25"}, [](const DistillSection& s) { EXPECT_EQ(s.alpha_ce, 0.25); }},
       {{"distill.alpha_kd=0.75"}, [](const DistillSection& s) { EXPECT_EQ(s.alpha_kd, 0.75); }},
       {{"distill.alpha_cos=1"}, [](const DistillSection& s) { EXPECT_EQ(s.alpha_cos, 1.0); }},
       {{"distill.kl=reverse"}, [](const DistillSection& s) { EXPECT_TRUE(s.reverse_kl); }}});
  const DistillSection defaults = distill_settings(load_config_string(
      "recipe: distill\ndata: {train: x.txt}\ndistill: {teacher: runs/t}\n", "x.yaml", {},
      ConfigFiles::skip));
  EXPECT_EQ(defaults.init_from_teacher, TeacherInit::none);
  EXPECT_FALSE(defaults.reverse_kl);
}

}  // namespace
}  // namespace forge
