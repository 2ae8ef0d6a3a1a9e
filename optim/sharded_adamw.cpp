// The sharded AdamW (optim/sharded_adamw.h): slices of the state, their update with AdamW's own
// loop, and the state's gathering to rank 0 and slicing on load.
#include "optim/sharded_adamw.h"

#include "core/error.h"

namespace forge::optim {

ShardedAdamW::ShardedAdamW(const AdamW& adamw, Comm& comm)
    : AdamW(adamw.groups(), adamw.options()), comm_(comm) {
  int64_t total = 0;
  for (const NamedTensor& p : parameters()) {
    FORGE_CHECK(p.tensor.dtype() == DType::f32, "sharded adamw: parameter '", p.name,
                "' must be f32, got ", dtype_name(p.tensor.dtype()));
    offsets_.push_back(total);
    total += p.tensor.numel();
  }
  shards_ = shards_of(total, comm_.size());
  slices_.resize(offsets_.size());
}

Shard ShardedAdamW::piece(size_t i, int rank) const {
  const int64_t begin = offsets_[i];
  return overlap(shards_[size_t(rank)], {begin, begin + parameters()[i].tensor.numel()});
}

void ShardedAdamW::update(size_t index, const Tensor& param, const Tensor& grad, double lr,
                          double weight_decay) {
  Slice& s = slices_[index];
  ++s.step;
  const Shard mine = piece(index, comm_.rank());
  if (mine.size() == 0) return;
  if (!s.m.defined()) {
    s.m = zeros({mine.size()}, param.dtype());
    s.v = zeros({mine.size()}, param.dtype());
  }
  update_elements(s.step, lr, weight_decay, param, grad, mine.begin - offsets_[index], s.m, s.v);
}

NamedTensors ShardedAdamW::state() const {
  NamedTensors out;
  gather_state([&](const NamedTensor& t) { out.push_back(t); });
  return out;
}

void ShardedAdamW::gather_state(const std::function<void(const NamedTensor&)>& take) const {
  const NamedTensors params = parameters();
  const bool lead = comm_.rank() == 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Slice& s = slices_[i];
    if (s.step == 0) continue;  // the same on every rank: they update the same parameters
    std::vector<int64_t> counts;
    for (int r = 0; r < comm_.size(); ++r) counts.push_back(piece(i, r).size());
    for (const auto& [kind, part] : {std::pair{"m", &s.m}, std::pair{"v", &s.v}}) {
      Tensor whole = lead ? empty(params[i].tensor.shape(), params[i].tensor.dtype()) : Tensor();
      comm_.gather(part->defined() ? part->data<float>() : nullptr, counts.data(),
                   lead ? whole.data<float>() : nullptr);
      if (lead) take({std::string("adamw.") + kind + "." + params[i].name, whole});
    }
    if (lead) take({"adamw.step." + params[i].name, scalar(double(s.step), DType::i64)});
  }
}

void ShardedAdamW::load_state(const NamedTensors& state) {
  const auto found = match_adamw_state(state);
  const NamedTensors params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Slice& s = slices_[i];
    s = Slice{};
    if (!found[i][0]) continue;
    s.step = int64_t(found[i][2]->item());
    const Shard mine = piece(i, comm_.rank());
    if (mine.size() == 0) continue;
    auto slice_of = [&](const Tensor& whole) {
      Tensor flat = whole.contiguous();
      Tensor part = empty({mine.size()}, params[i].tensor.dtype());
      part.copy_(make_view(flat, {mine.size()}, {1}, flat.offset() + mine.begin - offsets_[i]));
      return part;
    };
    s.m = slice_of(*found[i][0]);
    s.v = slice_of(*found[i][1]);
  }
}

}  // namespace forge::optim
