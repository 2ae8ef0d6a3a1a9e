// The run directory seen from the command line, with the real binary: stop requests honoured
// inside evaluations, samples and the report (raised deterministically by the FORGE_TEST_RAISE
// hook), the directory lock, an output_dir that cannot be created or is not a run, and every error
// or warning printed as one line whatever bytes it quotes.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/checkpoint.h"
#include "runtime/metrics.h"
#include "runtime/run_directory.h"
#include "tests/recipes/recipe_test.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class RunDirectory : public testing::RecipeTest {
 protected:
  // A tiny GPT run of 30 steps, evaluated and saved every 10.
  fs::path write_config(const std::string& name) {
    fs::path out = dir_ / name;
    std::ofstream(dir_ / (name + ".yaml"))
        << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << out.string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
           "n_heads: 2}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "train: {batch_size: 4, max_steps: 30, eval_every: 10, eval_batches: 2, save_every: 10,"
           " log_every: 5, sample_tokens: 8}\n";
    return dir_ / (name + ".yaml");
  }

  struct Output {
    int code;
    std::string out, err;
  };
  // Runs the binary like forge(), keeping what it printed.
  Output run(const std::string& args, const std::string& env = "") {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd = env + " " + FORGE_BINARY + " " + args + " >" + out.string() + " 2>" +
                      err.string();
    int status = std::system(cmd.c_str());
    return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status), read(out), read(err)};
  }
  static std::string read(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // The lines of `text` that contain `part`.
  static std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (line.find(part) != std::string::npos) out.push_back(line);
    return out;
  }
  static std::vector<int64_t> val_steps(const fs::path& run) {
    std::vector<int64_t> steps;
    for (const auto& r : read_metrics(run / "metrics.jsonl"))
      if (r.split == "val") steps.push_back(r.step);
    return steps;
  }
};

TEST_F(RunDirectory, SigintDuringAPeriodicEvaluationSavesThatStepAndExits130) {
  fs::path cfg = write_config("eval");
  Output o = run("train " + cfg.string() + " train.save_every=0", "FORGE_TEST_RAISE=SIGINT@eval");
  EXPECT_EQ(o.code, 130) << o.err;
  EXPECT_EQ(latest_checkpoint(dir_ / "eval"), checkpoint_path(dir_ / "eval", 10));
  EXPECT_EQ(val_steps(dir_ / "eval"), (std::vector<int64_t>{}));
  EXPECT_EQ(lines_with(o.err, "forge: stopped by SIGINT at step 10").size(), 1u) << o.err;
}

// Each recipe's evaluation stops between batches, keeping what it needs to return (BERT's metrics
// need one batch of pairs).
TEST_F(RunDirectory, BertStopsInsideItsEvaluation) {
  std::ofstream(dir_ / "bert.yaml")
      << "recipe: bert_pretrain\noutput_dir: " << (dir_ / "bert").string() << "\n"
      << "model: {arch: bert, vocab_size: 260, context: 32, d_model: 16, n_layers: 1, n_heads: 2}\n"
      << "data: {tokenizer: bytes, special_tokens: ['[PAD]', '[CLS]', '[SEP]', '[MASK]'], train: "
      << (dir_ / "corpus.txt").string() << ", val_fraction: 0.1}\n"
      << "bert: {paragraphs_per_document: 5, eval_pairs: 64}\n"
      << "train: {batch_size: 4, max_steps: 4, eval_every: 2, eval_batches: 2, log_every: 1}\n";
  Output o = run("train " + (dir_ / "bert.yaml").string(), "FORGE_TEST_RAISE=SIGTERM@eval");
  EXPECT_EQ(o.code, 143) << o.err;
  EXPECT_EQ(latest_checkpoint(dir_ / "bert"), checkpoint_path(dir_ / "bert", 2));
  o = run("train " + (dir_ / "bert.yaml").string(), "FORGE_TEST_RAISE=SIGTERM@final_eval");
  EXPECT_EQ(o.code, 143) << o.err;
  EXPECT_EQ(latest_checkpoint(dir_ / "bert"), checkpoint_path(dir_ / "bert", 4));
}

TEST_F(RunDirectory, SigtermDuringASampleSavesThatStepAndExits143) {
  fs::path cfg = write_config("sample");
  Output o = run("train " + cfg.string() + " train.save_every=0 train.sample_every=10",
                 "FORGE_TEST_RAISE=SIGTERM@sample");
  EXPECT_EQ(o.code, 143) << o.err;
  EXPECT_EQ(latest_checkpoint(dir_ / "sample"), checkpoint_path(dir_ / "sample", 10));
  EXPECT_TRUE(lines_with(o.err, "--- sample").empty()) << o.err;  // cut short: not shown
}

