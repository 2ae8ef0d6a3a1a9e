// The safetensors reader and writer (core/safetensors.h): a round trip, the float dtypes read as
// f32, and every way a header can lie about the file, each refused with one line naming the file
// (and the tensor) before anything is sized from it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/safetensors.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// A file of the given header text and data bytes.
fs::path raw_file(const fs::path& dir, const std::string& header, const std::string& data) {
  std::string content(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(content.data(), &n, 8);
  content += header + data;
  const fs::path file = dir / "t.safetensors";
  testing::write_file(file, content);
  return file;
}

std::string bytes_of(const std::vector<uint16_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 2);
}

TEST(Safetensors, WriteThenReadGivesTheSameTensorsNamesAndMetadata) {
  testing::TempDir dir;
  Tensor a = from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f}, {2, 3});
  Tensor b = from_vector(std::vector<float>{4.0f}, {1});
  Tensor empty_tensor = empty({0, 3});
  const fs::path file = dir.path() / "w.safetensors";
  write_safetensors(file, {{"layer.a", a}, {"b", b}, {"none", empty_tensor}},
                    {{"format", "pt"}}, ExitCode::checkpoint);
  // The header is padded so the data starts 8-aligned.
  uint64_t header = 0;
  std::memcpy(&header, testing::read_file(file).data(), 8);
  EXPECT_EQ(header % 8, 0u);

  SafetensorsFile f(file);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "layer.a");
  EXPECT_EQ(f.entries()[0].dtype, "F32");
  EXPECT_EQ(f.entries()[0].shape, (Shape{2, 3}));
  EXPECT_EQ(f.read_f32("layer.a").to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(f.read_f32("b").to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(f.read_f32("none").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.find("missing"), nullptr);
  testing::expect_error(ExitCode::checkpoint, "no tensor 'missing'",
                        [&] { f.read_f32("missing"); });
}

// BF16 and F16 are written rounded to nearest even, and read back as the values they hold: the
// bits are checked, so a truncating writer would fail on the ties and on the values just above.
TEST(Safetensors, HalfAndBfloatAreWrittenRoundedToNearestEven) {
  testing::TempDir dir;
  const float tiny = std::ldexp(1.0f, -24);  // F16's smallest subnormal
  const std::vector<float> values = {
      1.0f, -2.0f, 1.0f + std::ldexp(1.0f, -11),  // F16 tie to even: 1
      1.0f + 3 * std::ldexp(1.0f, -11),           // F16 tie to even: 1 + 2^-9
      1.0f + std::ldexp(1.0f, -8),                // BF16 tie to even: 1
      1.0f + 3 * std::ldexp(1.0f, -8),            // BF16 tie to even: 1 + 2^-6
      65504.0f, 65519.0f, 65520.0f, 1.5f * tiny, 2.5f * tiny, 0.5f * tiny, std::ldexp(1.0f, -14),
      std::numeric_limits<float>::infinity(), -0.0f};
  Tensor t = empty({int64_t(values.size())});
  std::copy(values.begin(), values.end(), t.data<float>());
  const fs::path half = dir.path() / "h.safetensors", bf = dir.path() / "b.safetensors";
  write_safetensors(half, {{"t", t}}, {}, ExitCode::checkpoint, StoredFloat::f16);
  write_safetensors(bf, {{"t", t}}, {}, ExitCode::checkpoint, StoredFloat::bf16);
  const std::string h = testing::read_file(half), b = testing::read_file(bf);
  auto bits = [](const std::string& file, size_t n) {
    std::vector<uint16_t> out(n);
    std::memcpy(out.data(), file.data() + file.size() - 2 * n, 2 * n);
    return out;
  };
  EXPECT_EQ(bits(h, values.size()),
            (std::vector<uint16_t>{0x3c00, 0xc000, 0x3c00, 0x3c02, 0x3c04, 0x3c0c, 0x7bff, 0x7bff,
                                   0x7c00, 0x0002, 0x0002, 0x0000, 0x0400, 0x7c00, 0x8000}));
  EXPECT_EQ(bits(b, values.size())[4], 0x3f80);
  EXPECT_EQ(bits(b, values.size())[5], 0x3f82);
  EXPECT_EQ(SafetensorsFile(half).find("t")->dtype, "F16");
  EXPECT_EQ(SafetensorsFile(bf).find("t")->dtype, "BF16");
  EXPECT_EQ(SafetensorsFile(half).read_f32("t").to_vector<float>()[3],
            1.0f + std::ldexp(1.0f, -9));
}

TEST(Safetensors, HalfBfloatAndDoubleAreReadAsFloat) {
  testing::TempDir dir;
  // f16: 1, -2, the smallest subnormal 2^-24, the smallest normal 2^-14, +inf, 65504.
  const std::vector<uint16_t> half = {0x3c00, 0xc000, 0x0001, 0x0400, 0x7c00, 0x7bff};
  // bf16: 1, -0.5.
  const std::vector<uint16_t> bf = {0x3f80, 0xbf00};
  const double d[2] = {0.5, -3.0e10};
  std::string data = bytes_of(half) + bytes_of(bf) +
                     std::string(reinterpret_cast<const char*>(d), sizeof d);
  const fs::path file = raw_file(dir.path(),
                                 R"({"h": {"dtype": "F16", "shape": [6], "data_offsets": [0, 12]},
                                     "b": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]},
                                     "d": {"dtype": "F64", "shape": [2], "data_offsets": [16, 32]},
                                     "__metadata__": {"k": "v"}})",
                                 data);
  SafetensorsFile f(file);
  EXPECT_EQ(f.read_f32("h").to_vector<float>(),
            (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -14),
                                std::numeric_limits<float>::infinity(), 65504.0f}));
  EXPECT_EQ(f.read_f32("b").to_vector<float>(), (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(f.read_f32("d").to_vector<float>(), (std::vector<float>{0.5f, -3.0e10f}));
}

TEST(Safetensors, EveryInconsistentHeaderIsRefusedNamingTheFileAndTensor) {
  testing::TempDir dir;
  const std::string four(4, '\0');
  auto refused = [&](const std::string& header, const std::string& data, const std::string& part) {
    const fs::path file = raw_file(dir.path(), header, data);
    testing::expect_error(ExitCode::checkpoint, part, [&] { SafetensorsFile f(file); });
    testing::expect_error(ExitCode::checkpoint, file.string(), [&] { SafetensorsFile f(file); });
  };
  auto one = [](const std::string& fields) { return R"({"w": {)" + fields + "}}"; };
  refused("not json", four, "not valid JSON");
  refused("[1, 2]", four, "not a JSON object");
  refused(R"({"__metadata__": )" + std::string(100000, '[') + std::string(100000, ']') + "}", "",
          "the header is not valid JSON: arrays and objects nested deeper than 128 levels");
  refused(one(R"("dtype": "F99", "shape": [1], "data_offsets": [0, 4])"), four,
          "tensor 'w': unknown dtype 'F99'");
  refused(one(R"("dtype": "F32", "shape": [-1], "data_offsets": [0, 4])"), four,
          "tensor 'w': the shape holds something other than sizes");
  refused(one(R"("dtype": "F32", "shape": [2], "data_offsets": [0, 4])"), four,
          "needs 8");
  refused(one(R"("dtype": "F32", "shape": [1], "data_offsets": [0, 8])"), four,
          "lie outside the 4 data bytes");
  refused(one(R"("dtype": "F32", "shape": [1], "data_offsets": [4, 0])"), four,
          "lie outside");
  refused(one(R"("dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1)"), four,
          "unknown field 'extra'");
  refused(one(R"("shape": [1], "data_offsets": [0, 4])"), four, "dtype missing");
  refused(one(R"("dtype": "F32", "shape": [1], "data_offsets": [0])"), four,
          "data_offsets is not a pair");
  // Sizes whose product overflows 64 bits are refused before any multiplication wraps.
  refused(one(R"("dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4])"),
          four, "its shape overflows");
  refused(R"({"__metadata__": {"k": 1}})", "", "__metadata__.k is not a string");
  // The tensors must tile the data: an overlap, a gap, bytes no tensor owns.
  refused(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
          four, "tensors must not overlap or leave gaps");
  refused(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", four + four,
          "tensor 'a' starts at data byte 4, expected 0");
  refused(one(R"("dtype": "F32", "shape": [1], "data_offsets": [0, 4])"), four + "x",
          "the tensors end at data byte 4, but the file holds 5");

  // A header length beyond the file, and a file too short to hold one.
  std::string huge(8, '\xff');
  testing::write_file(dir.path() / "huge.safetensors", huge + "{}");
  testing::expect_error(ExitCode::checkpoint, "header length",
                        [&] { SafetensorsFile f(dir.path() / "huge.safetensors"); });
  testing::write_file(dir.path() / "short.safetensors", "abc");
  testing::expect_error(ExitCode::checkpoint, "not a safetensors file: 3 bytes",
                        [&] { SafetensorsFile f(dir.path() / "short.safetensors"); });
  testing::expect_error(ExitCode::checkpoint, "missing.safetensors",
                        [&] { SafetensorsFile f(dir.path() / "missing.safetensors"); });
}

TEST(Safetensors, NonFloatTensorsOpenButAreNotReadAsWeights) {
  testing::TempDir dir;
  const int64_t ids[2] = {0, 1};
  const fs::path file =
      raw_file(dir.path(), R"({"ids": {"dtype": "I64", "shape": [1, 2], "data_offsets": [0, 16]}})",
               std::string(reinterpret_cast<const char*>(ids), sizeof ids));
  SafetensorsFile f(file);
  ASSERT_NE(f.find("ids"), nullptr);
  testing::expect_error(ExitCode::checkpoint, "tensor 'ids': dtype I64 is not a floating-point",
                        [&] { f.read_f32("ids"); });
}

}  // namespace
}  // namespace forge
