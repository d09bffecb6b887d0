// libFuzzer target: the TCP transport's connection hello (check_tcp_hello in
// src/transport/tcp_socket.cpp), which every accepted connection must pass before it becomes a
// stream of a link. Input: the 44-byte hello, then the receiving rank's set-up (rank, size,
// streams, which peers talk TCP, and whether its group secret equals the hello's).
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/tcp_link.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shoal::kTcpHelloBytes;
  if (size < kTcpHelloBytes + 4) return 0;
  const uint8_t* hello = data;
  const uint8_t* p = data + kTcpHelloBytes;
  size_t n = size - kTcpHelloBytes;
  shoal::TcpConfig cfg;
  cfg.size = 1 + p[0] % 64;
  cfg.rank = p[1] % cfg.size;
  cfg.streams = 1 + p[2] % 64;
  bool same_secret = p[3] & 1;
  cfg.use_tcp.assign(cfg.size, false);
  for (int j = 0; j < cfg.size; ++j) cfg.use_tcp[j] = j != cfg.rank && (4 + size_t(j) / 8 >= n || (p[4 + j / 8] >> (j % 8)) & 1);
  if (same_secret) {
    std::memcpy(cfg.secret.data(), hello + 4, 32);
  } else {
    for (size_t i = 0; i < 32; ++i) cfg.secret[i] = static_cast<uint8_t>(0xa5 ^ i);
  }

  int peer = -7, stream = -7;
  std::string why = shoal::check_tcp_hello(hello, cfg, &peer, &stream);
  if (why.empty()) {
    // Accepted: from a higher TCP peer of this group, on a stream it has (stream == streams: the
    // control connection).
    if (peer <= cfg.rank || peer >= cfg.size || !cfg.use_tcp[peer] || stream < 0 || stream > cfg.streams) std::abort();
    if (std::memcmp(hello + 4, cfg.secret.data(), 32) != 0) std::abort();
    // And it is exactly the hello that peer sends.
    uint8_t again[kTcpHelloBytes];
    shoal::encode_tcp_hello(again, cfg.secret, peer, stream);
    if (std::memcmp(again, hello, kTcpHelloBytes) != 0) std::abort();
  } else if (peer != -7 || stream != -7) {
    std::abort();  // a refused hello names nobody
  }
  return 0;
}
