// Data parallelism under mpirun, run as users run it: `mpirun -np 2 forge train` trains what one
// process trains (losses and weights), writes the run directory from rank 0 alone, stops every
// rank at one checkpoint when one rank gets a signal and resumes exactly, ends in bounded time
// when a rank dies, reports a config error once, and stops ranks started with different configs
// at set-up. Needs Open MPI's mpirun (scripts/setup.sh
// installs it); a build without MPI skips these tests.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class Distributed : public testing::RecipeTest {
 protected:
  void SetUp() override {
#ifndef FORGE_HAVE_MPI
    GTEST_SKIP() << "this build has no MPI";
#endif
    RecipeTest::SetUp();
  }

  // The parity tests give each rank and the single process the same number of threads: oneDNN's
  // AVX2 matmul sums in an order that depends on it (docs/distributed.md), and then one process on
  // 2 threads and 2 ranks on 1 thread each differ in the last bits, which 12 AdamW steps enlarge.
  static constexpr const char* kOneThread = "OMP_NUM_THREADS=1";

  // A 2-layer byte GPT with dropout (whose masks must follow the micro-batch, not the rank), two
  // micro-batches per step, a train line, a weight check across ranks at every step.
  fs::path write_gpt_config(const std::string& name, const std::string& extra = "") {
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: gpt_pretrain\nseed: 5\noutput_dir: " << (dir_ / name).string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 32, d_model: 32, n_layers: 2, "
           "n_heads: 2, dropout: 0.1}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 3, grad_accum: 2, max_steps: 12, eval_every: 4, eval_batches: 2, "
           "save_every: 4, log_every: 1, sample_tokens: 4, allreduce_bucket_mb: 0.01}\n"
        << extra;
    return dir_ / (name + ".yaml");
  }

  // `forge ARGS` on `ranks` ranks under mpirun (the forge binary re-executes itself, as it does
  // alone); its exit code and output. Ended after `timeout_s` (exit 124) so that a hang fails the
  // test. ARGS may go on with `: -np N forge ...` for more ranks that run something else.
  std::pair<int, std::string> mpirun(const std::string& args, const std::string& env = "",
                                     int timeout_s = 120, int ranks = 2) {
    const fs::path out = dir_ / "mpirun.out";
    // For the sanitized build (scripts/test_sanitized): Open MPI's start-up allocations outlive
    // MPI_Finalize, which LeakSanitizer would report, and its memory patcher (a cache of RDMA
    // registrations, unused on one machine) overwrites sanitizer entry points.
    const std::string cmd = "ASAN_OPTIONS=halt_on_error=1:detect_leaks=0 OMPI_MCA_memory=^patcher " + env +
                            " timeout -k 10 " + std::to_string(timeout_s) +
                            " mpirun --allow-run-as-root --oversubscribe -np " +
                            std::to_string(ranks) + " " + FORGE_BINARY +
                            " " + args + " >" + out.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(out, std::ios::binary);
    return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status),
            std::string(std::istreambuf_iterator<char>(in), {})};
  }

  // The config `body` with output_dir <dir>/name, as <dir>/name.yaml.
  std::string write_config(const std::string& name, const std::string& body) {
    std::ofstream(dir_ / (name + ".yaml")) << "output_dir: " << (dir_ / name).string() << "\n"
                                           << body;
    return (dir_ / (name + ".yaml")).string();
  }

  // Trains the config `body` alone (<dir>/single) and on 2 ranks (<dir>/two): the same losses and
  // weights.
  void expect_two_ranks_train_like_one(const std::string& body) {
    ASSERT_EQ(forge("train " + write_config("single", body), kOneThread), 0);
    auto [code, out] = mpirun("train " + write_config("two", body), kOneThread);
    ASSERT_EQ(code, 0) << out;
    expect_same_losses(dir_ / "single", dir_ / "two");
    expect_same_weights(dir_ / "single", dir_ / "two");
  }

  static size_t count(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
    return n;
  }

  static std::set<std::string> files_of(const fs::path& run) {
    std::set<std::string> names;
    for (const auto& entry : fs::recursive_directory_iterator(run))
      names.insert(fs::relative(entry.path(), run).string());
    return names;
  }

  // Every tensor bitwise equal.
  static void expect_same_weights(const fs::path& a, const fs::path& b) {
    const auto wa = saved_tensors(a), wb = saved_tensors(b);
    ASSERT_EQ(wa.size(), wb.size());
    for (const auto& [name, x] : wa) EXPECT_EQ(x, wb.at(name)) << name;
  }

  // The checkpoints of `step` hold bitwise the same weights and optimizer state.
  static void expect_same_checkpoint(const fs::path& a, const fs::path& b, int step) {
    const std::vector<TensorSpec> model =
        read_checkpoint_info(checkpoint_path(a, step)).model;
    const CheckpointData x = load_checkpoint(checkpoint_path(a, step), model);
    const CheckpointData y = load_checkpoint(checkpoint_path(b, step), model);
    for (const NamedTensors* t : {&x.model, &x.optim}) {
      const NamedTensors& other = t == &x.model ? y.model : y.optim;
      ASSERT_EQ(t->size(), other.size()) << b << " step " << step;
      for (size_t i = 0; i < t->size(); ++i) {
        EXPECT_EQ((*t)[i].name, other[i].name);
        EXPECT_EQ(tensor_bytes((*t)[i].tensor), tensor_bytes(other[i].tensor))
            << b << " step " << step << ": " << (*t)[i].name;
      }
    }
  }
  static std::string tensor_bytes(const Tensor& t) {
    const Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.raw_data()), size_t(c.numel()) * dtype_size(c.dtype()));
  }

  // Every train and val loss bitwise equal.
  static void expect_same_losses(const fs::path& a, const fs::path& b) {
    for (const char* split : {"train", "val"}) {
      const auto la = losses(a, split), lb = losses(b, split);
      ASSERT_FALSE(la.empty()) << split;
      EXPECT_EQ(la, lb) << split;
    }
  }
};

