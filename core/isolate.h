// Parsing untrusted files in a throwaway process. libhdf5 is not hardened against corrupt files: a
// damaged global heap makes it memcpy from a length it read from the file and die with SIGSEGV.
// Files Forge wrote carry a digest that is checked before libhdf5 sees them; a file from
// elsewhere has none, so its readers first run the same read in a forked child, and a child that
// dies becomes one error line in the parent instead of a crash.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace forge {

/// Runs `probe` in a forked child (its stdout and stderr discarded) and returns how the child
/// ended abnormally ("killed by signal 11 (Segmentation fault)"), or nullopt when `probe` returned
/// or threw. The probe must not use OpenMP: libgomp's thread pool does not survive fork. Inside
/// a child, and with isolation turned off, it runs nothing and returns nullopt: the caller's own
/// read that follows is then the only one.
std::optional<std::string> run_isolated(const std::function<void()>& probe);

/// run_isolated(probe) for reading `file`, once per version of the file (its path, size and
/// modification time) in this process: a reader that opens a file several times (its header, then
/// its tensors) probes it once. Only a probe that survived is remembered.
std::optional<std::string> probe_file_once(const std::filesystem::path& file,
                                           const std::function<void()>& probe);

/// Turns run_isolated off (on by default) for fuzz targets, so that a crash reaches the fuzzer.
void set_process_isolation(bool on);

}  // namespace forge
