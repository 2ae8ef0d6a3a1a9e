// Checkpoint files: bitwise round trips, LATEST and keep_last, crash leftovers, and that every kind
// of damage (truncation, flipped data bytes, missing attributes, wrong shapes or names) becomes one
// Error(checkpoint) line naming the file. Each test works in its own fresh temp directory.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "tests/test_util.h"
#include "core/ops.h"
#include "core/durable_file.h"
#include "runtime/checkpoint.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::write_file;




std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.numel()) * dtype_size(c.dtype()));
}

/// A small model's worth of tensors covering every dtype, a scalar, an empty and a strided view.
CheckpointData sample_data(int64_t step) {
  Generator gen(step + 7);
  CheckpointData d;
  d.step = step;
  d.config_yaml = "recipe: gpt_pretrain\nseed: 1337\nmodel: {d_model: 8}  # ünïcode ✓\n";
  d.model = {
      {"tok_emb.weight", normal({5, 8}, 0, 1, gen)},
      {"blocks.0.attn.qkv.weight", transpose(normal({24, 8}, 0, 1, gen), 0, 1)},  // strided view
      {"blocks.0.ln1.weight", normal({8}, 0, 1, gen).to(DType::bf16)},
      {"ln_f.bias", normal({8}, 0, 1, gen, DType::f64)},
      {"pos_ids", arange(6, DType::i64)},
      {"scale", scalar(0.125)},
      {"empty", zeros({0, 3})},
  };
  d.optim = {
      {"exp_avg.tok_emb.weight", normal({5, 8}, 0, 1, gen)},
      {"step", scalar(double(step), DType::i64)},
  };
  d.counters = {{"rng.seed", 1337},
                {"rng.offset", int64_t(0xfedcba9876543210ull)},  // a uint64 by bit pattern
                {"data.cursor", -5}};
  return d;
}

/// Runs `fn`, which must throw Error(checkpoint); returns the message.
template <class Fn>
std::string checkpoint_error(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::checkpoint) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected Error(checkpoint)";
  return "";
}

// Byte offset of the first occurrence of a tensor's bytes in a file (its contiguous data).
size_t find_bytes(const fs::path& file, const Tensor& t) {
  std::string content = read_file(file), needle = bytes_of(t);
  size_t pos = content.find(needle);
  EXPECT_NE(pos, std::string::npos);
  return pos;
}

void flip_byte(const fs::path& file, size_t offset) {
  std::string content = read_file(file);
  content[offset] = char(content[offset] ^ 0x5a);
  write_file(file, content);
}

// Edits a checkpoint's root attributes with the HDF5 API, as damage or a future writer might.
void edit_root(const fs::path& file, const std::function<void(hid_t)>& edit) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  edit(f);
  H5Fclose(f);
}

TEST(Checkpoint, Crc32MatchesZlib) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32("", 0), 0u);
  std::string s = "The quick brown fox jumps over the lazy dog, twice and a bit more";
  for (size_t split : {0, 1, 7, 8, 13, 64})
    EXPECT_EQ(crc32(s.data() + split, s.size() - split, crc32(s.data(), split)),
              crc32(s.data(), s.size()))
        << split;
  EXPECT_EQ(crc32(s.data(), s.size()), 0x149de9fdu);  // Python: zlib.crc32(s.encode())
}

