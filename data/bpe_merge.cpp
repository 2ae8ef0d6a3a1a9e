// The shared BPE merge loop: a quadratic scan for short pieces (fastest for natural text's words)
// and a heap over a linked list for long ones, both taking the lowest-ranked adjacent pair first
// and the leftmost on ties, so both give the same result.
#include "data/bpe_merge.h"

#include <climits>
#include <queue>

namespace forge::bpe {
namespace {

constexpr uint64_t kEmpty = ~uint64_t{0};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t slot_of(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 20; }

}  // namespace

void MergeTable::build(const std::vector<Merge>& merges) {
  uint64_t cap = 16;
  while (cap < merges.size() * 2) cap *= 2;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Merge{-1, -1, -1, -1});
  mask_ = cap - 1;
  for (const Merge& m : merges) {
    const uint64_t key = pair_key(m.left, m.right);
    uint64_t h = slot_of(key);
    while (keys_[h & mask_] != kEmpty && keys_[h & mask_] != key) ++h;
    keys_[h & mask_] = key;
    values_[h & mask_] = m;
  }
}

const Merge* MergeTable::find(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t h = slot_of(key);; ++h) {
    const uint64_t k = keys_[h & mask_];
    if (k == key) return &values_[h & mask_];
    if (k == kEmpty) return nullptr;
  }
}

void MergeTable::merge(std::vector<int32_t>& parts, std::vector<uint32_t>* lens,
                       std::vector<int32_t>& ranks) const {
  if (parts.size() < 2) return;
  if (parts.size() <= kShortPiece)
    merge_short(parts, lens, ranks);
  else
    merge_long(parts, lens);
}

// tiktoken's byte_pair_merge: ranks[i] is the merge of parts[i] and parts[i + 1], or INT32_MAX.
// Quadratic in the piece length but fastest for the short pieces of natural text.
void MergeTable::merge_short(std::vector<int32_t>& parts, std::vector<uint32_t>* lens,
                             std::vector<int32_t>& ranks) const {
  auto rank_of = [&](size_t i) {
    const Merge* m = find(parts[i], parts[i + 1]);
    return m == nullptr ? INT32_MAX : m->rank;
  };
  ranks.resize(parts.size() - 1);
  for (size_t i = 0; i + 1 < parts.size(); ++i) ranks[i] = rank_of(i);
  while (!ranks.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < ranks.size(); ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT32_MAX) break;
    parts[best] = find(parts[best], parts[best + 1])->made;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    if (lens != nullptr) {
      (*lens)[best] += (*lens)[best + 1];
      lens->erase(lens->begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
    if (best < ranks.size()) ranks[best] = rank_of(best);
    if (best > 0) ranks[best - 1] = rank_of(best - 1);
  }
}

// The same merge order in O(n log n) for long pieces (runs of punctuation or whitespace): parts
// form a linked list, candidate pairs sit in a min-heap keyed by (rank, position of the left part),
// and a popped pair is used only if both parts are still adjacent with that rank.
void MergeTable::merge_long(std::vector<int32_t>& parts, std::vector<uint32_t>* lens) const {
  const uint32_t n = static_cast<uint32_t>(parts.size());
  std::vector<uint32_t> next(n), prev(n);
  std::vector<uint8_t> alive(n, 1);
  for (uint32_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;  // n and ~0u mean none
  struct Candidate {
    int32_t rank;
    uint32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](uint32_t left) {
    if (left >= n || next[left] >= n) return;
    if (const Merge* m = find(parts[left], parts[next[left]]))
      heap.push({m->rank, left, next[left]});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right) continue;
    const Merge* m = find(parts[c.left], parts[c.right]);
    if (m == nullptr || m->rank != c.rank) continue;
    parts[c.left] = m->made;
    if (lens != nullptr) (*lens)[c.left] += (*lens)[c.right];
    alive[c.right] = 0;
    next[c.left] = next[c.right];
    if (next[c.right] < n) prev[next[c.right]] = c.left;
    push(c.left);
    if (prev[c.left] < n) push(prev[c.left]);
  }
  uint32_t out = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!alive[i]) continue;
    if (lens != nullptr) (*lens)[out] = (*lens)[i];
    parts[out++] = parts[i];
  }
  parts.resize(out);
  if (lens != nullptr) lens->resize(out);
}

bool PieceCache::append(std::string_view piece, std::vector<int32_t>& ids,
                        std::vector<uint32_t>* lens) const {
  const auto it = spans_.find(piece);
  if (it == spans_.end()) return false;
  const auto [start, count] = it->second;
  ids.insert(ids.end(), ids_.begin() + start, ids_.begin() + start + count);
  if (lens != nullptr)
    lens->insert(lens->end(), lens_.begin() + start, lens_.begin() + start + count);
  return true;
}

void PieceCache::insert(std::string_view piece, const std::vector<int32_t>& ids,
                        const std::vector<uint32_t>* lens) {
  if (spans_.size() > 200000 || ids_.size() > (1u << 22)) {
    spans_.clear();
    ids_.clear();
    lens_.clear();
  }
  spans_.emplace(std::string(piece),
                 std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(ids_.size()),
                                               static_cast<uint32_t>(ids.size())));
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  if (lens != nullptr) lens_.insert(lens_.end(), lens->begin(), lens->end());
}

}  // namespace forge::bpe
