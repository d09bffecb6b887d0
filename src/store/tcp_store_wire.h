// TcpStore's wire protocol, shared by its server (tcp_store_server.cpp) and its client
// (tcp_store.cpp); the parsing of a request is in tcp_store_wire.cpp.
//
// Wire protocol (every integer little-endian). Each message is a frame:
//   u32 length (bytes after this field, at most kMaxFrame) | u8 command or status | u32 request id | body
// Strings and values in a body are u32 length + bytes.
//   HELLO  u32 magic, u32 version, str token -> OK u32 version      (must be a connection's first frame)
//   SET    str key, bytes value          -> OK
//   GET    i64 timeout_ms, str key       -> OK bytes value | TIMEOUT u32 n, str missing...
//   ADD    str key, i64 delta            -> OK i64 new value | FAILED str message
//   CHECK  str key                       -> OK u8 exists
//   WAIT   i64 timeout_ms, u32 n, str... -> OK | TIMEOUT u32 n, str missing...
// The server answers a GET/WAIT when its keys are set or at its deadline, so nobody polls. A
// connection may have several requests in flight (several threads share one client); answers carry
// the request id and may come out of order. A frame longer than kMaxFrame, an unknown command, a
// malformed body or a first frame that is not HELLO drops that connection (with a warning): the
// server survives garbage. A server with a token (SHOAL_STORE_TOKEN) answers a HELLO that does not
// present it with FAILED and drops the connection; shoal-run makes one up for the store it serves.
// A connection that stalls before its HELLO is complete, or in the middle of a frame, is dropped
// after kStallTimeout (SHOAL_STORE_STALL_TIMEOUT). A serving TcpStore's destructor keeps serving
// up to kServerLinger (SHOAL_STORE_LINGER) while other clients are still connected (the serving
// rank often finishes first).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/le32.h"
#include "base/log.h"
#include "base/params.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "store/store_request.h"

namespace shoal::store_wire {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

constexpr uint32_t kMaxFrame = 64u << 20;   // 64 MiB
constexpr uint32_t kMagic = 0x54534853;     // "SHST"
constexpr uint32_t kVersion = 2;             // 2: HELLO carries a token
constexpr size_t kHeader = 4 + 1 + 4;       // length, command/status, request id
constexpr size_t kMaxToken = 256;
// The longest HELLO's length field: command, id, magic, version, token.
constexpr uint32_t kHelloLen = 1 + 4 + 4 + 4 + 4 + kMaxToken;
constexpr Millis kReplyGrace{10000};        // how much longer than the server's deadline a client waits
constexpr Millis kServerLinger{5000};       // how long a serving TcpStore's destructor waits for clients
// A connection that has not completed its HELLO, or has sent part of a frame, and does not finish
// it within this long is dropped (SHOAL_STORE_STALL_TIMEOUT, seconds, overrides): silent and
// slowloris connections cannot hold the server's file descriptors for ever. Clients send their
// HELLO on connecting and each frame with one write, so only a dead or hostile peer stalls; a
// connection idle *between* frames is a client with nothing to ask and is kept. 30 s lets a
// frame of the 64 MiB maximum through at 2.3 MB/s.
constexpr Millis kStallTimeout{30000};

// Seconds from the environment variable `name` (0..3600), or `dflt` when unset or invalid: a
// server thread (or a client's destructor) has no caller to tell, so a bad value is a warning.
inline Millis env_seconds(const char* name, Millis dflt) {
  try {
    if (auto v = params::seconds(name)) return Millis(static_cast<int64_t>(*v * 1000));
  } catch (const InvalidArgument& e) {
    SHOAL_LOG(warn, "%s: using %lld ms", e.what(), (long long)dflt.count());
  }
  return dflt;
}
// SHOAL_STORE_TOKEN: what a client presents in its HELLO and what a server requires ("" = none).
// Longer ones are cut to kMaxToken bytes, the same way on both sides.
inline std::string store_token() {
  return params::text("SHOAL_STORE_TOKEN").value_or("").substr(0, kMaxToken);
}
// Compares in time independent of where the tokens differ.
inline bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}
// SHOAL_STORE_LINGER (seconds) overrides kServerLinger.
inline Millis server_linger() { return env_seconds("SHOAL_STORE_LINGER", kServerLinger); }

