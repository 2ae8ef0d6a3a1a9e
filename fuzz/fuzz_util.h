// Shared by the fuzz targets: loaders of files get the fuzzer's bytes through one temp file per
// process, and forge::Error (a clean, reported refusal) is the expected outcome of bad input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/isolate.h"

namespace forge::fuzz {

/// A private directory for this process (libFuzzer's -fork/-jobs run several at once).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("forge-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_input(const std::string& name, const uint8_t* data,
                                         size_t size) {
  auto path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}

/// Runs `body`; forge::Error is swallowed, anything else escapes and libFuzzer reports it. Readers
/// of files from elsewhere run in-process: a forked probe would turn a crash into an error the
/// fuzzer never sees.
template <class Body>
int run_expecting_forge_errors(Body&& body) {
  forge::set_process_isolation(false);
  try {
    body();
  } catch (const forge::Error&) {
  }
  return 0;
}

}  // namespace forge::fuzz
