// Fused layers and losses: thin autograd wrappers over kernels/{softmax,norm,embedding,loss}.
// Each op checks its inputs (naming the offender), runs one forward kernel, saves only what its
// backward kernel reads and records its own node. cosine_similarity is not a hot path: its
// forward and backward are written with tensor ops inside its own node.
#include "core/ops/nn.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/kernels/embedding.h"
#include "core/kernels/gating.h"
#include "core/kernels/loss.h"
#include "core/kernels/norm.h"
#include "core/kernels/softmax.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/ops/op_util.h"
#include "core/ops/reduce.h"

namespace forge {
namespace {

using op_util::check_float;

// An optional per-channel parameter ([C], x's dtype) of a norm layer.
void check_param(const Tensor& p, int64_t C, DType dtype, const char* op, const char* what) {
  if (!p.defined()) return;
  FORGE_CHECK(p.dtype() == dtype, op, ": ", what, " is ", dtype_name(p.dtype()), " but x is ",
              dtype_name(dtype));
  FORGE_CHECK(p.shape() == Shape{C}, op, ": ", what, " must have shape [", C, "], got ",
              shape_str(p.shape()));
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor acts as one element along dim 0
  FORGE_CHECK(dim >= -n && dim < n, op, ": dimension ", dim, " out of range for a ", ndim,
              "-d tensor");
  return dim < 0 ? dim + n : dim;
}

// Kernel input: no autograd history, dense (copied only when the layout demands it).
Tensor dense(const Tensor& t) { return t.defined() ? t.detach().contiguous() : Tensor(); }

template <class T>
const T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* mut_ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Dense [outer, C, inner] view of `shape` around dimension d.
struct Axis {
  int64_t outer = 1, C = 1, inner = 1;
};
Axis split_at(const Shape& shape, int64_t d) {
  Axis a;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t n = shape[i];
    if (int64_t(i) < d)
      a.outer *= n;
    else if (int64_t(i) == d)
      a.C = n;
    else
      a.inner *= n;
  }
  return a;
}

// The row losses (cross_entropy, kd_kl_div): their targets, reduction and its backward.

// i64 targets [N] for the rows of `logits` [N, V], which the message calls `what`.
void check_targets(const Tensor& targets, const Tensor& logits, const char* op, const char* what) {
  FORGE_CHECK(targets.defined() && targets.dtype() == DType::i64, op, ": targets must be i64, got ",
              targets.defined() ? dtype_name(targets.dtype()) : "undefined");
  FORGE_CHECK(targets.shape() == Shape{logits.size(0)}, op, ": targets must have shape [",
              logits.size(0), "] to match ", what, " ", shape_str(logits.shape()), ", got ",
              shape_str(targets.shape()));
}

// Per-row losses as they are (none), summed, or averaged over the `count` scored rows (0 when
// there are none).
Tensor reduce_rows(const Tensor& rows, Reduction reduction, int64_t count, const char* op) {
  if (reduction == Reduction::none) return rows;
  double total = 0;
  FORGE_DISPATCH_FLOAT(rows.dtype(), op, [&] {
    const scalar_t* r = rows.data<scalar_t>();
    for (int64_t n = 0; n < rows.numel(); ++n) total += double(r[n]);
  });
  if (reduction == Reduction::mean) total = count > 0 ? total / double(count) : 0.0;
  return scalar(total, rows.dtype());
}

// The backward of reduce_rows times `factor`: each row's weight is dout_n (none), dout (sum) or
// dout / count (mean).
Tensor row_weights(const Tensor& dout, int64_t N, DType dtype, Reduction reduction, int64_t count,
                   double factor) {
  Tensor weights = empty({N}, dtype);
  if (reduction == Reduction::none) {
    weights.copy_(dout);
    return factor == 1.0 ? weights : mul(weights, factor);
  }
  double w = reduction == Reduction::sum || count == 0 ? dout.item() : dout.item() / double(count);
  return weights.fill_(factor * w);
}

// ---- softmax, log_softmax ----

// y = softmax(x) along dim, or log_softmax(x) = x - logsumexp(x); x [..., C, ...] -> x's shape.
Tensor softmax_op(Op op, const Tensor& x, int64_t dim, bool log) {
  const char* name = op_name(op);
  check_float(x, name, "x");
  Axis ax = split_at(x.shape(), wrap_dim(dim, x.dim(), name));
  Tensor xc = dense(x), y = empty(x.shape(), x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), name, [&] {
    kernels::softmax_forward(xc.data<scalar_t>(), y.data<scalar_t>(), ax.outer, ax.C, ax.inner,
                             log);
  });
  if (needs_grad(x)) {
    // Differentiates the kernel's y = f(x) from y alone: softmax dx = y (dy - sum(dy y)),
    // log_softmax dx = dy - exp(y) sum(dy); x itself is not kept.
    Tensor saved_y = y.detach();
    record(op, y, {x}, [saved_y, ax, log, name](const Tensor& dy) {
      Tensor dyc = dense(dy), dx = empty(saved_y.shape(), saved_y.dtype());
      FORGE_DISPATCH_FLOAT(saved_y.dtype(), name, [&] {
        kernels::softmax_backward(saved_y.data<scalar_t>(), dyc.data<scalar_t>(),
                                  dx.data<scalar_t>(), ax.outer, ax.C, ax.inner, log);
      });
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op(Op::softmax, x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_op(Op::log_softmax, x, dim, true);
}

// ---- layer_norm, rms_norm ----

// y = (x - mean) * rstd * weight + bias over the last dim; x [..., C], weight, bias [C] or
// undefined; rstd = 1 / sqrt(biased var + eps).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_float(x, "layer_norm", "x");
  FORGE_CHECK(x.dim() >= 1, "layer_norm: x must have at least one dimension, got a 0-d tensor");
  FORGE_CHECK(eps >= 0, "layer_norm: eps must be >= 0, got ", eps);
  int64_t C = x.size(-1), N = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  check_param(weight, C, x.dtype(), "layer_norm", "weight");
  check_param(bias, C, x.dtype(), "layer_norm", "bias");
  Tensor xc = dense(x), wc = dense(weight), bc = dense(bias);
  Tensor y = empty(x.shape(), x.dtype()), mean = empty({N}, x.dtype()),
         rstd = empty({N}, x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    kernels::layer_norm_forward(xc.data<scalar_t>(), ptr<scalar_t>(wc), ptr<scalar_t>(bc),
                                y.data<scalar_t>(), mean.data<scalar_t>(), rstd.data<scalar_t>(), N,
                                C, eps);
  });
  if (needs_grad(x, weight, bias)) {
    bool want_x = x.requires_grad(), want_w = weight.defined() && weight.requires_grad(),
         want_b = bias.defined() && bias.requires_grad();
    // dbias alone is sum(dy) and reads nothing saved; dx and dweight read x, mean, rstd (and w).
    bool keep = want_x || want_w;
    Tensor sx = keep ? xc : Tensor(), sw = keep ? wc : Tensor(), sm = keep ? mean : Tensor(),
           sr = keep ? rstd : Tensor();
    Shape shape = x.shape();
    record(Op::layer_norm, y, {x, weight, bias},
           [sx, sw, sm, sr, shape, N, C, want_x, want_w, want_b](const Tensor& dy) {
             Tensor dyc = dense(dy);
             Tensor dx = want_x ? empty(shape, dyc.dtype()) : Tensor();
             Tensor dw = want_w ? empty({C}, dyc.dtype()) : Tensor();
             Tensor db = want_b ? empty({C}, dyc.dtype()) : Tensor();
             if (!want_x && !want_w) {
               db = sum(reshape(dyc, {N, C}), {0});
             } else {
               FORGE_DISPATCH_FLOAT(dyc.dtype(), "layer_norm backward", [&] {
                 kernels::layer_norm_backward(sx.data<scalar_t>(), ptr<scalar_t>(sw),
                                              sm.data<scalar_t>(), sr.data<scalar_t>(),
                                              dyc.data<scalar_t>(), mut_ptr<scalar_t>(dx),
                                              mut_ptr<scalar_t>(dw), mut_ptr<scalar_t>(db), N, C);
               });
             }
             return std::vector<Tensor>{dx, dw, db};
           });
  }
  return y;
}

// y = x * rstd * weight over the last dim, rstd = 1 / sqrt(mean(x^2) + eps); x [..., C],
// weight [C] or undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_float(x, "rms_norm", "x");
  FORGE_CHECK(x.dim() >= 1, "rms_norm: x must have at least one dimension, got a 0-d tensor");
  FORGE_CHECK(eps >= 0, "rms_norm: eps must be >= 0, got ", eps);
  int64_t C = x.size(-1), N = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  check_param(weight, C, x.dtype(), "rms_norm", "weight");
  Tensor xc = dense(x), wc = dense(weight);
  Tensor y = empty(x.shape(), x.dtype()), rstd = empty({N}, x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), "rms_norm", [&] {
    kernels::rms_norm_forward(xc.data<scalar_t>(), ptr<scalar_t>(wc), y.data<scalar_t>(),
                              rstd.data<scalar_t>(), N, C, eps);
  });
  if (needs_grad(x, weight)) {
    bool want_x = x.requires_grad(), want_w = weight.defined() && weight.requires_grad();
    Shape shape = x.shape();
    // Differentiates y = x * rstd * w: dx = rstd (g - xhat mean(g xhat)) with g = dy w,
    // dweight = sum over rows of dy xhat.
    record(Op::rms_norm, y, {x, weight},
           [xc, wc, rstd, shape, N, C, want_x, want_w](const Tensor& dy) {
             Tensor dyc = dense(dy);
             Tensor dx = want_x ? empty(shape, dyc.dtype()) : Tensor();
             Tensor dw = want_w ? empty({C}, dyc.dtype()) : Tensor();
             FORGE_DISPATCH_FLOAT(dyc.dtype(), "rms_norm backward", [&] {
               kernels::rms_norm_backward(xc.data<scalar_t>(), ptr<scalar_t>(wc),
                                          rstd.data<scalar_t>(), dyc.data<scalar_t>(),
                                          mut_ptr<scalar_t>(dx), mut_ptr<scalar_t>(dw), N, C);
             });
             return std::vector<Tensor>{dx, dw};
           });
  }
  return y;
}

