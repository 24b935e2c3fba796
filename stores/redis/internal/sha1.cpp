#include <botmesh/stores/redis/internal/sha1.hpp>

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

namespace botmesh::internal {

namespace {

std::uint32_t rol(std::uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

} // namespace

// FIPS 180-1. Only used to name scripts, so clarity beats speed.
std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476,
                        0xC3D2E1F0};
  std::string msg{data};
  std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56)
    msg.push_back('\0');
  for (int i = 7; i >= 0; --i)
    msg.push_back(static_cast<char>((bits >> (i * 8)) & 0xFF));
  for (size_t off = 0; off < msg.size(); off += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      auto b = reinterpret_cast<const unsigned char*>(msg.data() + off + i * 4);
      w[i] = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16)
             | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
    }
    for (int i = 16; i < 80; ++i)
      w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDC;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6;
      }
      auto t = rol(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = rol(b, 30);
      b = a;
      a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  }
  return fmt::format("{:08x}{:08x}{:08x}{:08x}{:08x}", h[0], h[1], h[2], h[3],
                     h[4]);
}

} // namespace botmesh::internal