TEST(Checkpoint, RoundTripIsBitwiseExact) {
  TempDir tmp;
  CheckpointData d = sample_data(200);
  d.config_yaml += std::string(100000, 'x');  // beyond HDF5's 64 KiB compact attribute limit
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  EXPECT_EQ(file, tmp.path() / "checkpoints" / "step-000200.h5");
  EXPECT_EQ(read_file(tmp.path() / "checkpoints" / "LATEST"),
            "step-000200.h5 " + file_digest(file, ExitCode::checkpoint) + "\n");
  EXPECT_EQ(read_file(digest_path(file)), file_digest(file, ExitCode::checkpoint) + "\n");
  fs::path exported = tmp.path() / "exported.h5";  // as `forge export` writes one
  save_checkpoint_file(exported, d);
  EXPECT_EQ(read_file(digest_path(exported)), file_digest(exported, ExitCode::checkpoint) + "\n");

  CheckpointData back = load_checkpoint(file, specs_of(d.model));
  EXPECT_EQ(back.step, 200);
  EXPECT_EQ(back.config_yaml, d.config_yaml);
  EXPECT_EQ(back.counters, d.counters);
  ASSERT_EQ(back.model.size(), d.model.size());
  for (size_t i = 0; i < d.model.size(); ++i) {
    EXPECT_EQ(back.model[i].name, d.model[i].name);
    EXPECT_EQ(back.model[i].tensor.shape(), d.model[i].tensor.shape()) << d.model[i].name;
    EXPECT_EQ(back.model[i].tensor.dtype(), d.model[i].tensor.dtype()) << d.model[i].name;
    EXPECT_EQ(bytes_of(back.model[i].tensor), bytes_of(d.model[i].tensor)) << d.model[i].name;
  }
  ASSERT_EQ(back.optim.size(), 2u);  // no expectation given: everything, in saved order
  EXPECT_EQ(back.optim[0].name, "exp_avg.tok_emb.weight");
  EXPECT_EQ(bytes_of(back.optim[0].tensor), bytes_of(d.optim[0].tensor));
  EXPECT_EQ(back.optim[1].tensor.dtype(), DType::i64);
  EXPECT_EQ(back.optim[1].tensor.item(), 200.0);

  // The caller's order wins over the file's.
  std::vector<TensorSpec> reversed = specs_of(d.model);
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(load_checkpoint(file, reversed).model.front().name, "empty");
  LoadOptions model_only;
  model_only.load_optim = false;
  EXPECT_TRUE(load_checkpoint(file, specs_of(d.model), model_only).optim.empty());

  CheckpointInfo info = read_checkpoint_info(file);
  EXPECT_EQ(info.format_version, 1);
  EXPECT_EQ(info.step, 200);
  EXPECT_EQ(info.forge_version, kForgeVersion);
  EXPECT_EQ(info.model, specs_of(d.model));  // creation order, shapes, dtypes
  EXPECT_EQ(info.model_numel(), 40 + 192 + 8 + 8 + 6 + 1 + 0);
  EXPECT_EQ(info.optim_numel(), 41);
  EXPECT_NO_THROW(verify_checkpoint(file));
}

TEST(Checkpoint, KeepLastDeletesOldestButNeverLatest) {
  TempDir tmp;
  fs::path ckpt = tmp.path() / "checkpoints";
  for (int64_t step : {100, 200, 300, 400, 500}) save_checkpoint(tmp.path(), sample_data(step), 2);
  EXPECT_FALSE(fs::exists(ckpt / "step-000300.h5"));
  EXPECT_FALSE(fs::exists(ckpt / "step-000300.h5.digest"));
  EXPECT_TRUE(fs::exists(ckpt / "step-000400.h5"));
  EXPECT_TRUE(fs::exists(ckpt / "step-000500.h5"));
  EXPECT_EQ(latest_checkpoint(tmp.path()), ckpt / "step-000500.h5");

  // A save at a lower step (e.g. after a fallback) is what LATEST names, so it survives pruning
  // even though it is the oldest file.
  save_checkpoint(tmp.path(), sample_data(50), 1);
  EXPECT_EQ(read_file(ckpt / "LATEST").rfind("step-000050.h5 crc32:", 0), 0u);
  EXPECT_TRUE(fs::exists(ckpt / "step-000050.h5"));
  EXPECT_FALSE(fs::exists(ckpt / "step-000400.h5"));

  // keep_last <= 0 keeps everything; steps past six digits still sort numerically.
  save_checkpoint(tmp.path(), sample_data(1234567), 0);
  save_checkpoint(tmp.path(), sample_data(60), 0);
  save_checkpoint(tmp.path(), sample_data(70), 2);
  EXPECT_TRUE(fs::exists(ckpt / "step-1234567.h5"));
  EXPECT_TRUE(fs::exists(ckpt / "step-000070.h5"));
  EXPECT_FALSE(fs::exists(ckpt / "step-000060.h5"));
}