// ---- embedding ----

// out[..., :] = weight[ids[...], :]; weight [V, C], ids i64 of any shape -> ids.shape + [C].
// A bf16 weight (frozen: model.frozen_dtype) gives its rows widened to f32.
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx) {
  if (weight.dtype() != DType::bf16) check_float(weight, "embedding", "weight");
  FORGE_CHECK(weight.dim() == 2, "embedding: weight must be [V, C], got ",
              shape_str(weight.shape()));
  FORGE_CHECK(ids.defined() && ids.dtype() == DType::i64, "embedding: ids must be i64, got ",
              ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  int64_t V = weight.size(0), C = weight.size(1);
  FORGE_CHECK(padding_idx < V, "embedding: padding_idx ", padding_idx, " is outside [0, ", V, ")");
  Tensor idc = ids.clone();  // owned: a loader refilling its id buffer must not change backward
  const int64_t* id = idc.data<int64_t>();
  for (int64_t i = 0; i < idc.numel(); ++i)
    if (id[i] < 0 || id[i] >= V)
      throw Error(ExitCode::data,
                  detail::concat("embedding: id ", id[i], " at flat position ", i, " of ids ",
                                 shape_str(ids.shape()), " is outside [0, V) with V = ", V));
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor wc = dense(weight), out = empty(out_shape, weight.dtype());
  if (weight.dtype() == DType::bf16) {
    kernels::embedding_forward(wc.data<bf16>(), id, out.data<bf16>(), idc.numel(), C);
    return out.to(DType::f32);
  }
  FORGE_DISPATCH_FLOAT(weight.dtype(), "embedding", [&] {
    kernels::embedding_forward(wc.data<scalar_t>(), id, out.data<scalar_t>(), idc.numel(), C);
  });
  if (needs_grad(weight)) {
    // Differentiates the gather: dweight[v] = sum of dout rows whose id is v (padding rows: 0).
    record(Op::embedding, out, {weight}, [idc, V, C, padding_idx](const Tensor& dout) {
      Tensor dc = dense(dout), dw = empty({V, C}, dc.dtype());
      FORGE_DISPATCH_FLOAT(dc.dtype(), "embedding backward", [&] {
        kernels::embedding_backward(dc.data<scalar_t>(), idc.data<int64_t>(), dw.data<scalar_t>(),
                                    idc.numel(), V, C, padding_idx);
      });
      return std::vector<Tensor>{dw};
    });
  }
  return out;
}

// ---- cross_entropy ----

// loss_n = (1 - eps) (lse_n - x[n, t_n]) + eps (lse_n - mean_c x[n, c]); logits [N, V], targets
// i64 [N] -> mean over non-ignored rows (0 when all are ignored), sum, or [N].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  check_float(logits, "cross_entropy", "logits");
  FORGE_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got ",
              shape_str(logits.shape()));
  int64_t N = logits.size(0), V = logits.size(1);
  check_targets(targets, logits, "cross_entropy", "logits");
  double eps = options.label_smoothing;
  FORGE_CHECK(eps >= 0.0 && eps <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ",
              eps);
  Tensor tc = targets.clone();  // owned, like embedding ids
  const int64_t* t = tc.data<int64_t>();
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == options.ignore_index) continue;
    if (t[n] < 0 || t[n] >= V)
      throw Error(ExitCode::data,
                  detail::concat("cross_entropy: target ", t[n], " at position ", n,
                                 " is outside [0, V) with V = ", V, " and is not ignore_index (",
                                 options.ignore_index, ")"));
    ++count;
  }
  Tensor xc = dense(logits), rows = empty({N}, logits.dtype()), lse = empty({N}, logits.dtype());
  FORGE_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    kernels::cross_entropy_forward(xc.data<scalar_t>(), t, rows.data<scalar_t>(),
                                   lse.data<scalar_t>(), N, V, options.ignore_index, eps);
  });
  Reduction reduction = options.reduction;
  Tensor out = reduce_rows(rows, reduction, count, "cross_entropy");
  if (needs_grad(logits)) {
    // Differentiates the fused loss: dlogits = w_n (softmax - (1 - eps) onehot - eps / V), the
    // softmax rebuilt from the saved per-row lse; w_n is dout_n, dout, or dout / count.
    int64_t ignore = options.ignore_index;
    record(Op::cross_entropy, out, {logits},
           [xc, tc, lse, N, V, ignore, eps, reduction, count](const Tensor& dout) {
             Tensor weights = row_weights(dout, N, xc.dtype(), reduction, count, 1.0);
             Tensor dlogits = empty({N, V}, xc.dtype());
             FORGE_DISPATCH_FLOAT(xc.dtype(), "cross_entropy backward", [&] {
               kernels::cross_entropy_backward(xc.data<scalar_t>(), tc.data<int64_t>(),
                                               lse.data<scalar_t>(), weights.data<scalar_t>(),
                                               dlogits.data<scalar_t>(), N, V, ignore, eps);
             });
             return std::vector<Tensor>{dlogits};
           });
  }
  return out;
}

