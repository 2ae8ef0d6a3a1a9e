// Damaged or crafted checkpoints as the commands see them: a damaged file under a digest makes
// `train` fall back to the older intact checkpoint, a corrupt LATEST is one warning line in
// inspect/eval/generate, a checkpoint rejected at its header leaves metrics.jsonl as it was, and a
// stored config is checked against the file's tensors before it decides any allocation, and a
// full disk is an error line, not a crash.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/durable_file.h"
#include "runtime/checkpoint.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::write_file;

class CheckpointCli : public testing::RecipeTest {
 protected:
  // A tiny GPT run of `steps` steps saving every 2: checkpoints at steps 2, 4, ...
  fs::path write_config(int steps) {
    std::ofstream(dir_ / "run.yaml")
        << "recipe: gpt_pretrain\nseed: 7\noutput_dir: " << (dir_ / "run").string() << "\n"
        << "model: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
           "n_heads: 2, dropout: 0.0}\n"
        << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
        << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 1.0e-3}\n"
        << "train: {batch_size: 2, max_steps: " << steps
        << ", eval_every: 0, eval_batches: 1, save_every: 2, log_every: 1, keep_last: 5}\n";
    return dir_ / "run.yaml";
  }

  // Runs forge with stderr captured; returns the exit code.
  int forge_err(const std::string& args, std::string& err, const std::string& shell_prefix = "") {
    fs::path log = dir_ / "stderr.txt";
    std::string cmd =
        shell_prefix + std::string(FORGE_BINARY) + " " + args + " >/dev/null 2>" + log.string();
    int status = std::system(cmd.c_str());
    err = read_file(log);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  fs::path ckpt(const char* name) { return dir_ / "run" / "checkpoints" / name; }
};

void flip_byte_at(const fs::path& file, const std::string& marker) {
  std::string content = read_file(file);
  size_t pos = content.find(marker);
  ASSERT_NE(pos, std::string::npos) << marker;
  content[pos + 2] = char(content[pos + 2] ^ 0x5a);
  write_file(file, content);
}

TEST_F(CheckpointCli, DamagedHeapFallsBackToTheOlderCheckpoint) {
  fs::path cfg = write_config(4);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  // The stored config lives in HDF5's unchecksummed global heap; only the digest protects it.
  flip_byte_at(ckpt("step-000004.h5"), "recipe: gpt_pretrain");
  std::string err;
  EXPECT_EQ(forge_err("inspect " + ckpt("step-000004.h5").string(), err), 4);
  EXPECT_NE(err.find("step-000004.h5: digest "), std::string::npos) << err;
  EXPECT_EQ(forge_err("train " + cfg.string() + " train.max_steps=6", err), 0) << err;
  EXPECT_NE(err.find("forge: warning: "), std::string::npos) << err;
  EXPECT_NE(err.find("using step-000002.h5"), std::string::npos) << err;
}

TEST_F(CheckpointCli, CorruptLatestIsAWarningInEveryCommand) {
  fs::path cfg = write_config(4);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  write_file(dir_ / "run" / "checkpoints" / "LATEST", "st\xffp-0\n");
  const fs::path run = dir_ / "run";
  for (std::string command : {"inspect " + run.string(), "eval " + run.string(),
                              "generate --checkpoint " + run.string() +
                                  " --prompt a --max-new-tokens 2"}) {
    std::string err;
    EXPECT_EQ(forge_err(command, err), 0) << command << "\n" << err;
    EXPECT_EQ(err.rfind("forge: warning: ", 0), 0u) << command << "\n" << err;
    EXPECT_NE(err.find("using step-000004.h5"), std::string::npos) << command << "\n" << err;
  }
}

