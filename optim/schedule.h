// Learning-rate schedules as pure functions of the step (docs/architecture.md: resuming needs only
// the step). `step` is the 0-based index of the optimizer update the rate is used for: the first
// update uses learning_rate(spec, 0).
//
//   constant       base_lr
//   warmup_cosine  nanoGPT's get_lr: base*(step+1)/(warmup+1) for step < warmup, then cosine from
//                  base down to min_lr at step == max_steps, min_lr from there on
//   warmup_linear  the same warmup, then a straight line from base down to min_lr at max_steps
//   noam           Vaswani et al. 2017 eq. 3: base * d_model^-0.5 * min((step+1)^-0.5,
//                  (step+1) * warmup^-1.5). base is the "factor" of the Annotated Transformer
//                  (base = 1 is the paper); the peak, at step+1 == warmup, is base/sqrt(d_model*warmup)
//   stlr           slanted triangular, Howard & Ruder 2018 eq. 3 with T = max_steps, t = step:
//                  cut = floor(T*cut_frac); p = t/cut if t < cut, else 1 - (t-cut)/(cut*(1/cut_frac-1));
//                  lr = base*(1 + p*(ratio-1))/ratio. p is clamped at 0 past T, so the rate never
//                  drops below base/ratio (the paper stops at T).
#pragma once

#include <cstdint>
#include <string>

namespace forge::optim {

/// The `schedule:` config keys plus the numbers they need from elsewhere (base_lr = optimizer.lr,
/// max_steps = train.max_steps, d_model = schedule.noam_d_model or model.d_model).
struct ScheduleSpec {
  std::string name = "constant";  // constant | warmup_cosine | warmup_linear | noam | stlr
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t max_steps = 0;
  double min_lr = 0.0;
  double cut_frac = 0.1;
  double ratio = 32.0;
  int64_t d_model = 0;
};

/// Throws Error(usage) quoting the bad value, e.g. "schedule: stlr needs cut_frac in (0, 1), got 1.5".
void validate(const ScheduleSpec& spec);

/// The learning rate for update `step` (>= 0); validates spec first.
double learning_rate(const ScheduleSpec& spec, int64_t step);

}  // namespace forge::optim
