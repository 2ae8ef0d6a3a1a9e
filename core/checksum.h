// CRC-32 for the integrity checks of checkpoints and token datasets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace forge {

/// CRC-32 (the zlib/PNG polynomial: the same values as Python's zlib.crc32) of a byte range,
/// continuing `crc` (0 to start).
uint32_t crc32(const void* data, size_t nbytes, uint32_t crc = 0);

}  // namespace forge