// ---- kd_kl_div ----

// loss_n = T^2 KL(p_t || p_s) (reverse: T^2 KL(p_s || p_t)), p = softmax(logits / T) per row;
// student and teacher logits [N, V], targets i64 [N] or undefined -> mean over scored rows (0 when
// none are), sum, or [N].
Tensor kd_kl_div(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& targets,
                 const KLDivOptions& options) {
  check_float(student_logits, "kd_kl_div", "student_logits");
  check_float(teacher_logits, "kd_kl_div", "teacher_logits");
  FORGE_CHECK(student_logits.dim() == 2 && student_logits.size(1) > 0,
              "kd_kl_div: student_logits must be [N, V] with V > 0, got ",
              shape_str(student_logits.shape()));
  FORGE_CHECK(teacher_logits.shape() == student_logits.shape(), "kd_kl_div: teacher_logits ",
              shape_str(teacher_logits.shape()), " must have the shape of student_logits ",
              shape_str(student_logits.shape()));
  FORGE_CHECK(teacher_logits.dtype() == student_logits.dtype(), "kd_kl_div: teacher_logits are ",
              dtype_name(teacher_logits.dtype()), " but student_logits are ",
              dtype_name(student_logits.dtype()));
  double temp = options.temperature;
  FORGE_CHECK(std::isfinite(temp) && temp > 0,
              "kd_kl_div: temperature must be finite and > 0, got ", temp);
  int64_t N = student_logits.size(0), V = student_logits.size(1);
  int64_t ignore = options.ignore_index, count = N;
  Tensor tc;  // undefined: every row is scored
  if (targets.defined()) {
    check_targets(targets, student_logits, "kd_kl_div", "student_logits");
    tc = targets.clone();  // owned, like embedding ids
    const int64_t* t = tc.data<int64_t>();
    count = int64_t(std::count_if(t, t + N, [ignore](int64_t v) { return v != ignore; }));
  }
  DType dtype = student_logits.dtype();
  bool reverse = options.reverse;
  Tensor sc = dense(student_logits), tec = dense(teacher_logits);
  Tensor kl = empty({N}, dtype), lse_s = empty({N}, dtype), lse_t = empty({N}, dtype);
  FORGE_DISPATCH_FLOAT(dtype, "kd_kl_div", [&] {
    kernels::kd_kl_div_forward(sc.data<scalar_t>(), tec.data<scalar_t>(), ptr<int64_t>(tc),
                               kl.data<scalar_t>(), lse_s.data<scalar_t>(), lse_t.data<scalar_t>(),
                               N, V, ignore, temp, reverse);
  });
  Reduction reduction = options.reduction;
  Tensor out = reduce_rows(mul(kl, temp * temp), reduction, count, "kd_kl_div");
  if (needs_grad(student_logits)) {
    // Differentiates T^2 kl_n through the kernel's d kl / d student, rebuilding both softmaxes
    // from the saved lse rows; the teacher is not an input of the node. Forward KL's gradient
    // does not read kl, so only reverse keeps it.
    Tensor saved_kl = reverse ? kl : Tensor();
    record(Op::kd_kl_div, out, {student_logits},
           [sc, tec, tc, lse_s, lse_t, saved_kl, N, V, ignore, temp, reverse, reduction,
            count](const Tensor& dout) {
             Tensor weights = row_weights(dout, N, sc.dtype(), reduction, count, temp * temp);
             Tensor dstudent = empty({N, V}, sc.dtype());
             FORGE_DISPATCH_FLOAT(sc.dtype(), "kd_kl_div backward", [&] {
               kernels::kd_kl_div_backward(sc.data<scalar_t>(), tec.data<scalar_t>(),
                                           ptr<int64_t>(tc), lse_s.data<scalar_t>(),
                                           lse_t.data<scalar_t>(), ptr<scalar_t>(saved_kl),
                                           weights.data<scalar_t>(), dstudent.data<scalar_t>(), N,
                                           V, ignore, temp, reverse);
             });
             return std::vector<Tensor>{dstudent};
           });
  }
  return out;
}