TEST_F(CheckpointCli, NegativeStepStopsResumeBeforeMetricsAreTouched) {
  fs::path cfg = write_config(2);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  fs::path file = ckpt("step-000002.h5");
  // A file from elsewhere: no digest, so the header check is what stops it.
  fs::remove(digest_path(file));
  write_file(dir_ / "run" / "checkpoints" / "LATEST", "step-000002.h5\n");
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t attr = H5Aopen(f, "step", H5P_DEFAULT);
  int64_t step = -5;
  H5Awrite(attr, H5T_NATIVE_INT64, &step);
  H5Aclose(attr);
  H5Fclose(f);
  std::string metrics = read_file(dir_ / "run" / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  std::string err;
  EXPECT_EQ(forge_err("train " + cfg.string() + " train.max_steps=4", err), 4) << err;
  EXPECT_NE(err.find("negative step -5"), std::string::npos) << err;
  EXPECT_EQ(read_file(dir_ / "run" / "metrics.jsonl"), metrics);
}

TEST_F(CheckpointCli, ResumeWithoutOptimizerStateIsACheckpointError) {
  fs::path cfg = write_config(2);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  fs::path file = ckpt("step-000002.h5");
  fs::remove(digest_path(file));
  write_file(dir_ / "run" / "checkpoints" / "LATEST", "step-000002.h5\n");
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Ldelete(f, "optim", H5P_DEFAULT);
  H5Fclose(f);
  std::string err;
  EXPECT_EQ(forge_err("train " + cfg.string() + " train.max_steps=4", err), 4) << err;
  EXPECT_NE(err.find(file.string() + ": missing group '/optim'"), std::string::npos) << err;
}

// Replaces the stored config and its CRC, as a crafted file would.
void set_stored_config(const fs::path& file, const std::string& text) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Adelete(f, "config");
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(f, "config", type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = text.c_str();
  H5Awrite(attr, type, &p);
  H5Aclose(attr);
  hid_t crc_attr = H5Aopen(f, "config_crc32", H5P_DEFAULT);
  uint32_t crc = crc32(text.data(), text.size());
  H5Awrite(crc_attr, H5T_NATIVE_UINT32, &crc);
  H5Aclose(crc_attr), H5Sclose(space), H5Tclose(type);
  H5Fclose(f);
}

TEST_F(CheckpointCli, StoredConfigIsComparedWithTheTensorsBeforeBuildingTheModel) {
  fs::path cfg = write_config(2);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  fs::path file = ckpt("step-000002.h5");
  fs::remove(digest_path(file));
  std::string text = read_checkpoint_info(file).config_yaml;
  size_t pos = text.find("d_model: 16\n");
  ASSERT_NE(pos, std::string::npos) << text;
  text.replace(pos, 12, "d_model: 16384\n");  // about 13 GB of f32 weights for a 100 KB file
  set_stored_config(file, text);
  std::string err;
  // The address-space limit turns an allocation that should not happen into a fast failure.
  EXPECT_EQ(forge_err("generate --checkpoint " + file.string() + " --prompt a", err,
                      "ulimit -v 4000000; "),
            4)
      << err;
  EXPECT_NE(err.find(file.string() + ": its stored config describes "), std::string::npos) << err;
}

TEST_F(CheckpointCli, StoredConfigThatDoesNotLoadIsACheckpointError) {
  fs::path cfg = write_config(2);
  ASSERT_EQ(forge("train " + cfg.string()), 0);
  fs::path file = ckpt("step-000002.h5");
  fs::remove(digest_path(file));
  // Intact as far as checksums go (the CRC matches the new text), but not a config this forge reads.
  set_stored_config(file, "recipe: gpt_pretrain\nmodel: {d_modle: 16}\n");
  std::string err;
  EXPECT_EQ(forge_err("generate --checkpoint " + file.string() + " --prompt a", err), 4) << err;
  EXPECT_NE(err.find(file.string() + ": the stored config does not load: "), std::string::npos)
      << err;
}

// A file from elsewhere (no digest) on which libhdf5 itself dies with SIGSEGV (the fixture and the
// script that made it: tests/golden/make_hdf5_heap_crash.py): the first read of it runs in a
// throwaway process (core/isolate.h), so every command that takes it ends with one line and exit 4.
TEST_F(CheckpointCli, AFileOnWhichTheHdf5LibraryCrashesIsOneErrorLine) {
  const fs::path file = dir_ / "crash.h5";
  fs::copy_file(fs::path(FORGE_SOURCE_DIR) / "tests/golden/hdf5_heap_crash.h5", file);
  for (const std::string& command :
       {"inspect " + file.string(),
        "generate --checkpoint " + file.string() + " --prompt a --max-new-tokens 1"}) {
    std::string err;
    EXPECT_EQ(forge_err(command, err), 4) << command << "\n" << err;
    EXPECT_EQ(err.rfind("forge: checkpoint error: " + file.string() +
                            ": the HDF5 library crashed reading it (",
                        0),
              0u)
        << err;
    EXPECT_NE(err.find("): the file is corrupt\n"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST_F(CheckpointCli, FullDiskIsOneErrorLineAndACleanExit) {
  fs::path cfg = write_config(2);
  // A file size limit stands in for a full disk: writes past it fail with EFBIG once SIGXFSZ is
  // ignored. HDF5's exit-time teardown used to crash on the checkpoint whose close had failed.
  std::string err;
  EXPECT_EQ(forge_err("train " + cfg.string(), err, "trap '' XFSZ; ulimit -f 40; "), 4) << err;
  EXPECT_NE(err.find("step-000002.h5.tmp: cannot "), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(ckpt("step-000002.h5.tmp")));
}

}  // namespace
}  // namespace forge
