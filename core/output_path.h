// The one check every command makes on what it is about to write (docs/reliability.md, "Outputs"):
// an output is never one of the command's inputs, never inside an input's run or model directory,
// never a device, FIFO or socket. Checked before anything is read or written, so a mistyped
// --output costs nothing and destroys nothing.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace forge {

/// What a command writes at the path: one file, or a directory it fills (export --format hf).
enum class OutputShape { file, directory };

/// Error(usage), one line starting with `what` (the command and its option, "export: --output"),
/// naming the output and the input it collides with, when `output`
/// - is one of `inputs` (the same path, through symlinks, or a hard link to the same file),
/// - lies inside an input that is a directory (a run or a Hugging Face model directory),
/// - is a directory (shape directory) that holds one of the inputs,
/// - exists and is not a regular file (shape file: a directory, device, FIFO or socket) or not a
///   directory (shape directory),
/// - or (shape file) is in a directory that does not exist.
/// `inputs` that do not exist are ignored (their readers report them).
void check_output_path(const std::string& what, const std::filesystem::path& output,
                       const std::vector<std::filesystem::path>& inputs, OutputShape shape);

}  // namespace forge
