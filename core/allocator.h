// Caching allocator for tensor storage. Training steps allocate the same sizes every step, so
// freed blocks are kept in per-size free lists and handed out again: after the first step a
// training loop does not call malloc. Byte counters (current / peak) feed memory reports and tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace forge {

struct AllocatorStats {
  size_t current_bytes = 0;   ///< bytes held by live tensors
  size_t peak_bytes = 0;      ///< high-water mark of current_bytes since the last reset_peak()
  size_t cached_bytes = 0;    ///< bytes parked in free lists, ready for reuse
  uint64_t system_allocs = 0; ///< calls that went to the system allocator (cache misses)
  uint64_t allocs = 0;        ///< all allocation requests
};

namespace allocator {
/// Returns 64-byte aligned memory of at least `nbytes` (sizes are rounded up to a size class).
void* allocate(size_t nbytes);
/// Returns a block obtained from allocate() with the same `nbytes`.
void deallocate(void* ptr, size_t nbytes);
AllocatorStats stats();
/// Starts a new peak measurement from the current live byte count.
void reset_peak();
/// Gives every cached block back to the system.
void empty_cache();
/// The size class a request of `nbytes` is rounded to.
size_t round_size(size_t nbytes);
}  // namespace allocator

}  // namespace forge
