// Slice-by-8 CRC-32 (reflected polynomial 0xEDB88320): about a byte per cycle, so verifying a
// checkpoint or a token dataset costs about as much as reading it from the page cache. FNV-1a is
// the plain byte loop: fingerprints hash a dataset once per run.
#include "core/checksum.h"

#include <array>
#include <cstring>

namespace forge {
namespace {

using Crc32Tables = std::array<std::array<uint32_t, 256>, 8>;

const Crc32Tables& crc32_tables() {
  static const Crc32Tables tables = [] {
    Crc32Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t crc32(const void* data, size_t nbytes, uint32_t crc) {
  const Crc32Tables& t = crc32_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; nbytes >= 8; p += 8, nbytes -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian: the first byte is the low byte
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^
          t[4][(w >> 24) & 0xff] ^ t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^
          t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; nbytes > 0; ++p, --nbytes) crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint64_t fnv1a64(const void* data, size_t nbytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < nbytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace forge