TEST(Checkpoint, LatestFallsBackWhenLatestIsMissingOrBroken) {
  TempDir tmp;
  fs::path ckpt = tmp.path() / "checkpoints";
  EXPECT_EQ(latest_checkpoint(tmp.path()), std::nullopt);  // a fresh run
  save_checkpoint(tmp.path(), sample_data(100), 3);
  save_checkpoint(tmp.path(), sample_data(200), 3);
  std::string warning;
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000200.h5");
  EXPECT_EQ(warning, "");

  // LATEST names a file that is gone (deleted by hand): the newest intact step file.
  fs::remove(ckpt / "step-000200.h5");
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000100.h5");
  EXPECT_NE(warning.find("step-000200.h5"), std::string::npos) << warning;
  EXPECT_NE(warning.find("using step-000100.h5"), std::string::npos) << warning;

  // LATEST itself lost (crash before its first write): same.
  save_checkpoint(tmp.path(), sample_data(300), 3);
  fs::remove(ckpt / "LATEST");
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000300.h5");
  EXPECT_NE(warning.find("LATEST: missing"), std::string::npos) << warning;

  // LATEST names a corrupt file: skipped for the newest one that verifies. With its sidecar the
  // digest catches it; without (an older run's one-field LATEST), the dataset's CRC does.
  write_file(ckpt / "LATEST", "step-000300.h5\n");
  CheckpointData d300 = sample_data(300);
  flip_byte(ckpt / "step-000300.h5", find_bytes(ckpt / "step-000300.h5", d300.model[0].tensor) + 5);
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000100.h5");
  EXPECT_NE(warning.find("step-000300.h5.digest: the file is damaged"), std::string::npos)
      << warning;
  fs::remove(digest_path(ckpt / "step-000300.h5"));
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000100.h5");
  EXPECT_NE(warning.find("checksum mismatch"), std::string::npos) << warning;

  // Nothing intact at all: an error rather than silently starting over.
  fs::remove(ckpt / "step-000100.h5");
  std::string msg = checkpoint_error([&] { latest_checkpoint(tmp.path()); });
  EXPECT_NE(msg.find("no intact checkpoint"), std::string::npos) << msg;
}

TEST(Checkpoint, TempFilesOfACrashedSaveAreIgnoredThenCleaned) {
  TempDir tmp;
  fs::path ckpt = tmp.path() / "checkpoints";
  save_checkpoint(tmp.path(), sample_data(100), 3);
  // A crash mid-write leaves temp files with partial content; they are never renamed into place.
  write_file(ckpt / "step-000200.h5.tmp", "\x89HDF\r\n\x1a\n partial");
  write_file(ckpt / "LATEST.tmp", "step-000200.h5\n");
  write_file(ckpt / "LATEST.tmp.4242", "step-000200.h5\n");  // write_file_atomic's temp
  EXPECT_EQ(latest_checkpoint(tmp.path()), ckpt / "step-000100.h5");
  fs::remove(ckpt / "LATEST");
  EXPECT_EQ(latest_checkpoint(tmp.path()), ckpt / "step-000100.h5");
  save_checkpoint(tmp.path(), sample_data(200), 3);
  EXPECT_FALSE(fs::exists(ckpt / "step-000200.h5.tmp"));
  EXPECT_FALSE(fs::exists(ckpt / "LATEST.tmp"));
  EXPECT_FALSE(fs::exists(ckpt / "LATEST.tmp.4242"));
  EXPECT_EQ(latest_checkpoint(tmp.path()), ckpt / "step-000200.h5");
}

