// The run's record and its live view: metrics.jsonl (one flat JSON object per logged event,
// README.md: always "step" and "split", then the recipe's snake_case keys in a stable order), a
// reader for that flat schema (tests and report.html), and the terminal progress line — redrawn in
// place on a TTY, one plain line per log event otherwise so CI logs stay readable.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge {

/// One value of a metrics line: a number (non-finite ones are written as null), an integer or a
/// string. Converts implicitly so a line reads `{{"loss", 2.31}, {"tokens", n}}`.
class MetricValue {
 public:
  enum class Kind { number, integer, string, null };
  MetricValue() = default;
  template <std::floating_point T>
  MetricValue(T v)
      : kind_(Kind::number),
        number_(std::same_as<T, float> ? widen(float(v)) : static_cast<double>(v)) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  MetricValue(T v) : kind_(Kind::integer), integer_(static_cast<int64_t>(v)) {}
  MetricValue(const char* s) : kind_(Kind::string), string_(s) {}
  MetricValue(std::string s) : kind_(Kind::string), string_(std::move(s)) {}

  Kind kind() const { return kind_; }
  bool is_numeric() const { return kind_ != Kind::string; }
  /// The value as a double: integers converted, null is NaN; throws for strings.
  double as_double() const;
  const std::string& as_string() const;
  /// The JSON text of the value.
  std::string json() const;

 private:
  // A float is widened through its shortest decimal form, so 0.1f is logged as 0.1.
  static double widen(float v);
  Kind kind_ = Kind::null;
  double number_ = 0;
  int64_t integer_ = 0;
  std::string string_;
};

struct Metric {
  std::string key;
  MetricValue value;
};
using Metrics = std::vector<Metric>;

/// `{"step": 10, "split": "train", "loss": 2.31, ...}` (no newline). Keys must be snake_case and
/// unique and not "step"/"split"; a violation is a bug in the caller (Error(internal)).
std::string format_metrics_line(int64_t step, std::string_view split, const Metrics& metrics);

/// Appends metrics lines to a file, flushing each so `tail -f` and a crash lose nothing logged.
class MetricsWriter {
 public:
  /// Creates parent directories; `append` false starts the file empty. Error(usage) if the file
  /// cannot be opened (output_dir not writable) or is a symlink or not a regular file (a FIFO).
  MetricsWriter(const std::filesystem::path& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  /// `split` is "train" or "val".
  void write(int64_t step, std::string_view split, const Metrics& metrics);

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

/// One parsed line of metrics.jsonl.
struct MetricsRecord {
  int64_t step = 0;
  std::string split;
  Metrics values;  // file order, without "step" and "split"
  const MetricValue* find(std::string_view key) const;
  /// The numeric value of `key` (NaN for null); nullopt when absent or a string.
  std::optional<double> number(std::string_view key) const;
};

/// Parses one line; nullopt if it is not a flat JSON object with an integer "step" and a string
/// "split".
std::optional<MetricsRecord> parse_metrics_line(std::string_view line);

/// All records of a metrics file (empty if the file does not exist). Lines that do not parse (e.g.
/// a final line cut short by a crash) are skipped and counted in `skipped_lines`.
std::vector<MetricsRecord> read_metrics(const std::filesystem::path& path,
                                        int64_t* skipped_lines = nullptr);

/// For resume: atomically rewrites the file keeping only lines with step <= `step` (and dropping
/// lines that do not parse, such as a partial last line). No-op when the file does not exist.
void truncate_after_step(const std::filesystem::path& path, int64_t step);

// ---------------------------------------------------------------------------------------------
// Progress line.

/// What the progress line shows at a step; elapsed_s counts from the start of this process.
struct ProgressStats {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;
};

/// "42s", "4:05", "1:02:03"; "?" when unknown (negative or non-finite).
std::string format_duration(double seconds);
/// "950", "12.3k", "4.56M".
std::string format_rate(double per_second);
/// "step  200/2000 | loss 2.4567 | lr 1.00e-03 | 12.3k tok/s | eta 4:05" (the step is padded to
/// the width of the total so a redrawn line does not jitter).
std::string format_progress_line(const ProgressStats& stats, int64_t total_steps,
                                 std::optional<double> eta_s);

/// Live progress on a terminal, plain lines elsewhere.
class ProgressPrinter {
 public:
  ProgressPrinter(int64_t total_steps, bool is_tty, std::FILE* out = stderr);
  /// True when `f` is a terminal (how the trainer chooses is_tty for stderr).
  static bool is_terminal(std::FILE* f);
  /// Every optimizer step: on a TTY redraws the live line (at most ~10 times a second and always
  /// at the last step); nothing otherwise.
  void step(const ProgressStats& stats);
  /// Every log event: redraws on a TTY, prints one line otherwise.
  void log(const ProgressStats& stats);
  /// A line of its own (eval results, checkpoint saved, warnings) that leaves the live line intact.
  /// Printed through printable() (core/error.h): a path or a quoted value stays on the line.
  void message(const std::string& line);
  /// Several lines (a sample of the model's text) the same way: newlines and tabs kept, other
  /// control characters escaped.
  void text(const std::string& lines);
  /// Ends the live line so later output starts on a fresh line.
  void finish();
  /// Seconds left, estimated from the steps this process has run; nullopt before the second call.
  std::optional<double> eta(const ProgressStats& stats) const;

 private:
  void draw(const ProgressStats& stats);
  void print(const std::string& printable_text);
  void observe(const ProgressStats& stats);
  int64_t total_;
  bool tty_;
  std::FILE* out_;
  std::optional<std::pair<int64_t, double>> first_;  // (step, elapsed_s) of the first observation
  std::string live_;                                  // the line currently shown on the TTY
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace forge
