// The auxiliary-loss channel: a layer can add terms to the training objective (a mixture of
// experts' load-balancing losses) and report statistics (its expert loads) without the recipe
// knowing about it. The trainer opens an AuxCollector around each step's forwards, adds the
// collected losses to the objective and logs them; outside a collector (evaluation, generation, a
// frozen teacher) reports cost one branch and go nowhere.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace forge::nn {

/// What layers reported since the collector last handed it out.
struct AuxReport {
  std::vector<Tensor> losses;  ///< weighted scalar losses, with graph
  /// Statistics by snake_case name: their sum and how many reports the sum covers.
  std::map<std::string, std::pair<double, int64_t>> stats;
};

/// Collects reports on this thread while it lives; collectors nest (the inner one collects).
class AuxCollector {
 public:
  AuxCollector();
  ~AuxCollector();
  AuxCollector(const AuxCollector&) = delete;
  AuxCollector& operator=(const AuxCollector&) = delete;

  /// Hands out and clears what was reported so far.
  AuxReport take();

 private:
  friend void report_aux_loss(const Tensor& loss);
  friend void report_aux_stat(const std::string& name, double value);

  AuxReport report_;
  AuxCollector* outer_;
};

/// Whether a collector is open: layers skip the work of a report nobody reads.
bool aux_collecting();
/// Adds a weighted scalar loss (with graph) to the objective of the current micro-batch.
void report_aux_loss(const Tensor& loss);
/// Adds one observation of statistic `name` (logged as the mean over the step's reports).
void report_aux_stat(const std::string& name, double value);

}  // namespace forge::nn