enum Cmd : uint8_t { kHello = 0, kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

inline const char* cmd_name(uint8_t c) {
  switch (c) {
    case kHello: return "HELLO";
    case kSet: return "SET";
    case kGet: return "GET";
    case kAdd: return "ADD";
    case kCheck: return "CHECK";
    case kWait: return "WAIT";
  }
  return "?";
}

inline Millis clamp_timeout(Millis t) {
  constexpr Millis kMax = std::chrono::hours(24 * 365 * 10);  // "forever", without overflowing a time_point
  if (t < Millis(0)) return Millis(0);
  return t > kMax ? kMax : t;
}
inline TimePoint deadline_after(Millis t) { return Clock::now() + clamp_timeout(t); }
inline int poll_ms(TimePoint deadline) {  // rounded up, so that nobody wakes just before a deadline and spins
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<Millis>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

class FrameWriter {
 public:
  FrameWriter(uint8_t code, uint32_t id, size_t reserve = 0) {
    buf_.reserve(kHeader + reserve);
    buf_.resize(kHeader);
    buf_[4] = code;
    put32(&buf_[5], id);
  }
  FrameWriter& u8(uint8_t v) {
    buf_.push_back(v);
    return *this;
  }
  FrameWriter& u32(uint32_t v) {
    size_t n = buf_.size();
    buf_.resize(n + 4);
    put32(&buf_[n], v);
    return *this;
  }
  FrameWriter& i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    u32(static_cast<uint32_t>(u));
    return u32(static_cast<uint32_t>(u >> 32));
  }
  FrameWriter& str(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    buf_.insert(buf_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return *this;
  }
  FrameWriter& str(const std::string& s) { return str(s.data(), s.size()); }
  FrameWriter& keys(const std::vector<std::string>& ks) {
    u32(static_cast<uint32_t>(ks.size()));
    for (auto& k : ks) str(k);
    return *this;
  }
  Bytes finish() {
    put32(&buf_[0], static_cast<uint32_t>(buf_.size() - 4));
    return std::move(buf_);
  }

 private:
  Bytes buf_;
};

// Bounds-checked parser of a frame body; any overrun sets !ok().
class FrameReader {
 public:
  FrameReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && n_ == 0; }
  uint8_t u8() {
    if (!need(1)) return 0;
    uint8_t v = p_[0];
    skip(1);
    return v;
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = get32(p_);
    skip(4);
    return v;
  }
  int64_t i64() {
    uint64_t lo = u32();
    uint64_t hi = u32();
    return static_cast<int64_t>(lo | (hi << 32));
  }
  std::string str() {
    uint32_t n = u32();
    if (!need(n)) return {};
    std::string s(reinterpret_cast<const char*>(p_), n);
    skip(n);
    return s;
  }
  Bytes bytes() {
    uint32_t n = u32();
    if (!need(n)) return {};
    Bytes b(p_, p_ + n);
    skip(n);
    return b;
  }
  std::vector<std::string> keys() {
    uint32_t n = u32();
    std::vector<std::string> ks;
    if (!ok_ || n > n_ / 4) {  // each key takes at least 4 bytes: refuse absurd counts up front
      ok_ = false;
      return ks;
    }
    ks.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) ks.push_back(str());
    return ks;
  }

 private:
  bool need(size_t k) {
    if (!ok_ || n_ < k) ok_ = false;
    return ok_;
  }
  void skip(size_t k) {
    p_ += k;
    n_ -= k;
  }
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

inline std::string errno_str(int e) { return std::strerror(e); }

inline std::string sockaddr_ip(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    auto& a6 = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      inet_ntop(AF_INET, &a6.sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}
inline uint16_t sockaddr_port(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}

inline void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline bool parse_int64(const Bytes& v, int64_t* out) {
  if (v.empty() || v.size() > 20) return false;
  std::string s(v.begin(), v.end());
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = x;
  return true;
}
inline Bytes int64_bytes(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}


}  // namespace shoal::store_wire
