// forge_bench: forward+backward timings of Forge's hot ops at fixed shapes; the Forge half of
// scripts/bench (scripts/bench_core.py is the PyTorch half, with the same shapes and math). Prints
// one line per op, "op=NAME ms=MEDIAN fwd_ms=MEDIAN bwd_ms=MEDIAN", for the script to join.
// Medians, because the machine is shared and a few iterations are always disturbed.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/ops.h"
#include "nn/aux_loss.h"
#include "nn/moe.h"

namespace {

using namespace forge;

constexpr const char* kUsage =
    "usage: forge_bench SUITE [--only OP[,OP...]] [--repeat N]\n"
    "\n"
    "suites:\n"
    "  core   linear, attention, layernorm, cross_entropy, kd_kl_div, kd_kl_div_v256, gelu,\n"
    "         embedding (forward+backward)\n"
    "  moe    moe_shakespeare, moe_gpt2: an MoE layer of 8 GELU experts, top-2 noisy gating,\n"
    "         capacity 1.25, cv2 losses (forward+backward)\n"
    "\n"
    "  --only OP,...   run only these ops of the suite\n"
    "  --repeat N      time N times the default number of iterations (default 1)\n";

// One op's inputs and its forward; backward() runs from the output with `dy` (undefined when the
// output is a scalar). Gradients of `leaves` are cleared before each iteration, outside the timing.
struct Bench {
  int warmup = 3;
  int iters = 20;
  std::vector<Tensor> leaves;
  std::function<Tensor()> forward;
  Tensor dy;
};

struct Case {
  const char* name;
  std::function<Bench()> make;  // allocates inputs only when the op is selected
};

Tensor randn(const Shape& shape, Generator& gen, double std = 1.0, bool grad = false) {
  Tensor t = normal(shape, 0.0, std, gen);
  if (grad) t.set_requires_grad(true);
  return t;
}

// i64 ids uniform in [0, n).
Tensor random_ids(int64_t count, int64_t n, uint64_t seed) {
  Tensor ids = empty({count}, DType::i64);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) p[i] = pick(rng);
  return ids;
}

// GPT-2 small shapes: N = B*T = 2048 tokens, C = 768, hidden 4C = 3072, V = 50257, H = 12, D = 64.
constexpr int64_t N = 2048, C = 768, F = 3072, V = 50257, B = 8, H = 12, T = 256, D = 64;

// Distillation at temperature 2 over 768 rows: student and teacher [768, vocab], the teacher
// without gradient, every row scored, mean over rows.
Bench kd_kl_div_bench(int64_t vocab, int warmup, int iters) {
  Generator gen(7);
  Tensor student = randn({768, vocab}, gen, 1.0, true), teacher = randn({768, vocab}, gen);
  KLDivOptions options;
  options.temperature = 2.0;
  return Bench{warmup, iters, {student},
               [=] { return kd_kl_div(student, teacher, Tensor(), options); }, Tensor()};
}

std::vector<Case> core_suite() {
  return {
      {"linear",
       [] {
         Generator gen(1);
         Tensor x = randn({N, C}, gen, 1.0, true), w = randn({F, C}, gen, 0.02, true),
                b = randn({F}, gen, 0.02, true);
         return Bench{3, 20, {x, w, b}, [=] { return linear(x, w, b); }, randn({N, F}, gen)};
       }},
      {"attention",
       [] {
         Generator gen(2);
         Tensor q = randn({B, H, T, D}, gen, 1.0, true), k = randn({B, H, T, D}, gen, 1.0, true),
                v = randn({B, H, T, D}, gen, 1.0, true);
         AttentionOptions causal;
         causal.causal = true;
         return Bench{3, 20, {q, k, v},
                      [=] { return scaled_dot_product_attention(q, k, v, {}, causal); },
                      randn({B, H, T, D}, gen)};
       }},
      {"layernorm",
       [] {
         Generator gen(3);
         Tensor x = randn({N, C}, gen, 1.0, true);
         Tensor w = add(randn({C}, gen, 0.1), 1.0).set_requires_grad(true);
         Tensor b = randn({C}, gen, 0.1, true);
         return Bench{3, 20, {x, w, b}, [=] { return layer_norm(x, w, b); }, randn({N, C}, gen)};
       }},
      {"cross_entropy",
       [] {
         // 2048 x 50257 logits are 412 MB: fewer iterations keep the suite short.
         Generator gen(4);
         Tensor logits = randn({N, V}, gen, 1.0, true);
         Tensor targets = random_ids(N, V, 4);
         return Bench{1, 6, {logits}, [=] { return cross_entropy(logits, targets); }, Tensor()};
       }},
      {"kd_kl_div", [] { return kd_kl_div_bench(V, 1, 6); }},
      {"kd_kl_div_v256", [] { return kd_kl_div_bench(256, 3, 20); }},
      {"gelu",
       [] {
         Generator gen(5);
         Tensor x = randn({N, F}, gen, 1.0, true);
         return Bench{3, 20, {x}, [=] { return gelu(x); }, randn({N, F}, gen)};
       }},
      {"embedding",
       [] {
         Generator gen(6);
         Tensor w = randn({V, C}, gen, 0.02, true);
         Tensor ids = random_ids(N, V, 6);
         return Bench{3, 20, {w}, [=] { return embedding(w, ids); }, randn({N, C}, gen)};
       }},
  };
}

