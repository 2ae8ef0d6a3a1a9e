// The open collector is thread-local: a layer's forward reports into the collector of the thread
// that runs it, and a collector's lifetime is a scope of that thread (the trainer's step).
#include "nn/aux_loss.h"

#include "core/error.h"

namespace forge::nn {
namespace {

thread_local AuxCollector* g_open = nullptr;

}  // namespace

AuxCollector::AuxCollector() : outer_(g_open) { g_open = this; }

AuxCollector::~AuxCollector() { g_open = outer_; }

AuxReport AuxCollector::take() {
  AuxReport out = std::move(report_);
  report_ = {};
  return out;
}

bool aux_collecting() { return g_open != nullptr; }

void report_aux_loss(const Tensor& loss) {
  if (!g_open) return;
  FORGE_CHECK(loss.defined() && loss.numel() == 1, "report_aux_loss: a loss must be a scalar");
  g_open->report_.losses.push_back(loss);
}

void report_aux_stat(const std::string& name, double value) {
  if (!g_open) return;
  auto& [sum, count] = g_open->report_.stats[name];
  sum += value;
  ++count;
}

}  // namespace forge::nn