// An exported checkpoint's temp file is this process's own, created exclusively: a user's file
// that happens to sit at `OUT.tmp`, or a symlink there, is neither truncated nor followed.
TEST(Checkpoint, AnExportNeverWritesOverAFileAtItsTempName) {
  TempDir tmp;
  const fs::path out = tmp.path() / "merged.h5";
  write_file(tmp.path() / "merged.h5.tmp", "the user's notes");
  write_file(tmp.path() / "target.txt", "kept");
  fs::create_symlink(tmp.path() / "target.txt",
                     tmp.path() / ("merged.h5.tmp." + std::to_string(::getpid())));
  EXPECT_THROW(save_checkpoint_file(out, sample_data(1)), Error);
  EXPECT_EQ(read_file(tmp.path() / "target.txt"), "kept");
  fs::remove(tmp.path() / ("merged.h5.tmp." + std::to_string(::getpid())));
  save_checkpoint_file(out, sample_data(1));
  EXPECT_EQ(read_file(tmp.path() / "merged.h5.tmp"), "the user's notes");
  EXPECT_EQ(load_checkpoint(out, specs_of(sample_data(1).model)).step, 1);
}

TEST(Checkpoint, CorruptFilesAreOneLineCheckpointErrors) {
  TempDir tmp;
  CheckpointData d = sample_data(100);
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  fs::remove(digest_path(file));  // a file from elsewhere: only what is inside it can be checked
  std::string good = read_file(file);
  auto specs = specs_of(d.model);
  auto load = [&] { load_checkpoint(file, specs); };
  auto expect_error = [&](const std::string& fragment) {
    ::testing::internal::CaptureStderr();
    std::string msg = checkpoint_error(load);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // HDF5's own stack stays silent
    EXPECT_EQ(msg.rfind(file.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    write_file(file, good);
  };

  // A flipped byte in tensor data: caught by the dataset's CRC, naming the dataset.
  flip_byte(file, find_bytes(file, d.model[0].tensor) + 17);
  EXPECT_NE(checkpoint_error([&] { verify_checkpoint(file); }).find("/model/tok_emb.weight"),
            std::string::npos);
  expect_error("checksum mismatch in dataset '/model/tok_emb.weight'");

  write_file(file, good.substr(0, good.size() / 2));
  expect_error("truncated or corrupt");
  write_file(file, "");
  expect_error("not an HDF5 file");
  write_file(file, "step: 100\nthis is not a checkpoint\n");
  expect_error("not an HDF5 file");
  fs::remove(file);
  expect_error("no such checkpoint file");

  edit_root(file, [](hid_t f) { H5Adelete(f, "step"); });
  expect_error("missing attribute 'step'");

  edit_root(file, [](hid_t f) {  // a config that no longer matches its checksum
    H5Adelete(f, "config");
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(f, "config", type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* text = "recipe: tampered\n";
    H5Awrite(attr, type, &text);
    H5Aclose(attr), H5Sclose(space), H5Tclose(type);
  });
  expect_error("checksum mismatch in attribute 'config'");

  edit_root(file, [](hid_t f) {
    hid_t attr = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = 2;
    H5Awrite(attr, H5T_NATIVE_INT64, &v);
    H5Aclose(attr);
  });
  expect_error("format_version 2 is newer");
}

TEST(Checkpoint, LoadNamesTheFirstMismatchBeforeReadingData) {
  TempDir tmp;
  CheckpointData d = sample_data(100);
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  fs::remove(digest_path(file));  // else the digest would report the damage first
  // Damage the data too: a spec mismatch must be reported first, proving specs are checked before
  // any tensor is read.
  flip_byte(file, find_bytes(file, d.model[0].tensor) + 3);
  auto message = [&](const std::vector<TensorSpec>& specs, LoadOptions options = {}) {
    std::string msg = checkpoint_error([&] { load_checkpoint(file, specs, options); });
    EXPECT_EQ(msg.rfind(file.string() + ": ", 0), 0u) << msg;
    return msg.substr(file.string().size() + 2);
  };

  std::vector<TensorSpec> specs = specs_of(d.model);
  specs[1].shape = {24, 8};
  EXPECT_EQ(message(specs),
            "model parameter 'blocks.0.attn.qkv.weight' has shape [8, 24] in the checkpoint but "
            "[24, 8] is expected");

  specs = specs_of(d.model);
  specs[2].dtype = DType::f32;
  EXPECT_EQ(message(specs),
            "model parameter 'blocks.0.ln1.weight' is bf16 in the checkpoint but f32 is expected");

  specs = specs_of(d.model);
  specs.insert(specs.begin() + 1, {"blocks.1.ln1.weight", {8}, DType::f32});
  specs.push_back({"lm_head.weight", {5, 8}, DType::f32});
  EXPECT_EQ(message(specs),
            "model parameter 'blocks.1.ln1.weight' is missing from the checkpoint (1 more mismatch; "
            "was it written with a different config?)");

  specs = specs_of(d.model);
  specs.erase(specs.begin() + 3);
  EXPECT_EQ(message(specs),
            "unexpected model parameter 'ln_f.bias' in the checkpoint (not expected by this "
            "model/config)");

  LoadOptions options;
  options.expected_optim = std::vector<TensorSpec>{{"exp_avg.tok_emb.weight", {5, 8}, DType::f32}};
  EXPECT_EQ(message(specs_of(d.model), options),
            "unexpected optimizer state 'step' in the checkpoint (not expected by this "
            "model/config)");
}

TEST(Checkpoint, DigestRejectsADamagedFileBeforeHdf5ParsesIt) {
  TempDir tmp;
  fs::path ckpt = tmp.path() / "checkpoints";
  save_checkpoint(tmp.path(), sample_data(100), 3);
  CheckpointData d = sample_data(200);
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  // The config lives in HDF5's global heap, which HDF5 does not checksum: damage there can crash
  // libhdf5 itself, so it must be caught before HDF5 opens the file.
  size_t heap = read_file(file).find("recipe: gpt_pretrain");
  ASSERT_NE(heap, std::string::npos);
  flip_byte(file, heap + 3);
  std::vector<std::function<void()>> readers = {
      [&] { verify_checkpoint(file); }, [&] { read_checkpoint_info(file); },
      [&] { load_checkpoint(file, specs_of(d.model)); }};
  for (const auto& read : readers) {
    std::string msg = checkpoint_error(read);
    EXPECT_EQ(msg.rfind(file.string() + ": digest ", 0), 0u) << msg;
  }
  std::string warning;
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000100.h5");
  EXPECT_NE(warning.find("; using step-000100.h5"), std::string::npos)
      << warning;

  // LATEST's copy of the digest still protects the file when the sidecar is lost.
  fs::remove(digest_path(file));
  EXPECT_EQ(latest_checkpoint(tmp.path(), &warning), ckpt / "step-000100.h5");
  EXPECT_NE(warning.find("recorded in " + (ckpt / "LATEST").string()), std::string::npos)
      << warning;
}

// Adds /model/<name> declaring `dims` with Forge's attributes but no data: chunked storage, whose
// chunks HDF5 allocates only when written, so the declared size costs the file nothing.
void add_declared_dataset(const fs::path& file, const std::string& name,
                          const std::vector<hsize_t>& dims) {
  edit_root(file, [&](hid_t f) {
    hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    std::vector<hsize_t> chunk(dims.size(), 1);
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    std::string path = "/model/" + name;
    hid_t ds = H5Dcreate2(f, path.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    EXPECT_GE(ds, 0);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 3);
    hid_t scalar = H5Screate(H5S_SCALAR);
    hid_t dtype = H5Acreate2(ds, "dtype", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(dtype, str, "f32");
    hid_t crc = H5Acreate2(ds, "crc32", H5T_STD_U32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    uint32_t zero = 0;  // crc32 of no bytes: what a size that wraps to 0 would compute
    H5Awrite(crc, H5T_NATIVE_UINT32, &zero);
    H5Aclose(crc), H5Aclose(dtype), H5Sclose(scalar), H5Tclose(str);
    H5Dclose(ds), H5Pclose(dcpl), H5Sclose(space);
  });
}

TEST(Checkpoint, DeclaredSizesAreCheckedAgainstTheFileBeforeAllocating) {
  TempDir tmp;
  CheckpointData d = sample_data(100);
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  fs::remove(digest_path(file));  // a file from elsewhere
  std::string good = read_file(file);

  add_declared_dataset(file, "huge", {hsize_t(1) << 20, hsize_t(1) << 20});  // 4 TiB of f32
  std::vector<std::function<void()>> readers = {
      [&] { verify_checkpoint(file); }, [&] { read_checkpoint_info(file); },
      [&] { load_checkpoint(file, specs_of(d.model)); }};
  for (const auto& read : readers) {
    std::string msg = checkpoint_error(read);
    EXPECT_NE(msg.find("dataset '/model/huge' declares shape [1048576, 1048576], more bytes than "
                       "the file's"),
              std::string::npos)
        << msg;
  }

  // 2^62 f32 elements are 2^64 bytes, which wraps to 0 in 64-bit arithmetic.
  write_file(file, good);
  add_declared_dataset(file, "wraps", {hsize_t(1) << 31, hsize_t(1) << 31});
  std::string msg = checkpoint_error([&] { verify_checkpoint(file); });
  EXPECT_NE(msg.find("'/model/wraps' declares shape [2147483648, 2147483648]"), std::string::npos)
      << msg;
}

TEST(Checkpoint, NegativeStepIsRejectedWithTheHeader) {
  TempDir tmp;
  fs::path file = save_checkpoint(tmp.path(), sample_data(100), 3);
  fs::remove(digest_path(file));
  edit_root(file, [](hid_t f) {
    hid_t attr = H5Aopen(f, "step", H5P_DEFAULT);
    int64_t v = -5;
    H5Awrite(attr, H5T_NATIVE_INT64, &v);
    H5Aclose(attr);
  });
  std::string msg = checkpoint_error([&] { read_checkpoint_info(file); });
  EXPECT_EQ(msg, file.string() + ": negative step -5");
}

TEST(Checkpoint, ResumingNeedsTheOptimizerState) {
  TempDir tmp;
  CheckpointData d = sample_data(100);
  fs::path file = save_checkpoint(tmp.path(), d, 3);
  fs::remove(digest_path(file));
  edit_root(file, [](hid_t f) { H5Ldelete(f, "optim", H5P_DEFAULT); });
  std::string msg = checkpoint_error([&] { load_checkpoint(file, specs_of(d.model)); });
  EXPECT_EQ(msg, file.string() + ": missing group '/optim'");
  LoadOptions model_only;
  model_only.load_optim = false;
  EXPECT_NO_THROW(load_checkpoint(file, specs_of(d.model), model_only));
}

// h5py writes np.bytes_ attributes as fixed-length NULLPAD strings: every byte is text, no
// terminator (fixture and the script that made it: tests/golden/make_h5py_checkpoint.py).
TEST(Checkpoint, ReadsFixedLengthStringsWrittenByH5py) {
  fs::path file = fs::path(FORGE_SOURCE_DIR) / "tests/golden/h5py_nullpad_checkpoint.h5";
  CheckpointInfo info = read_checkpoint_info(file);
  EXPECT_EQ(info.step, 42);
  EXPECT_EQ(info.config_yaml, "recipe: gpt_pretrain\nseed: 7\n");
  EXPECT_EQ(info.forge_version, "0.1.0");
  EXPECT_EQ(info.counters, (std::map<std::string, int64_t>{{"data.cursor", 3}}));
  ASSERT_EQ(info.model.size(), 1u);
  EXPECT_EQ(info.model[0], (TensorSpec{"w", {2, 3}, DType::f32}));
  LoadOptions model_only;
  model_only.load_optim = false;
  Tensor w = load_checkpoint(file, info.model, model_only).model.at(0).tensor;
  EXPECT_EQ(bytes_of(w), bytes_of(arange(6)));
}

}  // namespace
}  // namespace forge
