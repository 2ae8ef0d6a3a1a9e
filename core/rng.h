// Counter-based random numbers (Philox4x32-10). Element i of a draw depends only on
// (seed, stream, offset + i), never on thread count or scheduling, so runs are reproducible and a
// resumed run needs only the generator's three integers, not a replay.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace forge {

/// One Philox4x32-10 block: four independent 32-bit words for counter (stream, index) under `seed`.
std::array<uint32_t, 4> philox(uint64_t seed, uint64_t stream, uint64_t index);

/// A stream derived from a purpose name and a step, e.g. rng_stream("dropout", step).
uint64_t rng_stream(std::string_view purpose, uint64_t step = 0);

/// Seed, stream and a running offset. Each fill reserves a counter range with advance().
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
  bool operator==(const GeneratorState&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t stream = 0) : state_{seed, stream, 0} {}
  /// Reserves `n` Philox blocks; returns the first block index of the reservation.
  uint64_t advance(uint64_t n) {
    uint64_t first = state_.offset;
    state_.offset += n;
    return first;
  }
  uint64_t seed() const { return state_.seed; }
  uint64_t stream() const { return state_.stream; }
  const GeneratorState& state() const { return state_; }
  void set_state(const GeneratorState& s) { state_ = s; }

 private:
  GeneratorState state_;
};

/// The process-wide generator used when an op is not handed one (seeded by manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

/// Uniform in [0, 1) from a 32-bit word (24 significant bits, exact in float).
inline float uniform_from_bits(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }
/// Uniform in [0, 1) from two words (53 significant bits).
inline double uniform_from_bits(uint32_t hi, uint32_t lo) {
  uint64_t v = (uint64_t(hi) << 21) ^ uint64_t(lo >> 11);
  return double(v & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/// Inverse error function on (-1, 1), accurate to double rounding (used by truncated normal).
double erfinv(double y);

}  // namespace forge
