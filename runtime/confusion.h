// The confusion matrix of a classifier and what is read off it: accuracy, per-class precision,
// recall and F1, macro-F1; as text for `forge eval`, as JSON beside a run's metrics
// (classification.json, the final evaluation's), and as the report's per-class table and picture.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace forge {

/// Per-class numbers read off a confusion matrix.
struct ClassScores {
  double precision = 0, recall = 0, f1 = 0;
  int64_t support = 0;  ///< true members of the class
};

class Confusion {
 public:
  explicit Confusion(std::vector<std::string> labels);

  /// Counts `n` predictions of `predicted` for `truth`; Error(internal) for an id outside the
  /// labels.
  void add(int64_t truth, int64_t predicted, int64_t n = 1);
  /// Adds another matrix of the same labels.
  void merge(const Confusion& other);

  int64_t count(int64_t truth, int64_t predicted) const;
  int64_t total() const;
  const std::vector<std::string>& labels() const { return labels_; }

  double accuracy() const;
  /// precision, recall and F1 of class c (0 where undefined: no predictions, no members).
  ClassScores scores(int64_t c) const;
  /// The mean F1 over the classes that occur as truth or prediction (scikit-learn's macro average
  /// over the labels present), so a small batch without some class is not scored as if it had
  /// missed it.
  double macro_f1() const;

  /// {"labels": [...], "confusion": [[...], ...]} (rows true, columns predicted).
  std::string to_json() const;
  /// The inverse; nullopt for anything but that shape.
  static std::optional<Confusion> from_json(const std::string& text);

  /// The matrix with label names and a per-class table, for a terminal.
  std::string to_text() const;
  /// The report's section: per-class table and the matrix as an SVG heat map.
  std::string to_html() const;

 private:
  std::vector<std::string> labels_;
  std::vector<int64_t> counts_;  // labels x labels, row-major: [truth][predicted]
};

/// Where a classifier run keeps its final evaluation's matrix.
std::filesystem::path confusion_path(const std::filesystem::path& run_dir);

}  // namespace forge
