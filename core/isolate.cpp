// Forked probes of untrusted files (core/isolate.h).
#include "core/isolate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "core/error.h"

namespace forge {
namespace {

std::atomic<bool> isolation_on{true};
bool in_child = false;

}  // namespace

void set_process_isolation(bool on) { isolation_on = on; }

std::optional<std::string> probe_file_once(const std::filesystem::path& file,
                                           const std::function<void()>& probe) {
  static std::mutex mutex;
  static std::set<std::string> survived;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return run_isolated(probe);
  const std::string key = file.string() + '\0' + std::to_string(st.st_size) + '\0' +
                          std::to_string(st.st_mtim.tv_sec) + '.' +
                          std::to_string(st.st_mtim.tv_nsec);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (survived.count(key)) return std::nullopt;
  }
  std::optional<std::string> how = run_isolated(probe);
  if (!how && isolation_on && !in_child) {
    std::lock_guard<std::mutex> lock(mutex);
    survived.insert(key);
  }
  return how;
}

std::optional<std::string> run_isolated(const std::function<void()>& probe) {
  if (!isolation_on || in_child) return std::nullopt;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0)
    throw Error(ExitCode::internal, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    in_child = true;
    // A sanitizer's report or a library's message from the child must not reach the user.
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    try {
      probe();
    } catch (...) {
      // The parent repeats the read and reports the problem itself.
    }
    ::_exit(0);  // no atexit handlers or destructors of the parent's state
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      throw Error(ExitCode::internal, std::string("waitpid failed: ") + std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + (name ? " (" + std::string(name) + ")" : "");
  }
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace forge