TEST_F(Distributed, TwoRanksTrainWhatOneProcessTrainsAndOnlyRankZeroWrites) {
  ASSERT_EQ(forge("train " + write_gpt_config("single").string(), kOneThread), 0);
  auto [code, out] = mpirun("train " + write_gpt_config("two").string(), kOneThread);
  ASSERT_EQ(code, 0) << out;
  expect_same_losses(dir_ / "single", dir_ / "two");
  expect_same_weights(dir_ / "single", dir_ / "two");
  // The same files (rank 1 wrote none of its own), each message once.
  EXPECT_EQ(files_of(dir_ / "single"), files_of(dir_ / "two"));
  EXPECT_EQ(count(out, "saved "), 3u) << out;
  EXPECT_EQ(count(out, ": val loss"), 3u) << out;
  // Train lines say how long the step waited for the gradients' all-reduce.
  EXPECT_EQ(losses(dir_ / "two", "train", "allreduce_wait_s").size(), 12u);
}

// SIGTERM reaches rank 1 alone, during the evaluation of step 4: both ranks stop there, rank 0
// saves, both exit 143; the same command resumes under mpirun and ends where an uninterrupted
// 2-rank run ends.
TEST_F(Distributed, ASignalOnOneRankStopsAllAtOneCheckpointAndResumeIsExact) {
  auto [whole_code, whole_out] = mpirun("train " + write_gpt_config("whole").string());
  ASSERT_EQ(whole_code, 0) << whole_out;
  const std::string config = write_gpt_config("stopped").string();
  auto [code, out] = mpirun("train " + config, "FORGE_TEST_RANK=1 FORGE_TEST_RAISE=SIGTERM@eval");
  ASSERT_EQ(code, 143) << out;
  EXPECT_EQ(count(out, "forge: stopped by SIGTERM at step 4"), 1u) << out;
  EXPECT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "stopped")).step, 4);
  auto [resumed, resumed_out] = mpirun("train " + config);
  ASSERT_EQ(resumed, 0) << resumed_out;
  EXPECT_EQ(train_lines(dir_ / "stopped", {"loss", "grad_norm", "lr"}),
            train_lines(dir_ / "whole", {"loss", "grad_norm", "lr"}));
  expect_same_weights(dir_ / "whole", dir_ / "stopped");
}

