// Helpers shared by test files: a per-test temporary directory and whole-file reads and writes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace forge::testing {

/// A fresh directory named after the running test, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("forge_" + std::string(info ? info->name() : "test") + "_" +
             std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

/// Golden values written by the scripts in tests/golden/: lines "name count v1 v2 ...", '#'
/// comments. `file` is relative to tests/golden/.
using Goldens = std::map<std::string, std::vector<double>>;
inline Goldens load_goldens(const std::string& file) {
  std::string here = __FILE__;
  std::string path = here.substr(0, here.rfind('/')) + "/golden/" + file;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  Goldens table;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    size_t n = 0;
    fields >> name >> n;
    std::vector<double> values(n);
    for (double& x : values) fields >> x;
    table[name] = values;
  }
  return table;
}

/// Each element of `got` within rtol of `want`, relative to max(|want[i]|, largest |want|): the
/// rule every PyTorch golden comparison uses.
inline void expect_near_golden(const std::vector<double>& got, const std::vector<double>& want,
                               const std::string& name, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << name;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::fabs(got[i] - want[i]), rtol * std::max(std::fabs(want[i]), scale))
        << name << "[" << i << "]: forge " << got[i] << ", torch " << want[i];
}

}  // namespace forge::testing