// ---- topk_load ----

// load [E] from clean, noisy, noise_std [N, E]; saves z = (clean - threshold) / noise_std, the
// noise scale and each row's top k+1 indices.
Tensor topk_load(const Tensor& clean, const Tensor& noisy, const Tensor& noise_std, int64_t k,
                 const Tensor& ranked) {
  check_float(clean, "topk_load", "clean");
  FORGE_CHECK(clean.dim() == 2, "topk_load: clean must be [N, E], got ", shape_str(clean.shape()));
  for (const Tensor* t : {&noisy, &noise_std}) {
    check_float(*t, "topk_load", t == &noisy ? "noisy" : "noise_std");
    FORGE_CHECK(t->shape() == clean.shape() && t->dtype() == clean.dtype(), "topk_load: ",
                t == &noisy ? "noisy " : "noise_std ", shape_str(t->shape()), " ",
                dtype_name(t->dtype()), " must match clean ", shape_str(clean.shape()), " ",
                dtype_name(clean.dtype()));
  }
  const int64_t N = clean.size(0), E = clean.size(1);
  FORGE_CHECK(k >= 1 && k < E, "topk_load: needs 1 <= k < E, got k = ", k, " with E = ", E);
  Tensor top = ranked;  // [N, k+1], largest first
  if (top.defined()) {
    FORGE_CHECK(top.dtype() == DType::i64 && top.shape() == Shape({N, k + 1}),
                "topk_load: ranked must be [", N, ", ", k + 1, "] i64, got ",
                shape_str(top.shape()), " ", dtype_name(top.dtype()));
    top = top.contiguous();
    const int64_t bad = kernels::first_out_of_range(top.data<int64_t>(), N * (k + 1), E);
    FORGE_CHECK(bad < 0, "topk_load: ranked index ", bad < 0 ? 0 : top.data<int64_t>()[bad],
                " at position ", bad, " is out of range [0, ", E, ")");
  } else {
    top = topk(noisy, k + 1, 1).indices;
  }
  const Tensor cc = dense(clean), nc = dense(noisy), sc = dense(noise_std);
  const DType dtype = clean.dtype();
  Tensor z = empty({N, E}, dtype), load = empty({E}, dtype);
  FORGE_DISPATCH_FLOAT(dtype, "topk_load", [&] {
    kernels::topk_load_forward(cc.data<scalar_t>(), nc.data<scalar_t>(), sc.data<scalar_t>(),
                               top.data<int64_t>(), N, E, k, z.data<scalar_t>(),
                               load.data<scalar_t>());
  });
  if (needs_grad(clean, noisy, noise_std)) {
    const bool want_c = clean.requires_grad(), want_n = noisy.requires_grad(),
               want_s = noise_std.requires_grad();
    record(Op::topk_load, load, {clean, noisy, noise_std},
           [sc, top, z, N, E, k, want_c, want_n, want_s](const Tensor& dload) {
             const Tensor dl = dense(dload);
             Tensor dc = want_c ? empty({N, E}, dl.dtype()) : Tensor();
             Tensor dn = want_n ? empty({N, E}, dl.dtype()) : Tensor();
             Tensor ds = want_s ? empty({N, E}, dl.dtype()) : Tensor();
             FORGE_DISPATCH_FLOAT(dl.dtype(), "topk_load backward", [&] {
               kernels::topk_load_backward(sc.data<scalar_t>(), top.data<int64_t>(),
                                           z.data<scalar_t>(), dl.data<scalar_t>(), N, E, k,
                                           mut_ptr<scalar_t>(dc), mut_ptr<scalar_t>(dn),
                                           mut_ptr<scalar_t>(ds));
             });
             return std::vector<Tensor>{dc, dn, ds};
           });
  }
  return load;
}