// Rank 1 dies by SIGKILL after step 3: mpirun ends rank 0 too, well before the timeout, and says
// which rank died.
TEST_F(Distributed, ARankThatDiesEndsTheJobInBoundedTime) {
  auto [code, out] = mpirun("train " + write_gpt_config("killed").string(),
                            "FORGE_TEST_RANK=1 FORGE_TEST_SIGKILL_AFTER_STEP=3", 60);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, 124) << "timed out: " << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
}

// An error on rank 1 alone during training (rank 0 waits in a reduction for it): the job ends with
// its exit code, and the message names the rank.
TEST_F(Distributed, AnErrorOnOneRankEndsTheJobWithItsCode) {
  auto [code, out] = mpirun("train " + write_gpt_config("failed").string(),
                            "FORGE_TEST_RANK=1 FORGE_TEST_RAISE=ERROR@eval", 60);
  EXPECT_EQ(code, 3) << out;
  EXPECT_EQ(count(out, "forge: rank 1: data error: FORGE_TEST_RAISE: an error at eval"), 1u)
      << out;
  // The same during set-up, before the ranks' first agreement: reported once by the rank that
  // failed, and rank 0, whose set-up succeeded, ends with the same code.
  auto [setup, setup_out] = mpirun("train " + write_gpt_config("setup").string(),
                                   "FORGE_TEST_RANK=1 FORGE_TEST_RAISE=ERROR@setup", 60);
  EXPECT_EQ(setup, 3) << setup_out;
  EXPECT_EQ(count(setup_out, "forge: data error: FORGE_TEST_RAISE: an error at setup"), 1u)
      << setup_out;
}