TEST_F(RunDirectory, SigtermDuringTheFinalEvaluationIsFinishedByTheSameCommand) {
  fs::path cfg = write_config("final");
  Output o = run("train " + cfg.string(), "FORGE_TEST_RAISE=SIGTERM@final_eval");
  EXPECT_EQ(o.code, 143) << o.err;
  EXPECT_EQ(latest_checkpoint(dir_ / "final"), checkpoint_path(dir_ / "final", 30));
  EXPECT_EQ(val_steps(dir_ / "final"), (std::vector<int64_t>{10, 20}));
  EXPECT_FALSE(fs::exists(dir_ / "final" / "report.html"));
  o = run("train " + cfg.string());
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(val_steps(dir_ / "final"), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_TRUE(fs::exists(dir_ / "final" / "report.html"));
  EXPECT_NE(o.out.find("--- sample"), std::string::npos);
}

TEST_F(RunDirectory, SigintWhileTheReportIsWrittenExits130WithoutTheSample) {
  fs::path cfg = write_config("report");
  Output o = run("train " + cfg.string(), "FORGE_TEST_RAISE=SIGINT@report");
  EXPECT_EQ(o.code, 130) << o.err;
  EXPECT_TRUE(fs::exists(dir_ / "report" / "report.html"));
  EXPECT_EQ(o.out.find("--- sample"), std::string::npos);
  EXPECT_EQ(run("train " + cfg.string()).code, 0);  // complete
}

TEST_F(RunDirectory, ASecondTrainerExits2NamingTheDirectoryAndTheHolder) {
  fs::path cfg = write_config("locked");
  fs::create_directories(dir_ / "locked");
  std::ofstream(dir_ / "locked" / kRunMarker) << "";  // the holder made the directory a run
  int fd = ::open((dir_ / "locked" / "train.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const std::string pid = std::to_string(::getpid());
  ASSERT_EQ(::write(fd, (pid + "\n").data(), pid.size() + 1), ssize_t(pid.size() + 1));
  Output o = run("train " + cfg.string());
  ::close(fd);
  EXPECT_EQ(o.code, 2);
  EXPECT_EQ(o.err, "forge: usage error: " + (dir_ / "locked").string() +
                       ": in use by another forge train (pid " + pid + ", holding " +
                       (dir_ / "locked" / "train.lock").string() +
                       "); wait for it or stop it, or choose another output_dir\n");
  EXPECT_EQ(run("train " + cfg.string() + " train.max_steps=2").code, 0);  // released
}

TEST_F(RunDirectory, AnOutputDirThatCannotBeCreatedIsAUsageError) {
  fs::path cfg = write_config("x");
  std::ofstream(dir_ / "a_file") << "not a directory";
  Output o = run("train " + cfg.string() + " output_dir=" + (dir_ / "a_file" / "run").string());
  EXPECT_EQ(o.code, 2);
  EXPECT_EQ(o.err, "forge: usage error: output_dir " + (dir_ / "a_file" / "run").string() +
                       ": cannot create the run directory: Not a directory\n");
  // A file where the run directory would be is found with the config, so validate reports it too.
  const std::string file = (dir_ / "a_file").string();
  for (const char* command : {"train ", "validate "}) {
    o = run(command + cfg.string() + " output_dir=" + file);
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(o.err, "forge: config error: override 'output_dir=" + file + "': output_dir: '" +
                         file + "' exists and is not a directory\n");
  }
}

// An output_dir holding the user's files is refused with one line saying how to go on, and nothing
// is written into it; with --use-existing-dir the run goes in beside them, a run from then on.
TEST_F(RunDirectory, ADirectoryThatIsNotARunIsRefusedUnlessTheUserSaysSo) {
  fs::path cfg = write_config("mine");
  const fs::path mine = dir_ / "mine";
  fs::create_directories(mine);
  std::ofstream(mine / "notes.txt") << "mine\n";
  Output o = run("train " + cfg.string() + " train.max_steps=2");
  EXPECT_EQ(o.code, 2);
  EXPECT_EQ(o.err, "forge: usage error: output_dir " + mine.string() +
                       ": exists, is not empty and is not a Forge run directory (it has no "
                       ".forge-run); choose a new or empty output_dir, or give forge train "
                       "--use-existing-dir to train into it anyway\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(mine), fs::directory_iterator()), 1);
  o = run("train " + cfg.string() + " train.max_steps=2 --use-existing-dir");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(read(mine / "notes.txt"), "mine\n");
  EXPECT_TRUE(fs::is_regular_file(mine / kRunMarker));
  EXPECT_EQ(run("train " + cfg.string() + " train.max_steps=4").code, 0);  // a run now
  EXPECT_EQ(latest_checkpoint(mine), checkpoint_path(mine, 4));
}

// Bytes a user or a corrupt file put in a message (a newline in a value, terminal escapes in
// LATEST) come out escaped, on the one line of the error or warning.
TEST_F(RunDirectory, ErrorsAndWarningsQuotingHostileBytesStayOnePrintableLine) {
  fs::path cfg = write_config("hostile");
  Output o = run("train " + cfg.string() + " 'data.train=" + (dir_ / "no\nsuch").string() + "'");
  EXPECT_EQ(o.code, 2);
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  EXPECT_NE(o.err.find("no\\nsuch"), std::string::npos) << o.err;

  ASSERT_EQ(run("train " + cfg.string() + " train.max_steps=20").code, 0);
  std::ofstream(dir_ / "hostile" / "checkpoints" / "LATEST") << "\x1b]0;owned\x07\x1b[2J\tx\n";
  o = run("train " + cfg.string());  // falls back to step 20 with a warning
  EXPECT_EQ(o.code, 0) << o.err;
  std::vector<std::string> warnings = lines_with(o.err, "forge: warning:");
  ASSERT_EQ(warnings.size(), 1u) << o.err;
  EXPECT_NE(warnings[0].find("\\x1b]0;owned\\x07\\x1b[2J\\tx"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("using step-000020.h5 instead"), std::string::npos) << warnings[0];
  EXPECT_EQ(o.err.find('\x1b'), std::string::npos);

  fs::remove(checkpoint_path(dir_ / "hostile", 10));
  fs::remove(checkpoint_path(dir_ / "hostile", 20));
  fs::remove(checkpoint_path(dir_ / "hostile", 30));
  std::ofstream(dir_ / "hostile" / "checkpoints" / "LATEST") << "\x1b[2Jstep\r\x9b" "1m";
  o = run("inspect " + (dir_ / "hostile").string());
  EXPECT_EQ(o.code, 4);
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  EXPECT_EQ(o.err.find_first_of("\x1b\r\x9b"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace forge
