// The checkable rewards of grpo (docs/recipes/grpo.md): each completion, with the prompt record it
// answers, gets a number from every reward function of grpo.rewards: the exact match of a final
// answer extracted by a regex, a regex match, or an external command that reads JSONL records on
// stdin and prints one reward a line; their weighted sum is the completion's reward.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace forge {

/// What a verifier scores: the prompt's record (its "prompt" and the fields the verifiers read,
/// e.g. "answer") and one completion of it, decoded.
struct VerifierSample {
  const nlohmann::json* record = nullptr;
  std::string completion;
};

/// One reward function. score() gives one finite reward per sample, in order; bad output of an
/// external verifier throws Error(data) in one line naming the config key.
class Verifier {
 public:
  virtual ~Verifier() = default;
  virtual const std::string& name() const = 0;  ///< the grpo.rewards entry ("answer", ...)
  virtual std::vector<double> score(const std::vector<VerifierSample>& samples) const = 0;
};

/// How grpo.rewards' functions are configured (the grpo: keys of the same names).
struct VerifierOptions {
  std::vector<std::string> rewards = {};  ///< "answer", "regex", "command", each at most once
  std::vector<double> weights = {};  ///< one per reward (grpo.answer_weight, ...), or empty: all 1
  std::string answer_field = {};     ///< the record field an extracted answer must equal
  std::string answer_pattern = {};   ///< group 1 of its last match is the final answer
  std::string format_pattern = {};   ///< "regex": 1 when it matches somewhere in the completion
  std::string command = {};          ///< run by /bin/sh -c
  double command_timeout = 60;       ///< seconds the command may take per call
};

/// The Oniguruma regex `pattern` compiled (Ruby syntax, UTF-8), or Error(usage) naming `key` and
/// Oniguruma's message; `groups` > 0 also requires that many capture groups.
class VerifierRegex {
 public:
  VerifierRegex(const std::string& pattern, const std::string& key, int groups = 0);
  ~VerifierRegex();
  VerifierRegex(const VerifierRegex&) = delete;
  VerifierRegex& operator=(const VerifierRegex&) = delete;
  /// Whether the regex matches somewhere in `text`.
  bool matches(const std::string& text) const;
  /// Group 1 of the last non-overlapping match in `text`; false when nothing matches.
  bool last_group(const std::string& text, std::string& group) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A config problem of grpo.rewards' functions: the key to blame and the one-line message.
struct VerifierProblem {
  std::string key, message;
};

/// Every problem of `options`: an empty list, an unknown or repeated name (grpo.rewards), a regex that does not compile or lacks the
/// answer's capture group (grpo.answer_pattern, grpo.format_pattern), "command" without a command
/// (grpo.command). Only the keys of the listed functions are read.
std::vector<VerifierProblem> check_verifiers(const VerifierOptions& options);

/// The reward functions of `options` with their weights, regexes compiled; Error(usage) with the
/// first message of check_verifiers when there is a problem.
class Rewards {
 public:
  explicit Rewards(const VerifierOptions& options);
  /// Every function's rewards (outer: functions in grpo.rewards order) of `samples`.
  std::vector<std::vector<double>> score(const std::vector<VerifierSample>& samples) const;
  /// The weighted sum of every function's reward for each sample.
  std::vector<double> total(const std::vector<std::vector<double>>& per_function) const;
  const std::vector<std::unique_ptr<Verifier>>& functions() const { return functions_; }
  /// Record fields the functions read (answer_field for "answer"), to check every prompt record.
  const std::vector<std::string>& required_fields() const { return fields_; }

 private:
  std::vector<std::unique_ptr<Verifier>> functions_;
  std::vector<double> weights_;
  std::vector<std::string> fields_;
};

/// Field `field` of a prompt record as the answer verifier compares it: a string as it is, any
/// other JSON value as its JSON text (42, true); "" when absent.
std::string record_answer(const nlohmann::json& record, const std::string& field);

/// The JSONL line the external command reads for `sample`: its record's fields with "completion"
/// set to the completion (a record's own "completion" field is replaced).
std::string verifier_record(const VerifierSample& sample);

/// Runs `command` under /bin/sh -c in a process group of its own, writes `input` to its stdin and
/// reads `lines` finite numbers, one a line, from its stdout. Error(data) naming grpo.command (and
/// quoting the last line of its stderr) when it runs past `timeout_s` seconds (its process group is
/// killed), exits with a status other than 0 or by a signal, or prints fewer or more lines or a
/// line that is not a finite number.
std::vector<double> run_verifier_command(const std::string& command, const std::string& input,
                                         size_t lines, double timeout_s);

}  // namespace forge