// ---- cosine_similarity ----

// out = sum(a b, dim) / sqrt(max(|a|^2, eps^2) max(|b|^2, eps^2)), a and b broadcast together;
// the result drops dim. As in PyTorch 1.13 the clamp is invisible to the gradient (it acts on
// the value of the squared norms only).
Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim, double eps) {
  check_float(a, "cosine_similarity", "a");
  check_float(b, "cosine_similarity", "b");
  FORGE_CHECK(a.dtype() == b.dtype(), "cosine_similarity: a is ", dtype_name(a.dtype()), ", b is ",
              dtype_name(b.dtype()));
  Shape shape = broadcast_shapes(a.shape(), b.shape());
  FORGE_CHECK(!shape.empty(), "cosine_similarity: inputs must have at least one dimension");
  int64_t d = wrap_dim(dim, int64_t(shape.size()), "cosine_similarity");
  Tensor ea, eb, s1, s2, denom, cosine, out;
  {
    NoGradGuard no_grad;
    ea = expand(a.detach(), shape);
    eb = expand(b.detach(), shape);
    double floor = eps * eps, inf = std::numeric_limits<double>::infinity();
    s1 = clamp(sum(mul(ea, ea), {d}, true), floor, inf);
    s2 = clamp(sum(mul(eb, eb), {d}, true), floor, inf);
    denom = sqrt(mul(s1, s2));
    cosine = div(sum(mul(ea, eb), {d}, true), denom);
    out = squeeze(cosine, d).contiguous();
  }
  if (needs_grad(a, b)) {
    bool want_a = a.requires_grad(), want_b = b.requires_grad();
    Shape shape_a = a.shape(), shape_b = b.shape();
    // d cos / d a = b / denom - cos a / |a|^2 (and symmetrically for b), reduced to each input's
    // shape where it was broadcast.
    record(
        Op::cosine_similarity, out, {a, b},
        [ea, eb, s1, s2, denom, cosine, d, shape_a, shape_b, want_a, want_b](const Tensor& dout) {
          Tensor g = unsqueeze(dout, d);
          Tensor da, db;
          if (want_a) da = sum_to(mul(g, sub(div(eb, denom), div(mul(cosine, ea), s1))), shape_a);
          if (want_b) db = sum_to(mul(g, sub(div(ea, denom), div(mul(cosine, eb), s2))), shape_b);
          return std::vector<Tensor>{da, db};
        });
  }
  return out;
}

}  // namespace forge
