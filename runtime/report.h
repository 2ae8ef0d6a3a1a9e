// report.html: a self-contained page summarising a run (README.md, "What a run writes") — summary
// numbers, loss and learning-rate curves and a small chart for every other numeric metric, drawn as
// hand-written inline SVG, and the resolved config. No scripts, stylesheets or images are linked,
// so the file opens anywhere, offline, from a copied run directory.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/metrics.h"

namespace forge {

/// Text made safe inside HTML elements and attribute values.
std::string html_escape(std::string_view s);

/// The page for these metrics and config text (pure; write_report and the tests use it).
/// `skipped_lines` is how many metrics lines could not be read, mentioned when non-zero;
/// `sections_html` is put before the config (a classifier's per-class table).
std::string render_report(const std::string& title, const std::vector<MetricsRecord>& records,
                          const std::string& config_yaml, int64_t skipped_lines = 0,
                          const std::string& sections_html = "");

/// Reads <run_dir>/metrics.jsonl, <run_dir>/config.yaml and, when there is one, a classifier's
/// final confusion matrix (runtime/confusion.h), and atomically (re)writes <run_dir>/report.html;
/// returns its path. Missing or unreadable inputs give an emptier page, not an error.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

/// One run of a comparison page: its label (the run directory as given), metrics and config.
struct ReportRun {
  std::string label;
  std::vector<MetricsRecord> records;
  std::string config_yaml;
};

/// A page overlaying runs (a bf16 run beside its fp32 twin, a sweep): a summary row per run with
/// its recipe and train.precision, the train and the validation loss of every run on shared axes,
/// then every other numeric metric, a line per run. Pure; write_comparison and the tests use it.
std::string render_comparison(const std::vector<ReportRun>& runs);

/// Reads each run directory's metrics.jsonl and config.yaml and atomically writes
/// render_comparison's page to `output` (forge report). Error(usage) naming a directory without
/// metrics.jsonl.
void write_comparison(const std::vector<std::filesystem::path>& run_dirs,
                      const std::filesystem::path& output);

}  // namespace forge
