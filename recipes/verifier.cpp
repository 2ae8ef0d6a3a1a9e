// grpo's reward functions. Regexes are Oniguruma's in its Python syntax, which forge_data links
// already: a pattern written for a TRL reward function (Python's re) works as it is, and a
// backtracking blow-up ends at Oniguruma's retry limit instead of hanging or, as libstdc++'s
// recursive std::regex does on long inputs, overflowing the stack. The external command is spawned
// with posix_spawn (safe beside OpenMP's threads) and fed and read through poll, so a command that
// stops reading, never prints or never exits is killed at its deadline.
#include "recipes/verifier.h"

#include <fcntl.h>
#include <oniguruma.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>

#include "core/error.h"

extern char** environ;

namespace forge {

// ---- regexes ------------------------------------------------------------------------------------

struct VerifierRegex::Impl {
  regex_t* regex = nullptr;
  std::string key;
  ~Impl() {
    if (regex) onig_free(regex);
  }
  // The first match at or after byte `from` into `region`, or false; Error(usage) naming the key
  // when Oniguruma gives up (its retry limit).
  bool search(const std::string& text, size_t from, OnigRegion* region) const {
    const auto* s = reinterpret_cast<const OnigUChar*>(text.data());
    const int r = onig_search(regex, s, s + text.size(), s + from, s + text.size(), region,
                              ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) return false;
    if (r < 0) {
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, r);
      throw Error(ExitCode::usage, detail::concat(key, ": the search in a completion failed: ",
                                                  reinterpret_cast<const char*>(message)));
    }
    return true;
  }
};

namespace {

struct RegionDeleter {
  void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
};
using Region = std::unique_ptr<OnigRegion, RegionDeleter>;

}  // namespace

VerifierRegex::VerifierRegex(const std::string& pattern, const std::string& key, int groups)
    : impl_(std::make_unique<Impl>()) {
  impl_->key = key;
  static std::once_flag init;
  std::call_once(init, [] {
    OnigEncoding utf8[] = {ONIG_ENCODING_UTF8};
    onig_initialize(utf8, 1);
  });
  static std::mutex compiling;  // onig_new is not thread-safe
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  OnigErrorInfo info{};
  int r = 0;
  {
    std::lock_guard<std::mutex> held(compiling);
    r = onig_new(&impl_->regex, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                 ONIG_SYNTAX_PYTHON, &info);
  }
  if (r != ONIG_NORMAL) {
    impl_->regex = nullptr;
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, r, &info);
    throw Error(ExitCode::usage,
                detail::concat(key, ": '", printable(pattern), "' does not compile: ",
                               printable(reinterpret_cast<const char*>(message))));
  }
  const int have = onig_number_of_captures(impl_->regex);
  if (have < groups)
    throw Error(ExitCode::usage,
                detail::concat(key, ": '", printable(pattern), "' has ", have,
                               " capture groups; group ",
                               groups, " must capture the answer, e.g. '####\\s*(\\S+)'"));
}

VerifierRegex::~VerifierRegex() = default;

bool VerifierRegex::matches(const std::string& text) const {
  Region region(onig_region_new());
  return impl_->search(text, 0, region.get());
}

bool VerifierRegex::last_group(const std::string& text, std::string& group) const {
  Region region(onig_region_new());
  bool found = false;
  for (size_t from = 0; from <= text.size() && impl_->search(text, from, region.get());) {
    const int begin = region->beg[1], end = region->end[1];
    if (begin >= 0) {  // group 1 took part in this match
      group.assign(text, size_t(begin), size_t(end - begin));
      found = true;
    }
    // The next match starts after this one, one byte on after an empty match.
    from = std::max(size_t(region->end[0]), size_t(region->beg[0]) + 1);
  }
  return found;
}

// ---- the reward functions -----------------------------------------------------------------------