// An MoE layer as configs/gpt_shakespeare_moe.yaml builds it (8 GELU experts, top-2 noisy
// gating, capacity 1.25, cv2 losses): forward, the loss sum(out * dy) + the balancing loss,
// backward. n tokens of width c, experts of width h.
Bench moe_bench(int64_t n, int64_t c, int64_t h, int iters) {
  Generator gen(8);
  nn::MoEConfig config{.every = 1, .n_experts = 8, .top_k = 2};
  auto layer = std::make_shared<nn::MoE>(
      config, nn::MoELayerShape{.d_model = c, .hidden = h, .init_std = 0.02, .proj_init_std = 0.02},
      0, gen);
  Tensor x = randn({1, n, c}, gen, 1.0, true), dy = randn({1, n, c}, gen);
  std::vector<Tensor> leaves = layer->parameters();
  leaves.push_back(x);
  return Bench{3, iters, leaves, [=] {
                 nn::AuxCollector collector;
                 Tensor loss = sum(layer->forward(x) * dy);
                 return loss + collector.take().losses.at(0);
               },
               Tensor()};
}

std::vector<Case> moe_suite() {
  return {{"moe_shakespeare", [] { return moe_bench(768, 128, 256, 40); }},
          {"moe_gpt2", [] { return moe_bench(2048, 768, 1536, 10); }}};
}

// Every suite forge_bench knows; a new suite is one more entry (and a case in scripts/bench).
struct Suite {
  const char* name;
  std::vector<Case> (*cases)();
};
const Suite kSuites[] = {{"core", core_suite}, {"moe", moe_suite}};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void run(const char* name, Bench bench, int repeat) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::vector<double> total, fwd, bwd;
  int iters = bench.iters * repeat;
  for (int i = 0; i < bench.warmup + iters; ++i) {
    for (Tensor& leaf : bench.leaves) leaf.set_grad(Tensor());
    auto t0 = Clock::now();
    Tensor y = bench.forward();
    auto t1 = Clock::now();
    y.backward(bench.dy);
    auto t2 = Clock::now();
    if (i < bench.warmup) continue;
    total.push_back(ms(t0, t2));
    fwd.push_back(ms(t0, t1));
    bwd.push_back(ms(t1, t2));
  }
  std::printf("op=%s ms=%.3f fwd_ms=%.3f bwd_ms=%.3f\n", name, median(total), median(fwd),
              median(bwd));
  std::fflush(stdout);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos; (pos = s.find(',', start)) != std::string::npos; start = pos + 1)
    out.push_back(s.substr(start, pos - start));
  out.push_back(s.substr(start));
  return out;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "forge_bench: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc < 2) return usage_error("missing SUITE");
  std::string suite = argv[1];
  std::vector<std::string> only;
  int repeat = 1;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--only" || arg == "--repeat") && i + 1 >= argc)
      return usage_error(arg + " needs a value");
    if (arg == "--only") {
      only = split_commas(argv[++i]);
    } else if (arg == "--repeat") {
      repeat = std::atoi(argv[++i]);
      if (repeat < 1)
        return usage_error(std::string("--repeat wants N >= 1, got '") + argv[i] + "'");
    } else {
      return usage_error("unknown argument '" + arg + "'");
    }
  }
  auto found = std::find_if(std::begin(kSuites), std::end(kSuites),
                            [&](const Suite& s) { return suite == s.name; });
  if (found == std::end(kSuites)) return usage_error("unknown suite '" + suite + "'");

  std::vector<Case> cases = found->cases();
  for (const std::string& name : only) {
    auto named = [&](const Case& c) { return name == c.name; };
    if (std::none_of(cases.begin(), cases.end(), named))
      return usage_error("suite " + suite + " has no op '" + name + "'");
  }
  try {
    for (const Case& c : cases) {
      if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
      run(c.name, c.make(), repeat);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forge_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
