// Learning-rate schedules: each checked at a handful of steps against values worked out by hand
// (the arithmetic is in the comments), plus the validation messages.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/schedule.h"

namespace forge::optim {
namespace {

ScheduleSpec spec(const std::string& name) {
  ScheduleSpec s;
  s.name = name;
  return s;
}

TEST(Schedule, Constant) {
  ScheduleSpec s = spec("constant");
  s.base_lr = 3e-4;
  EXPECT_EQ(learning_rate(s, 0), 3e-4);
  EXPECT_EQ(learning_rate(s, 123456), 3e-4);
}

TEST(Schedule, WarmupCosine) {
  ScheduleSpec s = spec("warmup_cosine");
  s.base_lr = 1.0, s.warmup_steps = 4, s.max_steps = 14, s.min_lr = 0.1;
  // Warmup (nanoGPT): base*(step+1)/(warmup+1) = (step+1)/5.
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(s, 3), 0.8);
  // Decay over steps 4..14 (10 steps): progress = (step-4)/10, lr = 0.1 + 0.9*0.5*(1+cos(pi*progress)).
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1.0);                           // progress 0
  EXPECT_NEAR(learning_rate(s, 6), 0.1 + 0.9 * 0.9045084972, 1e-10);    // cos(0.2 pi) = 0.8090169944
  EXPECT_NEAR(learning_rate(s, 9), 0.55, 1e-12);                        // cos(pi/2) = 0
  EXPECT_NEAR(learning_rate(s, 13), 0.1 + 0.9 * 0.0244717419, 1e-10);   // cos(0.9 pi) = -0.9510565163
  EXPECT_EQ(learning_rate(s, 14), 0.1);                                 // max_steps: min_lr
  EXPECT_EQ(learning_rate(s, 1000), 0.1);
}

TEST(Schedule, WarmupLinear) {
  ScheduleSpec s = spec("warmup_linear");
  s.base_lr = 1.0, s.warmup_steps = 4, s.max_steps = 14, s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(s, 1), 0.4);   // 2/5
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1.0);   // decay starts at base
  EXPECT_DOUBLE_EQ(learning_rate(s, 9), 0.55);  // 0.1 + 0.9*(1 - 5/10)
  EXPECT_DOUBLE_EQ(learning_rate(s, 11), 0.37); // 0.1 + 0.9*(1 - 7/10)
  EXPECT_EQ(learning_rate(s, 14), 0.1);
  EXPECT_EQ(learning_rate(s, 20), 0.1);
  s.warmup_steps = 0;  // no warmup: starts at base, 0.1 + 0.9*(1 - 7/14) = 0.55 at step 7
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, 7), 0.55);
}

TEST(Schedule, Noam) {
  ScheduleSpec s = spec("noam");
  s.base_lr = 2.0, s.d_model = 64, s.warmup_steps = 100;
  // 2 * 64^-0.5 = 0.25, times min((step+1)^-0.5, (step+1) * 100^-1.5 = (step+1)/1000).
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 0.25 * 0.001);  // min(1, 0.001)
  EXPECT_DOUBLE_EQ(learning_rate(s, 49), 0.25 * 0.05);  // min(0.1414, 0.05)
  EXPECT_DOUBLE_EQ(learning_rate(s, 99), 0.025);        // peak: min(0.1, 0.1); 2/sqrt(64*100)
  EXPECT_DOUBLE_EQ(learning_rate(s, 399), 0.25 * 0.05); // min(1/20, 0.4)
  EXPECT_DOUBLE_EQ(learning_rate(s, 9999), 0.25 * 0.01);
}

TEST(Schedule, SlantedTriangular) {
  ScheduleSpec s = spec("stlr");
  s.base_lr = 0.01, s.max_steps = 1000, s.cut_frac = 0.1, s.ratio = 32;
  // cut = 100; lr = 0.01*(1 + 31p)/32.
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 0.01 / 32);                // p = 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 50), 0.01 * 16.5 / 32);        // p = 50/100
  EXPECT_DOUBLE_EQ(learning_rate(s, 100), 0.01);                   // p = 1 - 0/900
  EXPECT_DOUBLE_EQ(learning_rate(s, 550), 0.01 * 16.5 / 32);       // p = 1 - 450/(100*9)
  EXPECT_NEAR(learning_rate(s, 1000), 0.01 / 32, 1e-15);           // p = 1 - 900/900
  EXPECT_DOUBLE_EQ(learning_rate(s, 5000), 0.01 / 32);             // p clamped at 0
  // 100*0.29 is 28.999999999999996 in double; cut must still be 29, so step 29 is the peak.
  s.cut_frac = 0.29, s.max_steps = 100;
  EXPECT_DOUBLE_EQ(learning_rate(s, 29), 0.01);
}

TEST(Schedule, ValidationQuotesTheBadValue) {
  auto message = [](const ScheduleSpec& s) {
    try {
      learning_rate(s, 0);
    } catch (const Error& e) {
      EXPECT_EQ(int(e.code()), int(ExitCode::usage));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(spec("cosine")),
            "schedule: unknown name (expected constant, warmup_cosine, warmup_linear, noam or stlr), "
            "got 'cosine'");
  ScheduleSpec s = spec("stlr");
  s.max_steps = 100, s.cut_frac = 1.5;
  EXPECT_EQ(message(s), "schedule: stlr needs cut_frac in (0, 1), got 1.5");
  s.cut_frac = 0.005;
  EXPECT_EQ(message(s),
            "schedule: stlr needs max_steps * cut_frac >= 1 (at least one step of increase), got 100 * 0.005");
  s = spec("noam");
  s.d_model = 512;
  EXPECT_EQ(message(s), "schedule: noam needs warmup_steps >= 1, got 0");
  s = spec("warmup_cosine");
  EXPECT_EQ(message(s), "schedule: warmup_cosine needs max_steps >= 1, got 0");
  s.max_steps = 10, s.base_lr = -1;
  EXPECT_EQ(message(s), "schedule: lr must be >= 0, got -1");
}

}  // namespace
}  // namespace forge::optim
