// The forge binary refuses inputs that are not regular files (/dev/zero, a FIFO) promptly and with
// the exit code of the input's kind, instead of reading until memory runs out or blocking.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge::testing {
namespace {

class Inputs : public RecipeTest {
 protected:
  // Runs forge under a timeout (exit 124 if it hangs); returns the exit code, output in `out`.
  int run(const std::string& args, std::string& out) {
    const auto file = dir_ / "out.txt";
    std::string cmd = "timeout 30 " + std::string(FORGE_BINARY) + " " + args + " >" +
                      file.string() + " 2>&1 </dev/null";
    int status = std::system(cmd.c_str());
    out = read_file(file);
    return WEXITSTATUS(status);
  }
  std::string fifo() {
    const std::string path = (dir_ / "pipe").string();
    if (!std::filesystem::exists(path)) {
      EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
    }
    return path;
  }
};

TEST_F(Inputs, ConfigThatIsNotARegularFileIsAConfigError) {
  std::string out;
  EXPECT_EQ(run("train /dev/zero", out), 2) << out;
  EXPECT_NE(out.find("/dev/zero: not a regular file"), std::string::npos) << out;
  EXPECT_EQ(run("validate " + fifo(), out), 2) << out;
  EXPECT_NE(out.find(fifo() + ": not a regular file"), std::string::npos) << out;
}

TEST_F(Inputs, DataThatIsNotARegularFileIsRefusedBeforeReading) {
  std::string out;
  for (const std::string& data : {std::string("/dev/zero"), fifo()}) {
    const auto config = dir_ / "c.yaml";
    write_file(config, "recipe: gpt_pretrain\ndata: {train: " + data + "}\n");
    EXPECT_EQ(run("train " + config.string(), out), 2) << out;
    EXPECT_NE(out.find("data.train: '" + data + "': not a regular file"), std::string::npos)
        << out;
    EXPECT_EQ(run("tokenize --tokenizer bytes --input " + data, out), 3) << out;
    EXPECT_NE(out.find(data + ": not a regular file"), std::string::npos) << out;
  }
}

TEST_F(Inputs, DataErrorsNameTheSplitAndKeepAStrangeFileNameOnOneLine) {
  write_file(dir_ / "va\nl.h5", "not hdf5");
  const auto config = dir_ / "c.yaml";
  write_file(config, "recipe: gpt_pretrain\noutput_dir: " + (dir_ / "run").string() +
                         "\ndata: {train: " + (dir_ / "corpus.txt").string() + ", val: \"" +
                         dir_.string() + "/va\\nl.h5\"}\n");
  std::string out;
  EXPECT_EQ(run("train " + config.string(), out), 3) << out;
  EXPECT_NE(out.find("data.val: " + dir_.string() + "/va\\nl.h5: not an HDF5 file"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace forge::testing