namespace {

std::string trimmed(const std::string& s) {
  const char* space = " \t\r\n\f\v";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

// 1 when group 1 of the answer pattern's last match equals the record's answer field, both with
// surrounding white space removed; 0 otherwise (no match included).
class AnswerVerifier : public Verifier {
 public:
  AnswerVerifier(const VerifierOptions& o)
      : field_(o.answer_field), regex_(o.answer_pattern, "grpo.answer_pattern", 1) {}
  const std::string& name() const override { return name_; }
  std::vector<double> score(const std::vector<VerifierSample>& samples) const override {
    std::vector<double> out;
    for (const VerifierSample& s : samples) {
      std::string answer;
      out.push_back(regex_.last_group(s.completion, answer) &&
                            trimmed(answer) == trimmed(record_answer(*s.record, field_))
                        ? 1.0
                        : 0.0);
    }
    return out;
  }

 private:
  std::string name_ = "answer", field_;
  VerifierRegex regex_;
};

// 1 when the format pattern matches somewhere in the completion (anchor it with \A and \Z for the
// whole completion), else 0.
class RegexVerifier : public Verifier {
 public:
  explicit RegexVerifier(const VerifierOptions& o) : regex_(o.format_pattern, "grpo.format_pattern") {}
  const std::string& name() const override { return name_; }
  std::vector<double> score(const std::vector<VerifierSample>& samples) const override {
    std::vector<double> out;
    for (const VerifierSample& s : samples) out.push_back(regex_.matches(s.completion) ? 1.0 : 0.0);
    return out;
  }

 private:
  std::string name_ = "regex";
  VerifierRegex regex_;
};

// One call of the command per score(): every sample's record on stdin, a reward a line back.
class CommandVerifier : public Verifier {
 public:
  explicit CommandVerifier(const VerifierOptions& o)
      : command_(o.command), timeout_(o.command_timeout) {}
  const std::string& name() const override { return name_; }
  std::vector<double> score(const std::vector<VerifierSample>& samples) const override {
    std::string input;
    for (const VerifierSample& s : samples) input += verifier_record(s) + "\n";
    return run_verifier_command(command_, input, samples.size(), timeout_);
  }

 private:
  std::string name_ = "command", command_;
  double timeout_;
};

}  // namespace

std::string record_answer(const nlohmann::json& record, const std::string& field) {
  const auto it = record.find(field);
  if (it == record.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::vector<VerifierProblem> check_verifiers(const VerifierOptions& o) {
  std::vector<VerifierProblem> problems;
  if (o.rewards.empty())
    problems.push_back({"grpo.rewards", "grpo.rewards: empty; name at least one reward function "
                                        "(answer, regex or command)"});
  FORGE_CHECK(o.weights.empty() || o.weights.size() == o.rewards.size(), "verifiers: ",
              o.weights.size(), " weights for ", o.rewards.size(), " reward functions");
  std::set<std::string> seen;
  const auto regex = [&](const std::string& pattern, const std::string& key, int groups) {
    try {
      VerifierRegex compiled(pattern, key, groups);
    } catch (const Error& e) {
      problems.push_back({key, e.what()});
    }
  };
  for (const std::string& name : o.rewards) {
    if (!seen.insert(name).second)
      problems.push_back(
          {"grpo.rewards", "grpo.rewards: '" + printable(name) + "' is listed twice"});
    else if (name == "answer")
      regex(o.answer_pattern, "grpo.answer_pattern", 1);
    else if (name == "regex")
      regex(o.format_pattern, "grpo.format_pattern", 0);
    else if (name == "command" && o.command.empty())
      problems.push_back({"grpo.command", "grpo.command: grpo.rewards lists \"command\"; name "
                                          "the command that scores the completions"});
    else if (name != "command")
      problems.push_back({"grpo.rewards", "grpo.rewards: unknown reward function '" + printable(name) +
                                              "' (answer, regex or command)"});
  }
  return problems;
}

Rewards::Rewards(const VerifierOptions& o) {
  const std::vector<VerifierProblem> problems = check_verifiers(o);
  if (!problems.empty()) throw Error(ExitCode::usage, problems.front().message);
  for (const std::string& name : o.rewards) {
    if (name == "answer") {
      functions_.push_back(std::make_unique<AnswerVerifier>(o));
      fields_.push_back(o.answer_field);
    } else if (name == "regex") {
      functions_.push_back(std::make_unique<RegexVerifier>(o));
    } else {
      functions_.push_back(std::make_unique<CommandVerifier>(o));
    }
  }
  weights_ = o.weights.empty() ? std::vector<double>(o.rewards.size(), 1.0) : o.weights;
}

std::vector<std::vector<double>> Rewards::score(const std::vector<VerifierSample>& samples) const {
  std::vector<std::vector<double>> out;
  for (const auto& f : functions_) out.push_back(f->score(samples));
  return out;
}

std::vector<double> Rewards::total(const std::vector<std::vector<double>>& per_function) const {
  std::vector<double> out(per_function.empty() ? 0 : per_function[0].size(), 0.0);
  for (size_t f = 0; f < per_function.size(); ++f)
    for (size_t i = 0; i < out.size(); ++i) out[i] += weights_[f] * per_function[f][i];
  return out;
}

std::string verifier_record(const VerifierSample& sample) {
  nlohmann::json record = *sample.record;
  record["completion"] = sample.completion;
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- the external command -----------------------------------------------------------------------

namespace {

[[noreturn]] void command_failed(const std::string& what) {
  throw Error(ExitCode::data, "grpo.command: " + what);
}

// The pipes and the process of one call; whatever is still open or running when it goes is
// closed and killed (its whole process group), so an error never leaves a verifier behind.
class Child {
 public:
  ~Child() {
    for (int fd : {to_child, from_child, errors_from_child})
      if (fd >= 0) close(fd);
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  int to_child = -1, from_child = -1, errors_from_child = -1;
  pid_t pid = -1;
};

void close_fd(int& fd) {
  close(fd);
  fd = -1;
}

// SIGPIPE held back in this thread while it writes to a command that may have stopped reading (the
// write then fails with EPIPE instead of killing forge); a pending one is consumed on the way out.
class HoldSigpipe {
 public:
  HoldSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~HoldSigpipe() {
    const timespec now{0, 0};
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) sigtimedwait(&pipe_, nullptr, &now);
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
};

// The status the child ended with, waiting until `deadline`; false when it is still running.
bool wait_for_exit(Child& child, std::chrono::steady_clock::time_point deadline, int& status) {
  for (;;) {
    const pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) {
      child.pid = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    usleep(2000);
  }
}

// The reward on one line of the command's output, or false with `why` when it is not one.
bool parse_reward(const std::string& line, size_t index, double& reward, std::string& why) {
  const std::string text = trimmed(line);
  char* end = nullptr;
  errno = 0;
  reward = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size() && errno != ERANGE &&
      std::isfinite(reward))
    return true;
  why = detail::concat("line ", index + 1, " of its output is '", printable(text.substr(0, 40)),
                       text.size() > 40 ? "...'" : "'", ", not a finite number");
  return false;
}

// What the command wrote on stderr, for its error: the last non-blank line.
std::string stderr_note(const std::string& errors) {
  size_t end = errors.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t start = errors.find_last_of('\n', end);
  const std::string line = errors.substr(start == std::string::npos ? 0 : start + 1,
                                         end + 1 - (start == std::string::npos ? 0 : start + 1));
  return " (its stderr: " + printable(line.substr(0, 200)) + ")";
}

}  // namespace

std::vector<double> run_verifier_command(const std::string& command, const std::string& input,
                                         size_t lines, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_s));
  const HoldSigpipe hold;
  Child child;
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) command_failed(std::string("pipe: ") + std::strerror(errno));
  child.to_child = in[1];
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    command_failed(std::string("pipe: ") + std::strerror(errno));
  }
  child.from_child = out[0];
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(in[0]);
    close(out[1]);
    command_failed(std::string("pipe: ") + std::strerror(errno));
  }
  child.errors_from_child = err[0];
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_init(&attr);
  // A group of its own, so that a timeout kills what the shell started too; SIGPIPE at its default
  // and unblocked in the child whatever the parent does with it.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t pipe_signal, none;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &pipe_signal);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  for (int fd : {in[0], out[1], err[1]}) close(fd);
  if (spawned != 0) command_failed(std::string("cannot start /bin/sh: ") + std::strerror(spawned));
  child.pid = pid;
  fcntl(child.to_child, F_SETFL, O_NONBLOCK);

  // Feed stdin and drain stdout and stderr together: a command may print before it has read
  // everything. Its stderr is kept (the end of it) for the message when it fails: forge's own
  // error stays one line.
  std::string output, errors;
  const auto failed = [&](const std::string& what) { command_failed(what + stderr_note(errors)); };
  size_t written = 0;
  if (input.empty()) close_fd(child.to_child);
  const size_t max_output = 64 * lines + (1 << 20);
  while (child.from_child >= 0 || child.errors_from_child >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      failed(detail::concat("no answer within grpo.command_timeout ", timeout_s,
                            " s (its process group was killed)"));
    pollfd fds[3] = {{child.from_child, POLLIN, 0},
                     {child.errors_from_child, POLLIN, 0},
                     {child.to_child, POLLOUT, 0}};
    const int n = poll(fds, 3, int(std::min<int64_t>(left.count(), 100)));  // fd -1: skipped
    if (n < 0 && errno != EINTR) command_failed(std::string("poll: ") + std::strerror(errno));
    if (n <= 0) continue;
    if (child.to_child >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = write(child.to_child, input.data() + written, input.size() - written);
      if (w > 0) written += size_t(w);
      // A command that stops reading (EPIPE) is judged by what it prints and how it exits.
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size())
        close_fd(child.to_child);
    }
    for (int k : {0, 1}) {
      int& fd = k == 0 ? child.from_child : child.errors_from_child;
      if (fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[65536];
      const ssize_t r = read(fd, buffer, sizeof buffer);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        close_fd(fd);
      } else if (r > 0 && k == 0) {
        output.append(buffer, size_t(r));
        if (output.size() > max_output)
          failed(detail::concat("printed more than ", max_output, " bytes for ", lines,
                                " completions"));
      } else if (r > 0) {
        errors.append(buffer, size_t(r));
        if (errors.size() > 8192) errors.erase(0, errors.size() - 4096);
      }
    }
  }
  int status = 0;
  if (!wait_for_exit(child, deadline, status))
    failed(detail::concat("closed its output but did not exit within grpo.command_timeout ",
                          timeout_s, " s (its process group was killed)"));
  if (WIFSIGNALED(status))
    failed(detail::concat("killed by signal ", WTERMSIG(status), " (",
                          strsignal(WTERMSIG(status)), ")"));
  if (WEXITSTATUS(status) != 0) failed(detail::concat("exited with status ", WEXITSTATUS(status)));

  std::vector<double> rewards;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    if (rewards.size() == lines)
      failed(detail::concat("printed more than ", lines, " lines for ", lines, " completions"));
    double reward = 0;
    std::string why;
    if (!parse_reward(output.substr(start, end - start), rewards.size(), reward, why)) failed(why);
    rewards.push_back(reward);
    start = end + 1;
  }
  if (rewards.size() < lines)
    failed(detail::concat("printed ", rewards.size(), " lines for ", lines,
                          " completions (one reward a line, in input order)"));
  return rewards;
}

}  // namespace forge
