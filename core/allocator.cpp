// Size classes: multiples of 512 bytes up to 1 MiB, then 1/16 steps of the next power of two, so
// waste stays under 12.5% while different shapes of similar size still share blocks.
#include "core/allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace forge::allocator {
namespace {

struct Cache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  AllocatorStats stats;
};

Cache& cache() {
  // Leaked on purpose: tensors in static objects may be freed after a static cache would be gone.
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

size_t round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  constexpr size_t small = 512;
  if (nbytes <= (size_t(1) << 20)) return (nbytes + small - 1) / small * small;
  size_t pow2 = size_t(1) << (64 - __builtin_clzll(nbytes - 1));
  size_t step = pow2 / 16;
  return (nbytes + step - 1) / step * step;
}

void* allocate(size_t nbytes) {
  size_t size = round_size(nbytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    c.stats.allocs++;
    c.stats.current_bytes += size;
    if (c.stats.current_bytes > c.stats.peak_bytes) c.stats.peak_bytes = c.stats.current_bytes;
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.stats.cached_bytes -= size;
      return p;
    }
    c.stats.system_allocs++;
  }
  void* p = std::aligned_alloc(64, size);
  if (!p) {
    empty_cache();
    p = std::aligned_alloc(64, size);
  }
  if (!p) throw std::bad_alloc();
  return p;
}

void deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  size_t size = round_size(nbytes);
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.stats.current_bytes -= size;
  c.stats.cached_bytes += size;
  c.free_blocks[size].push_back(ptr);
}

AllocatorStats stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.stats;
}

void reset_peak() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.stats.peak_bytes = c.stats.current_bytes;
}

void empty_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.stats.cached_bytes = 0;
}

}  // namespace forge::allocator
