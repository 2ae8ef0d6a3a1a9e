// check_output_path (core/output_path.h): paths compared after resolving symlinks, files by
// device and inode so that a hard link is caught too.
#include "core/output_path.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// Files of an input directory compared by inode: enough for any run or model directory, bounded
// so that an input naming a huge tree cannot stall the check.
constexpr int kMaxFilesPerDirectory = 100000;

using FileId = std::pair<dev_t, ino_t>;

bool file_id(const fs::path& path, FileId& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

// Whether `inner` is `outer` or lies below it (both resolved).
bool within(const fs::path& inner, const fs::path& outer) {
  return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first ==
         outer.end();
}

[[noreturn]] void refuse(const std::string& what, const fs::path& output, const std::string& why) {
  throw Error(ExitCode::usage, what + " " + quoted_path(output.string()) + ": " + why);
}

}  // namespace

void check_output_path(const std::string& what, const fs::path& output,
                       const std::vector<fs::path>& inputs, OutputShape shape) {
  std::error_code ec;
  const fs::path parent = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  if (shape == OutputShape::file && !fs::is_directory(parent, ec))
    refuse(what, output, "no directory " + quoted_path(parent.string()));
  const fs::file_status status = fs::status(output, ec);
  if (fs::exists(status)) {
    if (shape == OutputShape::file && !fs::is_regular_file(status))
      refuse(what, output,
             fs::is_directory(status) ? "is a directory; name a file"
                                      : "exists and is not a regular file (a device, FIFO or "
                                        "socket); name a file");
    if (shape == OutputShape::directory && !fs::is_directory(status))
      refuse(what, output, "exists and is not a directory");
  }
  const fs::path out = resolved(output);
  FileId out_id{};
  const bool out_exists = file_id(output, out_id);
  for (const fs::path& input : inputs) {
    if (input.empty() || !fs::exists(input, ec)) continue;
    const fs::path in = resolved(input);
    const std::string named = std::string(" ").append(quoted_path(input.string()));
    if (out == in) refuse(what, output, "is the input" + named + "; choose another output");
    const bool input_is_directory = fs::is_directory(in, ec);
    if (input_is_directory && within(out, in))
      refuse(what, output, "is inside the input" + named + "; choose another output");
    if (shape == OutputShape::directory && within(in, out))
      refuse(what, output, "holds the input" + named + "; choose another output");
    if (!out_exists) continue;
    FileId id{};
    if (file_id(input, id) && id == out_id)
      refuse(what, output, "is the input" + named + " (the same file); choose another output");
    if (!input_is_directory || shape != OutputShape::file) continue;
    int seen = 0;
    for (auto it = fs::recursive_directory_iterator(
             in, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator() && seen < kMaxFilesPerDirectory;
         it.increment(ec), ++seen)
      if (it->is_regular_file(ec) && file_id(it->path(), id) && id == out_id)
        refuse(what, output,
               "is a link to " + quoted_path(it->path().string()) + " of the input" + named +
                   "; choose another output");
  }
}

}  // namespace forge
