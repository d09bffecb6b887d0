// The TcpStore's wire format written out by hand, independently of src/store/tcp_store_wire.h (whose
// opening comment describes it), for the tests that speak it raw: test_store (stalled
// connections), test_hostile (intruders) and the fuzz_store_server harness. A protocol change is
// one edit here. Header-only and free of the library, so the fuzz build can include it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shoal_test::store_frames {

constexpr uint32_t kMagic = 0x54534853;  // "SHST", little-endian on the wire
constexpr uint32_t kVersion = 2;         // the HELLO carries a token since version 2
constexpr uint8_t kHello = 0, kSet = 1, kGet = 2, kCheck = 4;  // commands (more in src/store/tcp_store_wire.h)

inline void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

inline std::vector<uint8_t> cat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// u32 length (of what follows) | u8 command | u32 request id | body.
inline std::vector<uint8_t> frame(uint8_t cmd, const std::vector<uint8_t>& body, uint32_t id = 1) {
  std::vector<uint8_t> f;
  put32(f, uint32_t(5 + body.size()));
  f.push_back(cmd);
  put32(f, id);
  f.insert(f.end(), body.begin(), body.end());
  return f;
}

// HELLO: u32 magic | u32 version | u32 token length | token.
inline std::vector<uint8_t> hello(uint32_t magic = kMagic, const std::string& token = "", uint32_t version = kVersion) {
  std::vector<uint8_t> body;
  put32(body, magic);
  put32(body, version);
  put32(body, uint32_t(token.size()));
  body.insert(body.end(), token.begin(), token.end());
  return frame(kHello, body);
}

}  // namespace shoal_test::store_frames
