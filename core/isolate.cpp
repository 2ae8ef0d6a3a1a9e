// Forked probes of untrusted files (core/isolate.h).
#include "core/isolate.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace forge {
namespace {

std::atomic<bool> isolation_on{true};
bool in_child = false;

}  // namespace

void set_process_isolation(bool on) { isolation_on = on; }

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
