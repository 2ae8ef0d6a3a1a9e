// The layering of docs/architecture.md, checked on the sources: static libraries link a call that
// points the wrong way as happily as any other, so the arrows hold only because this test reads
// every #include. Also where oneDNN, OpenMP and yaml-cpp may appear (DESIGN: kernels only, and no
// YAML below the runtime).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// What each layer may include besides itself: cli -> {recipes, formats} -> runtime ->
// {nn, optim, data} -> core.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"core", {}},
    {"nn", {"core"}},
    {"optim", {"core"}},
    {"data", {"core"}},
    {"runtime", {"core", "nn", "optim", "data"}},
    {"formats", {"core", "nn", "optim", "data", "runtime"}},
    {"recipes", {"core", "nn", "optim", "data", "runtime"}},
    {"cli", {"core", "nn", "optim", "data", "runtime", "formats", "recipes"}},
};

// An #include (target: the header's path) or an OpenMP pragma (target: "#pragma omp").
struct Include {
  std::string file;  // relative to the source root
  int line;
  std::string target;
};

std::vector<Include> includes_under(const fs::path& root, const std::string& layer) {
  static const std::regex include_line(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  static const std::regex omp_pragma(R"(^\s*#\s*pragma\s+omp\b)");
  std::vector<Include> found;
  for (const auto& entry : fs::recursive_directory_iterator(root / layer)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    std::ifstream in(entry.path());
    std::string text;
    int number = 0;
    while (std::getline(in, text)) {
      ++number;
      std::smatch m;
      if (std::regex_search(text, m, include_line))
        found.push_back({fs::relative(entry.path(), root).string(), number, m[1].str()});
      else if (std::regex_search(text, omp_pragma))
        found.push_back({fs::relative(entry.path(), root).string(), number, "#pragma omp"});
    }
  }
  return found;
}

// "runtime/config.h" -> "runtime"; a system header -> "".
std::string layer_of(const std::string& target) {
  const auto slash = target.find('/');
  if (slash == std::string::npos) return "";
  const std::string first = target.substr(0, slash);
  return kMayInclude.count(first) ? first : "";
}

TEST(Layers, EveryIncludePointsDownTheLayers) {
  const fs::path root = FORGE_SOURCE_DIR;
  int checked = 0;
  for (const auto& [layer, allowed] : kMayInclude) {
    for (const Include& inc : includes_under(root, layer)) {
      const std::string target = layer_of(inc.target);
      if (target.empty() || target == layer) continue;
      ++checked;
      EXPECT_TRUE(allowed.count(target))
          << inc.file << ":" << inc.line << ": " << layer << " includes " << inc.target;
    }
  }
  EXPECT_GT(checked, 100);  // the walk found the tree
}

TEST(Layers, OneDnnOpenMpAndYamlStayInTheirPlaces) {
  const fs::path root = FORGE_SOURCE_DIR;
  for (const auto& [layer, allowed] : kMayInclude) {
    for (const Include& inc : includes_under(root, layer)) {
      const bool kernel = inc.file.rfind("core/kernels/", 0) == 0;
      const std::string where = inc.file + ":" + std::to_string(inc.line);
      if (inc.target.rfind("dnnl", 0) == 0 || inc.target.rfind("oneapi/", 0) == 0) {
        EXPECT_TRUE(kernel) << where << ": oneDNN outside core/kernels/";
      }
      if (inc.target == "omp.h" || inc.target == "#pragma omp") {
        EXPECT_TRUE(kernel) << where << ": OpenMP outside core/kernels/";
      }
      if (inc.target.rfind("yaml-cpp/", 0) == 0) {
        EXPECT_EQ(layer, "runtime") << where << ": YAML outside runtime/";
      }
    }
  }
}

}  // namespace
