// CRC-32 for the integrity checks of checkpoints and token datasets, and FNV-1a 64 for
// fingerprints that identify data (a loader cursor names the dataset it belongs to).
#pragma once

#include <cstddef>
#include <cstdint>

namespace forge {

/// CRC-32 (the zlib/PNG polynomial: the same values as Python's zlib.crc32) of a byte range,
/// continuing `crc` (0 to start).
uint32_t crc32(const void* data, size_t nbytes, uint32_t crc = 0);

constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
/// 64-bit FNV-1a of a byte range, continuing `hash` (kFnv1a64Offset to start).
uint64_t fnv1a64(const void* data, size_t nbytes, uint64_t hash = kFnv1a64Offset);

}  // namespace forge