TEST_F(Distributed, SetUpErrorsAreReportedOnceWithTheExitCode) {
  auto [code, out] = mpirun("train " + write_gpt_config("typo", "seeed: 3\n").string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(count(out, "unknown key 'seeed'"), 1u) << out;
  // A global batch the ranks cannot share names the keys that can.
  auto [accum, accum_out] = mpirun("train " + write_gpt_config("odd").string() +
                                   " train.grad_accum=1 train.batch_size=6");
  EXPECT_EQ(accum, 2) << accum_out;
  EXPECT_EQ(count(accum_out, "train.grad_accum = 1 is not a multiple of the 2 ranks"), 1u)
      << accum_out;
  EXPECT_NE(accum_out.find("set train.batch_size=3 train.grad_accum=2"), std::string::npos)
      << accum_out;
}

// Ranks started with different configs (another learning rate on rank 1) used to train apart until
// the weight check ended them with an internal error: they stop at set-up, before any step, with
// one usage error naming the rank and the key.
TEST_F(Distributed, RanksStartedWithDifferentConfigsStopAtSetUp) {
  const std::string config = write_gpt_config("apart").string();
  auto [code, out] = mpirun("train " + config + " : -np 1 " + FORGE_BINARY + " train " + config +
                                " optimizer.lr=1.0e-3",
                            "", 60, 1);
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(count(out, "forge: usage error: rank 1 resolved another config than rank 0 "
                       "(optimizer.lr: 0.003 on rank 0)"),
            1u)
      << out;
  EXPECT_FALSE(fs::exists(dir_ / "apart" / "metrics.jsonl"));
}

// ZeRO-1 (train.shard_optimizer): each rank keeps AdamW's state of half the parameters, and the run
// is bitwise the unsharded 2-rank run's and one process's: losses, gradient norms (clipping at 0.02
// acts in every step), weights and the whole optimizer state in every checkpoint. Weight decay,
// per-layer learning rates, a group frozen for the whole run, and gradual unfreezing (lower blocks
// are not reached by backward until their step, and then count their own AdamW steps).
TEST_F(Distributed, ShardedOptimizerStateTrainsWhatPlainDataParallelismTrains) {
  const std::string keys =
      " optimizer.weight_decay=0.1 optimizer.layer_lr_decay=2.0 optimizer.unfreeze_every=3"
      " 'optimizer.freeze=[\"blocks.0.attn.*\"]' train.clip_grad_norm=0.02";
  ASSERT_EQ(forge("train " + write_gpt_config("single").string() + keys, kOneThread), 0);
  auto [code, out] = mpirun("train " + write_gpt_config("two").string() + keys, kOneThread);
  ASSERT_EQ(code, 0) << out;
  auto [sharded, sharded_out] = mpirun(
      "train " + write_gpt_config("sharded").string() + keys + " train.shard_optimizer=true",
      kOneThread);
  ASSERT_EQ(sharded, 0) << sharded_out;
  for (const char* run : {"single", "two"}) {
    expect_same_losses(dir_ / run, dir_ / "sharded");
    EXPECT_EQ(losses(dir_ / run, "train", "grad_norm"), losses(dir_ / "sharded", "train", "grad_norm"))
        << run;
    for (int step : {4, 8, 12}) expect_same_checkpoint(dir_ / run, dir_ / "sharded", step);
  }
  for (const auto& [step, norm] : losses(dir_ / "sharded", "train", "grad_norm"))
    EXPECT_GT(norm, 0.02) << "clipping must act at step " << step;
}

// A sharded 2-rank run killed after step 6 resumes from step 4 exactly: on 2 ranks sharded, and in
// one process sharded or not. An unsharded checkpoint resumes sharded.
TEST_F(Distributed, ShardedOptimizerStateResumesOnAnyNumberOfRanks) {
  ASSERT_EQ(forge("train " + write_gpt_config("whole").string(), kOneThread), 0);
  const std::string sharded = " train.shard_optimizer=true";
  auto [killed, killed_out] = mpirun("train " + write_gpt_config("killed").string() + sharded,
                                     "FORGE_TEST_RANK=1 FORGE_TEST_SIGKILL_AFTER_STEP=6", 60);
  ASSERT_NE(killed, 0) << killed_out;
  ASSERT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "killed")).step, 4);
  for (const char* alone : {"alone_sharded", "alone"}) {
    fs::copy(dir_ / "killed", dir_ / alone, fs::copy_options::recursive);
    ASSERT_EQ(forge("train " + write_gpt_config(alone).string() +
                        (std::string(alone) == "alone" ? "" : sharded),
                    kOneThread),
              0);
  }
  auto [resumed, resumed_out] =
      mpirun("train " + write_gpt_config("killed").string() + sharded, kOneThread);
  ASSERT_EQ(resumed, 0) << resumed_out;
  // One process killed after step 6, resumed sharded on 2 ranks.
  ASSERT_NE(forge("train " + write_gpt_config("unsharded").string(),
                  std::string(kOneThread) + " FORGE_TEST_SIGKILL_AFTER_STEP=6"),
            0);
  auto [moved, moved_out] =
      mpirun("train " + write_gpt_config("unsharded").string() + sharded, kOneThread);
  ASSERT_EQ(moved, 0) << moved_out;
  for (const char* run : {"killed", "alone_sharded", "alone", "unsharded"}) {
    expect_same_losses(dir_ / "whole", dir_ / run);
    EXPECT_EQ(losses(dir_ / "whole", "train", "grad_norm"), losses(dir_ / run, "train", "grad_norm"))
        << run;
    expect_same_checkpoint(dir_ / "whole", dir_ / run, 12);
  }
}

