// check_output_path (core/output_path.h) and the temp files of core/durable_file.h: every way an
// output can be an input (the same path, a symlink, a hard link, a file inside an input directory,
// a directory holding an input), outputs that are not regular files, and a refused rename that
// leaves nothing behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/output_path.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class OutputPath : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forge_output_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "run" / "checkpoints");
    std::ofstream(dir_ / "run" / "checkpoints" / "step-1.h5") << "weights";
    std::ofstream(dir_ / "prompts.txt") << "To be\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The message of the refusal, or "" when the output is accepted.
  std::string refusal(const fs::path& output, OutputShape shape = OutputShape::file) {
    try {
      check_output_path("export: --output", output, {dir_ / "run", dir_ / "prompts.txt"}, shape);
      return "";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
      return e.what();
    }
  }

  fs::path dir_;
};

TEST_F(OutputPath, AcceptsANewFileAndReplacingAnUnrelatedOne) {
  EXPECT_EQ(refusal(dir_ / "out.gguf"), "");
  std::ofstream(dir_ / "old.gguf") << "old";
  EXPECT_EQ(refusal(dir_ / "old.gguf"), "");
  EXPECT_EQ(refusal(dir_ / "hf", OutputShape::directory), "");
}

TEST_F(OutputPath, RefusesAnInputByPathSymlinkOrHardLink) {
  EXPECT_NE(refusal(dir_ / "prompts.txt").find("is the input"), std::string::npos);
  EXPECT_NE(refusal(dir_ / "." / "prompts.txt").find("is the input"), std::string::npos);
  fs::create_symlink(dir_ / "prompts.txt", dir_ / "link.txt");
  EXPECT_NE(refusal(dir_ / "link.txt").find("is the input"), std::string::npos);
  fs::create_hard_link(dir_ / "prompts.txt", dir_ / "hard.txt");
  EXPECT_NE(refusal(dir_ / "hard.txt").find("the same file"), std::string::npos);
  // A hard link to a file inside an input directory.
  fs::create_hard_link(dir_ / "run" / "checkpoints" / "step-1.h5", dir_ / "step.h5");
  EXPECT_NE(refusal(dir_ / "step.h5").find("is a link to"), std::string::npos);
}

TEST_F(OutputPath, RefusesAnythingInsideAnInputDirectoryOrADirectoryHoldingAnInput) {
  EXPECT_NE(refusal(dir_ / "run" / "checkpoints" / "step-1.h5").find("inside the input"),
            std::string::npos);
  EXPECT_NE(refusal(dir_ / "run" / "new.gguf").find("inside the input"), std::string::npos);
  EXPECT_NE(refusal(dir_ / "run", OutputShape::directory).find("is the input"),
            std::string::npos);
  EXPECT_NE(refusal(dir_, OutputShape::directory).find("holds the input"), std::string::npos);
  // A sibling whose name starts like the input's is not inside it.
  EXPECT_EQ(refusal(dir_ / "run2.gguf"), "");
}

TEST_F(OutputPath, RefusesWhatIsNotARegularFileAndAMissingDirectory) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_NE(refusal(dir_ / "fifo").find("not a regular file"), std::string::npos);
  EXPECT_NE(refusal("/dev/null").find("not a regular file"), std::string::npos);
  fs::create_directories(dir_ / "d");
  EXPECT_NE(refusal(dir_ / "d").find("is a directory"), std::string::npos);
  std::ofstream(dir_ / "file") << "x";
  EXPECT_NE(refusal(dir_ / "file", OutputShape::directory).find("not a directory"),
            std::string::npos);
  EXPECT_NE(refusal(dir_ / "missing" / "out.gguf").find("no directory"), std::string::npos);
}

TEST(DurableFile, ARefusedRenameLeavesNoTempFileAndAUsersTmpFileIsKept) {
  const fs::path dir = fs::temp_directory_path() / ("forge_durable_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "target" / "child");  // rename(2) cannot replace a non-empty dir
  std::ofstream(dir / "target.tmp") << "the user's own file";
  EXPECT_THROW(write_file_atomic(dir / "target", "content", ExitCode::usage), Error);
  const auto entries = std::distance(fs::directory_iterator(dir), fs::directory_iterator());
  EXPECT_EQ(entries, 2);  // target/ and target.tmp, nothing else
  std::ifstream in(dir / "target.tmp");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "the user's own file");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
