// The schedules of optim/schedule.h, one branch each, with the formulas written as the papers and
// nanoGPT write them so tests can check them against hand arithmetic.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace forge::optim {
namespace {

template <class V>
void require(bool ok, const std::string& what, const V& value) {
  if (!ok) throw Error(ExitCode::usage, detail::concat("schedule: ", what, ", got ", value));
}

// nanoGPT's warmup: (step+1)/(warmup+1) of base, so the first update already moves and the last
// warmup step is just under base.
double warmup(const ScheduleSpec& s, int64_t step) {
  return s.base_lr * double(step + 1) / double(s.warmup_steps + 1);
}

// Fraction of the decay segment [warmup_steps, max_steps] done at `step` (callers ensure
// warmup_steps <= step < max_steps).
double decay_progress(const ScheduleSpec& s, int64_t step) {
  return double(step - s.warmup_steps) / double(s.max_steps - s.warmup_steps);
}

// Howard & Ruder's cut = floor(T*cut_frac); the 1e-9 keeps products like 100*0.29 =
// 28.999999999999996 at the intended 29.
double stlr_cut(const ScheduleSpec& s) { return std::floor(double(s.max_steps) * s.cut_frac + 1e-9); }

}  // namespace

void validate(const ScheduleSpec& s) {
  const std::string& n = s.name;
  require(n == "constant" || n == "warmup_cosine" || n == "warmup_linear" || n == "noam" || n == "stlr",
          "unknown name (expected constant, warmup_cosine, warmup_linear, noam or stlr)",
          "'" + n + "'");
  require(std::isfinite(s.base_lr) && s.base_lr >= 0, "lr must be >= 0", s.base_lr);
  require(s.warmup_steps >= 0, "warmup_steps must be >= 0", s.warmup_steps);
  require(std::isfinite(s.min_lr) && s.min_lr >= 0, "min_lr must be >= 0", s.min_lr);
  if (n == "warmup_cosine" || n == "warmup_linear" || n == "stlr")
    require(s.max_steps >= 1, n + " needs max_steps >= 1", s.max_steps);
  if (n == "noam") {
    require(s.warmup_steps >= 1, "noam needs warmup_steps >= 1", s.warmup_steps);
    require(s.d_model >= 1, "noam needs d_model >= 1", s.d_model);
  }
  if (n == "stlr") {
    require(s.cut_frac > 0 && s.cut_frac < 1, "stlr needs cut_frac in (0, 1)", s.cut_frac);
    require(std::isfinite(s.ratio) && s.ratio >= 1, "stlr needs ratio >= 1", s.ratio);
    require(stlr_cut(s) >= 1,
            "stlr needs max_steps * cut_frac >= 1 (at least one step of increase)",
            detail::concat(s.max_steps, " * ", s.cut_frac));
  }
}

double learning_rate(const ScheduleSpec& s, int64_t step) {
  validate(s);
  FORGE_CHECK(step >= 0, "learning_rate: step must be >= 0, got ", step);
  if (s.name == "constant") return s.base_lr;

  if (s.name == "warmup_cosine" || s.name == "warmup_linear") {
    if (step < s.warmup_steps) return warmup(s, step);
    if (step >= s.max_steps) return s.min_lr;
    double progress = decay_progress(s, step);
    double coeff = s.name == "warmup_cosine" ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                                             : 1.0 - progress;
    return s.min_lr + coeff * (s.base_lr - s.min_lr);
  }

  if (s.name == "noam") {
    double t = double(step + 1);
    return s.base_lr / std::sqrt(double(s.d_model)) *
           std::min(1.0 / std::sqrt(t), t * std::pow(double(s.warmup_steps), -1.5));
  }

  // stlr
  double t = double(step);
  double cut = stlr_cut(s);
  double p = t < cut ? t / cut : 1.0 - (t - cut) / (cut * (1.0 / s.cut_frac - 1.0));
  p = std::max(p, 0.0);
  return s.base_lr * (1.0 + p * (s.ratio - 1.0)) / s.ratio;
}

}  // namespace forge::optim