// Only AdamW's state is sharded.
TEST_F(Distributed, ShardingAnotherOptimizerIsAConfigError) {
  auto [code, out] = mpirun("train " + write_gpt_config("sgd").string() +
                            " optimizer.name=sgd train.shard_optimizer=true");
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(count(out, "train.shard_optimizer shards AdamW's state only; optimizer.name is 'sgd'"),
            1u)
      << out;
}

// BERT: a step's MLM loss is scaled by the masked positions of all its micro-batches, which each
// rank finds from the step's batches although it runs only some of them.
TEST_F(Distributed, BertTrainsWhatOneProcessTrains) {
  expect_two_ranks_train_like_one(
      "recipe: bert_pretrain\nseed: 11\n"
      "model: {arch: bert, vocab_size: 260, context: 64, d_model: 32, n_layers: 2, n_heads: 2, "
      "ffn_mult: 2, dropout: 0.1, norm_eps: 1.0e-12}\n"
      "data: {tokenizer: bytes, special_tokens: ['[PAD]', '[CLS]', '[SEP]', '[MASK]'], train: " +
      (dir_ / "corpus.txt").string() + ", val_fraction: 0.1}\n" +
      "bert: {paragraphs_per_document: 5, eval_pairs: 32}\n"
      "optimizer: {name: adamw, lr: 2.0e-3, weight_decay: 0.01}\n"
      "train: {batch_size: 4, grad_accum: 2, max_steps: 6, eval_every: 3, eval_batches: 2, "
      "log_every: 1}\n");
}

// Distillation: a step's KD loss is normalised by totals over all its micro-batches, and a frozen
// teacher (the tiny base) runs beside the student on every rank.
TEST_F(Distributed, DistillationTrainsWhatOneProcessTrains) {
  train_tiny_base(32);
  expect_two_ranks_train_like_one(
      "recipe: distill\nseed: 3\n"
      "model: {arch: gpt, context: 32, d_model: 16, n_layers: 1, n_heads: 2, dropout: 0.1}\n"
      "data: {train: " + (dir_ / "corpus.txt").string() + ", val_fraction: 0.1}\n" +
      "distill: {teacher: " + (dir_ / "base").string() + ", alpha_cos: 0.5}\n" +
      "optimizer: {name: adamw, lr: 3.0e-3}\n"
      "train: {batch_size: 2, grad_accum: 2, max_steps: 6, eval_every: 3, eval_batches: 2, "
      "log_every: 1, sample_tokens: 2}\n");
}

// A loader with a cursor (SFT records, LoRA adapters): each rank skips the other's micro-batches,
// so both ranks' cursors stay where one process's is, and the checkpoint holds the same cursor.
TEST_F(Distributed, ALoaderCursorAdvancesOverTheOtherRanksMicroBatches) {
  train_tiny_base(32);
  std::string records;
  for (int i = 0; i < 24; ++i)
    records += R"({"prompt": "Count )" + std::to_string(i) + R"(:", "completion": " )" +
               std::string(size_t(1 + i % 5), char('a' + i % 7)) + "\"}\n";
  testing::write_file(dir_ / "sft.jsonl", records);
  expect_two_ranks_train_like_one(
      "recipe: finetune\nseed: 3\n"
      "model: {init_from: " + (dir_ / "base").string() + "}\n" +
      "data: {train: " + (dir_ / "sft.jsonl").string() + ", val_fraction: 0.25}\n" +
      "optimizer: {name: adamw, lr: 3.0e-3}\n"
      "train: {batch_size: 2, grad_accum: 2, max_steps: 8, save_every: 4, log_every: 1, "
      "sample_tokens: 2}\n"
      "lora: {rank: 4, alpha: 8}\n");
  EXPECT_EQ(read_checkpoint_info(resolve_checkpoint(dir_ / "single")).counters,
            read_checkpoint_info(resolve_checkpoint(dir_ / "two")).counters);
}

}  // namespace
}  // namespace forge
