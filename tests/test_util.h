// Helpers shared by test files: a per-test temporary directory, whole-file reads and writes, the
// exit code an action fails with, and PyTorch goldens (loading, comparing, the weight formula).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/named_tensor.h"

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
  // The source tree from CMake, not __FILE__: compiler caches may rewrite __FILE__ relative.
  std::string path = std::string(FORGE_SOURCE_DIR) + "/tests/golden/" + file;
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

/// The values of golden `name`, failing the test (and returning nothing) when `file` lacks it.
inline const std::vector<double>& golden_values(const Goldens& table, const std::string& name,
                                                const std::string& file) {
  static const std::vector<double> missing;
  auto it = table.find(name);
  EXPECT_NE(it, table.end()) << "golden '" << name << "' missing from " << file;
  return it == table.end() ? missing : it->second;
}

/// Deterministic weights the golden scripts reproduce: parameter k (in name order), element i is
/// 0.1 sin(0.37 i + 0.0013 i^2 + 0.7 k), plus 1 for 1-D ".weight" tensors (norm scales).
inline NamedTensors formula_weights(const NamedTensors& params) {
  NamedTensors out;
  int k = 0;
  for (const NamedTensor& p : params) {
    const int64_t n = p.tensor.numel();
    const bool scale = p.tensor.dim() == 1 && p.name.size() > 7 &&
                       p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
    std::vector<double> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      w[size_t(i)] = (scale ? 1.0 : 0.0) +
                     0.1 * std::sin(0.37 * double(i) + 0.0013 * double(i) * double(i) + 0.7 * k);
    out.push_back({p.name, from_vector(w, p.tensor.shape())});
    ++k;
  }
  return out;
}

/// Every parameter's gradient against the goldens "<variant>.num_params" (how many there are) and,
/// per parameter, "<variant>.grad.<name>.norm" and ".at" (6 entries spread over the flat gradient),
/// as the golden scripts write them. Entries are compared relative to the gradient's scale: tiny
/// entries carry f32 noise.
inline void expect_grads_near_golden(const NamedTensors& params, const Goldens& table,
                                     const std::string& file, const std::string& variant) {
  EXPECT_EQ(double(params.size()), golden_values(table, variant + ".num_params", file).at(0));
  for (const NamedTensor& p : params) {
    const std::string key = variant + ".grad." + p.name;
    ASSERT_TRUE(p.tensor.grad().defined()) << key;
    std::vector<double> g = p.tensor.grad().to_vector<double>();
    double norm = 0;
    for (double x : g) norm += x * x;
    norm = std::sqrt(norm);
    const double want_norm = golden_values(table, key + ".norm", file).at(0);
    EXPECT_NEAR(norm, want_norm, 1e-4 * want_norm) << key;
    const std::vector<double>& at = golden_values(table, key + ".at", file);
    const size_t n = g.size();
    const size_t idx[6] = {0, n / 5, 2 * n / 5, 3 * n / 5, 4 * n / 5, n - 1};
    ASSERT_EQ(at.size(), 6u) << key;
    const double floor = want_norm / std::sqrt(double(n));
    for (int j = 0; j < 6; ++j)
      EXPECT_NEAR(g[idx[j]], at[size_t(j)], 1e-4 * std::max(std::fabs(at[size_t(j)]), floor))
          << key << "[" << idx[j] << "]";
  }
}

/// The exit code of the forge::Error `f` throws (checking its message is one line), or ok with a
/// test failure when it throws nothing.
inline ExitCode exit_code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.code();
  }
  ADD_FAILURE() << "no error thrown";
  return ExitCode::ok;
}

/// Expects `f` to throw a one-line forge::Error with `code` whose message contains `part`.
inline void expect_error(ExitCode code, const std::string& part, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(e.code(), code) << what;
    EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return;
  }
  ADD_FAILURE() << "no error thrown (expected one containing '" << part << "')";
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
