// TcpStore: shoal's own rendezvous server and client.
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
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/log.h"
#include "base/le32.h"
#include "base/params.h"
#include "store/quote_keys.h"
#include "store/store_request.h"
#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {
namespace {

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
Millis env_seconds(const char* name, Millis dflt) {
  try {
    if (auto v = params::seconds(name)) return Millis(static_cast<int64_t>(*v * 1000));
  } catch (const InvalidArgument& e) {
    SHOAL_LOG(warn, "%s: using %lld ms", e.what(), (long long)dflt.count());
  }
  return dflt;
}
// SHOAL_STORE_TOKEN: what a client presents in its HELLO and what a server requires ("" = none).
// Longer ones are cut to kMaxToken bytes, the same way on both sides.
std::string store_token() {
  return params::text("SHOAL_STORE_TOKEN").value_or("").substr(0, kMaxToken);
}
// Compares in time independent of where the tokens differ.
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}
// SHOAL_STORE_LINGER (seconds) overrides kServerLinger.
Millis server_linger() { return env_seconds("SHOAL_STORE_LINGER", kServerLinger); }

enum Cmd : uint8_t { kHello = 0, kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

const char* cmd_name(uint8_t c) {
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

Millis clamp_timeout(Millis t) {
  constexpr Millis kMax = std::chrono::hours(24 * 365 * 10);  // "forever", without overflowing a time_point
  if (t < Millis(0)) return Millis(0);
  return t > kMax ? kMax : t;
}
TimePoint deadline_after(Millis t) { return Clock::now() + clamp_timeout(t); }
int poll_ms(TimePoint deadline) {  // rounded up, so that nobody wakes just before a deadline and spins
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

std::string errno_str(int e) { return std::strerror(e); }

std::string sockaddr_ip(const sockaddr_storage& ss) {
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
uint16_t sockaddr_port(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool parse_int64(const Bytes& v, int64_t* out) {
  if (v.empty() || v.size() > 20) return false;
  std::string s(v.begin(), v.end());
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = x;
  return true;
}
Bytes int64_bytes(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

// ---------------------------------------------------------------------------------------------
// Server: one thread, epoll, level-triggered, non-blocking sockets.

class StoreServer {
 public:
  StoreServer(const std::string& bind_host, uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port_s = std::to_string(port);
    const char* node = bind_host.empty() ? nullptr : bind_host.c_str();
    int rc = getaddrinfo(node, port_s.c_str(), &hints, &res);
    if (rc != 0) throw Error("store server: cannot resolve bind address '" + bind_host + "': " + gai_strerror(rc));
    std::string err = "no address";
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        err = errno_str(errno);
        continue;
      }
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        err = errno_str(errno);
        close(fd);
        continue;
      }
      listen_fd_ = fd;
      break;
    }
    freeaddrinfo(res);
    if (listen_fd_ < 0) {
      throw Error("store server: cannot listen on " + (bind_host.empty() ? std::string("*") : bind_host) + ":" +
                  port_s + ": " + err);
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = sockaddr_port(ss);

    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) {
      int e = errno;
      cleanup_fds();
      throw Error("store server: epoll/eventfd: " + errno_str(e));
    }
    add_epoll(listen_fd_, kListenId, EPOLLIN);
    add_epoll(wake_fd_, kWakeId, EPOLLIN);
    SHOAL_LOG(info, "store server listening on %s:%u", bind_host.empty() ? "*" : bind_host.c_str(), port_);
    thread_ = std::thread([this] { run(); });
  }

  ~StoreServer() {
    stop_.store(true);
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    for (auto& [id, c] : clients_) close(c->fd);
    clients_.clear();
    cleanup_fds();
  }

  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const { return port_; }

  // Waits until no client is connected, for at most `max`. Returns whether that happened.
  bool wait_no_clients(Millis max) {
    auto deadline = Clock::now() + max;
    int n = connected_.load();
    if (n > 0) SHOAL_LOG(info, "store server: waiting up to %lld ms for %d client(s) to disconnect", (long long)max.count(), n);
    while (connected_.load() > 0) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(Millis(5));  // only while shutting down
    }
    return true;
  }

 private:
  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kWakeId = 1;

  struct Client {
    uint64_t id = 0;
    int fd = -1;
    std::string peer;
    Bytes in;           // received bytes [0, in_len)
    size_t in_len = 0;
    Bytes out;          // bytes to send [out_off, out.size())
    size_t out_off = 0;
    bool want_out = false;
    bool hello = false;
    bool dead = false;
    std::set<uint64_t> waiters;
    // When the HELLO, or the frame begun, must be complete by; max() while between frames.
    TimePoint must_finish = TimePoint::max();
  };
  struct Waiter {
    uint64_t client = 0;
    uint32_t req = 0;
    uint8_t cmd = 0;
    std::vector<std::string> keys;
    TimePoint deadline;
    const std::string* filed = nullptr;  // the by_key_ entry (key) listing this waiter, if any
  };

  void cleanup_fds() {
    if (listen_fd_ >= 0) close(listen_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    listen_fd_ = epoll_fd_ = wake_fd_ = -1;
  }

  void add_epoll(int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  void mod_epoll(Client& c, bool want_out) {
    if (c.want_out == want_out) return;
    c.want_out = want_out;
    epoll_event ev{};
    ev.events = want_out ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void run() {
    std::vector<epoll_event> events(64);
    while (!stop_.load()) {
      TimePoint next = by_deadline_.empty() ? TimePoint::max() : by_deadline_.begin()->first;
      next = std::min(next, next_stall_check_);
      int timeout = next == TimePoint::max() ? -1 : poll_ms(next);
      int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        SHOAL_LOG(error, "store server: epoll_wait: %s", errno_str(errno).c_str());
        break;
      }
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          accept_all();
        } else if (id == kWakeId) {
          uint64_t v;
          (void)!read(wake_fd_, &v, sizeof v);
        } else {
          auto it = clients_.find(id);
          if (it == clients_.end() || it->second->dead) continue;
          Client& c = *it->second;
          if (events[i].events & EPOLLOUT) flush(c);
          if (!c.dead && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(c);
        }
      }
      expire_waiters();
      drop_stalled();
      reap();
    }
  }

  // Drops the connections past their must_finish; sets when to look next.
  void drop_stalled() {
    auto now = Clock::now();
    if (now < next_stall_check_) return;
    next_stall_check_ = TimePoint::max();
    for (auto& [id, c] : clients_) {
      if (c->dead || c->must_finish == TimePoint::max()) continue;
      if (now >= c->must_finish) {
        drop(*c, c->hello ? "a frame begun was not completed in time (SHOAL_STORE_STALL_TIMEOUT)"
                          : "no HELLO in time (SHOAL_STORE_STALL_TIMEOUT)");
      } else {
        next_stall_check_ = std::min(next_stall_check_, c->must_finish);
      }
    }
  }
  void set_must_finish(Client& c, TimePoint t) {
    c.must_finish = t;
    next_stall_check_ = std::min(next_stall_check_, t);
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
        SHOAL_LOG(warn, "store server: accept: %s", errno_str(errno).c_str());
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(Millis(10));  // do not spin
        return;
      }
      set_nodelay(fd);
      auto c = std::make_unique<Client>();
      c->id = next_client_id_++;
      c->fd = fd;
      c->peer = sockaddr_ip(ss) + ":" + std::to_string(sockaddr_port(ss));
      set_must_finish(*c, Clock::now() + stall_timeout_);
      add_epoll(fd, c->id, EPOLLIN);
      SHOAL_LOG(debug, "store server: connection from %s", c->peer.c_str());
      clients_.emplace(c->id, std::move(c));
      connected_.store(static_cast<int>(clients_.size()));
    }
  }

  void drop(Client& c, const char* why) {
    if (c.dead) return;
    SHOAL_LOG(warn, "store server: dropping connection from %s: %s", c.peer.c_str(), why);
    c.dead = true;
  }

  void on_readable(Client& c) {
    for (int round = 0; round < 16 && !c.dead; ++round) {
      // Room to read into: a chunk (small before the HELLO), grown towards the rest of the current
      // frame as its bytes arrive (at most doubling), never on the say-so of its length field alone:
      // a connection that only announces a 64 MiB frame must not cost the server 64 MiB.
      size_t want = c.in_len + (c.hello ? 65536 : 64);
      if (c.in_len >= 4) {
        uint32_t len = get32(c.in.data());
        if (len > kMaxFrame) return drop(c, ("frame of " + std::to_string(len) + " bytes exceeds the 64 MiB limit").c_str());
        if (!c.hello && len > kHelloLen)
          return drop(c, ("first frame (" + std::to_string(len) + " bytes) is not a shoal store HELLO").c_str());
        want = std::max(want, std::min(size_t(4) + len, 2 * c.in_len));
      }
      if (c.in.size() < want) c.in.resize(want);
      ssize_t r = recv(c.fd, c.in.data() + c.in_len, c.in.size() - c.in_len, 0);
      if (r == 0) {
        SHOAL_LOG(debug, "store server: %s closed the connection", c.peer.c_str());
        c.dead = true;
        return;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        SHOAL_LOG(debug, "store server: recv from %s: %s", c.peer.c_str(), errno_str(errno).c_str());
        c.dead = true;
        return;
      }
      c.in_len += static_cast<size_t>(r);
      parse_frames(c);
    }
  }

  void parse_frames(Client& c) {
    size_t off = 0;
    while (!c.dead) {
      size_t frame = 0;
      std::string err;
      if (!store_wire::next_frame(c.in.data() + off, c.in_len - off, &frame, &err)) return drop(c, err.c_str());
      if (frame == 0) break;
      handle(c, c.in.data() + off + 4, frame - 4);
      off += frame;
    }
    if (c.dead) return;
    // Between frames (HELLO done, nothing pending): no deadline. A new partial frame: one from now.
    if (c.hello && c.in_len == off) c.must_finish = TimePoint::max();
    else if (c.hello && (off > 0 || c.must_finish == TimePoint::max())) set_must_finish(c, Clock::now() + stall_timeout_);
    if (off == 0) return;
    std::memmove(c.in.data(), c.in.data() + off, c.in_len - off);
    c.in_len -= off;
    if (c.in.size() > (1u << 20) && c.in_len < 65536) {  // give back the memory of a large frame
      c.in.resize(65536);
      c.in.shrink_to_fit();
    }
  }

  void handle(Client& c, const uint8_t* p, size_t n) {
    if (!c.hello && n > 0 && p[0] != kHello) return drop(c, "first frame is not a shoal store HELLO");
    store_wire::Request q;
    std::string err = store_wire::parse_request(p, n, &q);
    if (!err.empty()) return drop(c, err.c_str());
    const uint32_t req = q.id;
    SHOAL_LOG(trace, "store server: %s request %u from %s", cmd_name(q.cmd), req, c.peer.c_str());
    switch (q.cmd) {
      case kHello: {
        if (q.version != kVersion) {
          send_frame(c, FrameWriter(kFailed, req).str("store protocol version mismatch: server " +
                                                      std::to_string(kVersion) + ", client " +
                                                      std::to_string(q.version)).finish());
          return;
        }
        if (!token_.empty() && !same_token(q.key, token_)) {
          send_frame(c, FrameWriter(kFailed, req).str(q.key.empty()
              ? "this store needs a token: set SHOAL_STORE_TOKEN to the store server's (shoal-run sets it for its ranks)"
              : "wrong store token: SHOAL_STORE_TOKEN differs from the store server's").finish());
          return drop(c, q.key.empty() ? "HELLO without the store's token" : "HELLO with a wrong store token");
        }
        c.hello = true;
        send_frame(c, FrameWriter(kOk, req).u32(kVersion).finish());
        return;
      }
      case kSet: {
        SHOAL_LOG(trace, "store server: SET '%s' (%zu bytes)", q.key.c_str(), q.value.size());
        data_[q.key] = std::move(q.value);
        send_frame(c, FrameWriter(kOk, req).finish());
        key_set(q.key);
        return;
      }
      case kGet:
        start_wait(c, req, kGet, {std::move(q.key)}, q.timeout_ms);
        return;
      case kWait:
        start_wait(c, req, kWait, std::move(q.keys), q.timeout_ms);
        return;
      case kAdd: {
        const std::string& key = q.key;
        int64_t cur = 0;
        auto it = data_.find(key);
        if (it != data_.end() && !parse_int64(it->second, &cur)) {
          send_frame(c, FrameWriter(kFailed, req).str("store add: the value of key '" + key +
                                                      "' is not an integer").finish());
          return;
        }
        int64_t next;
        if (__builtin_add_overflow(cur, q.delta, &next)) {
          send_frame(c, FrameWriter(kFailed, req).str("store add: key '" + key + "' overflows int64").finish());
          return;
        }
        data_[key] = int64_bytes(next);
        send_frame(c, FrameWriter(kOk, req).i64(next).finish());
        key_set(key);
        return;
      }
      case kCheck:
        send_frame(c, FrameWriter(kOk, req).u8(data_.count(q.key) ? 1 : 0).finish());
        return;
    }
  }

  // --- waiting GET/WAIT ---

  void start_wait(Client& c, uint32_t req, uint8_t cmd, std::vector<std::string> keys, int64_t timeout_ms) {
    uint64_t id = next_waiter_id_++;
    Waiter w;
    w.client = c.id;
    w.req = req;
    w.cmd = cmd;
    w.keys = std::move(keys);
    w.deadline = deadline_after(Millis(timeout_ms));
    waiters_.emplace(id, std::move(w));
    by_deadline_.emplace(waiters_[id].deadline, id);
    c.waiters.insert(id);
    if (!try_complete(id) && timeout_ms <= 0) time_out(id);
  }

  const std::string* first_missing(const Waiter& w) const {
    for (auto& k : w.keys)
      if (!data_.count(k)) return &k;
    return nullptr;
  }

  // Answers the waiter if all of its keys exist; else files it under its first missing key.
  bool try_complete(uint64_t id) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return true;
    Waiter& w = it->second;
    if (const std::string* missing = first_missing(w)) {
      auto [kit, _] = by_key_.try_emplace(*missing);
      kit->second.push_back(id);
      w.filed = &kit->first;  // node-based map: stable until that entry is erased
      return false;
    }
    auto cit = clients_.find(w.client);
    if (cit != clients_.end() && !cit->second->dead) {
      if (w.cmd == kGet) {
        const Bytes& v = data_.at(w.keys[0]);
        send_frame(*cit->second, FrameWriter(kOk, w.req, 4 + v.size()).str(v.data(), v.size()).finish());
      } else {
        send_frame(*cit->second, FrameWriter(kOk, w.req).finish());
      }
    }
    remove_waiter(id);
    return true;
  }

  void time_out(uint64_t id) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    Waiter& w = it->second;
    std::vector<std::string> missing;
    for (auto& k : w.keys)
      if (!data_.count(k)) missing.push_back(k);
    auto cit = clients_.find(w.client);
    if (cit != clients_.end() && !cit->second->dead) send_frame(*cit->second, FrameWriter(kTimedOut, w.req).keys(missing).finish());
    remove_waiter(id);
  }

  void remove_waiter(uint64_t id) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    by_deadline_.erase({it->second.deadline, id});
    auto cit = clients_.find(it->second.client);
    if (cit != clients_.end()) cit->second->waiters.erase(id);
    if (it->second.filed) {
      // Unfile it: a waiter that timed out (or whose client left) on a key that is never set
      // would otherwise stay in by_key_ for the server's lifetime (unbounded growth).
      auto kit = by_key_.find(*it->second.filed);
      if (kit != by_key_.end()) {
        std::erase(kit->second, id);
        if (kit->second.empty()) by_key_.erase(kit);
      }
    }
    waiters_.erase(it);
  }

  void key_set(const std::string& key) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return;
    std::vector<uint64_t> ids = std::move(it->second);
    by_key_.erase(it);
    for (uint64_t id : ids) {
      auto wit = waiters_.find(id);
      if (wit != waiters_.end()) wit->second.filed = nullptr;  // its entry is gone
    }
    for (uint64_t id : ids) try_complete(id);
  }

  void expire_waiters() {
    auto now = Clock::now();
    while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) time_out(by_deadline_.begin()->second);
  }

  // --- output ---

  void send_frame(Client& c, Bytes frame) {
    if (c.dead) return;
    if (c.out_off == c.out.size()) {
      c.out = std::move(frame);
      c.out_off = 0;
    } else {
      if (c.out_off > (1u << 20) && c.out_off * 2 > c.out.size()) {
        c.out.erase(c.out.begin(), c.out.begin() + static_cast<ptrdiff_t>(c.out_off));
        c.out_off = 0;
      }
      c.out.insert(c.out.end(), frame.begin(), frame.end());
    }
    flush(c);
  }

  void flush(Client& c) {
    while (c.out_off < c.out.size()) {
      ssize_t r = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          mod_epoll(c, true);
          return;
        }
        SHOAL_LOG(debug, "store server: send to %s: %s", c.peer.c_str(), errno_str(errno).c_str());
        c.dead = true;
        return;
      }
      c.out_off += static_cast<size_t>(r);
    }
    c.out.clear();
    c.out_off = 0;
    if (c.out.capacity() > (1u << 20)) c.out.shrink_to_fit();
    mod_epoll(c, false);
  }

  void reap() {
    for (auto it = clients_.begin(); it != clients_.end();) {
      Client& c = *it->second;
      if (!c.dead) {
        ++it;
        continue;
      }
      std::set<uint64_t> ws = std::move(c.waiters);
      for (uint64_t w : ws) remove_waiter(w);
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
      close(c.fd);
      it = clients_.erase(it);
      connected_.store(static_cast<int>(clients_.size()));
    }
  }

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connected_{0};
  std::thread thread_;

  uint64_t next_client_id_ = 2;  // 0 and 1 are the listening socket and the wake-up eventfd
  uint64_t next_waiter_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Client>> clients_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> by_key_;
  std::set<std::pair<TimePoint, uint64_t>> by_deadline_;
  const Millis stall_timeout_ = env_seconds("SHOAL_STORE_STALL_TIMEOUT", kStallTimeout);
  const std::string token_ = store_token();
  TimePoint next_stall_check_ = TimePoint::max();
};

// Connects to host:port, retrying until `deadline` (the server may not be listening yet).
int connect_with_retry(const std::string& host, uint16_t port, TimePoint deadline, Millis budget) {
  std::string port_s = std::to_string(port);
  std::string last_err = "timed out";
  Millis backoff{5};
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
    if (rc != 0) {
      last_err = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      // IPv4 first: shoal's server listens on 0.0.0.0.
      std::vector<addrinfo*> ais;
      for (addrinfo* ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family == AF_INET) ais.push_back(ai);
      for (addrinfo* ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family != AF_INET) ais.push_back(ai);
      for (addrinfo* ai : ais) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
          last_err = errno_str(errno);
          continue;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          err = errno;
          if (err == EINPROGRESS) {
            pollfd pfd{fd, POLLOUT, 0};
            int pr;
            do pr = poll(&pfd, 1, std::min(poll_ms(deadline), 1000)); while (pr < 0 && errno == EINTR);
            if (pr == 1) {
              socklen_t len = sizeof err;
              getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            } else {
              err = ETIMEDOUT;
            }
          }
        }
        if (err == 0) {
          int flags = fcntl(fd, F_GETFL);
          fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
          set_nodelay(fd);
          freeaddrinfo(res);
          return fd;
        }
        last_err = errno_str(err);
        close(fd);
      }
      freeaddrinfo(res);
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    SHOAL_LOG(trace, "store: connect to %s:%u failed (%s), retrying", host.c_str(), port, last_err.c_str());
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, Millis(200));
  }
  throw Error("store: cannot connect to " + host + ":" + port_s + " within " + std::to_string(budget.count()) +
              " ms: " + last_err + " (is the store server running? see docs/launch.md)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Request parsing (store_request.h), used by the server above.

namespace store_wire {

bool next_frame(const uint8_t* p, size_t n, size_t* frame_bytes, std::string* err) {
  *frame_bytes = 0;
  if (n < 4) return true;
  uint32_t len = get32(p);
  if (len > kMaxFrame) {
    *err = "frame of " + std::to_string(len) + " bytes exceeds the 64 MiB limit";
    return false;
  }
  if (len < kHeader - 4) {
    *err = "frame too short";
    return false;
  }
  if (n - 4 >= len) *frame_bytes = 4 + size_t(len);
  return true;
}

std::string parse_request(const uint8_t* p, size_t n, Request* out) {
  if (n < kHeader - 4) return "frame too short";
  out->cmd = p[0];
  out->id = get32(p + 1);
  FrameReader r(p + 5, n - 5);
  switch (out->cmd) {
    case kHello:
      out->magic = r.u32();
      out->version = r.u32();
      if (out->magic != kMagic) return "bad HELLO (not a shoal store client?)";
      if (out->version != kVersion) return "";  // answered with the version mismatch; its body may differ
      out->key = r.str();                       // the token
      if (!r.at_end() || out->key.size() > kMaxToken) return "bad HELLO (malformed token)";
      return "";
    case kSet:
      out->key = r.str();
      out->value = r.bytes();
      return r.at_end() ? "" : "malformed SET";
    case kGet:
      out->timeout_ms = r.i64();
      out->key = r.str();
      return r.at_end() ? "" : "malformed GET";
    case kWait:
      out->timeout_ms = r.i64();
      out->keys = r.keys();
      return r.at_end() ? "" : "malformed WAIT";
    case kAdd:
      out->key = r.str();
      out->delta = r.i64();
      return r.at_end() ? "" : "malformed ADD";
    case kCheck:
      out->key = r.str();
      return r.at_end() ? "" : "malformed CHECK";
  }
  return "unknown command " + std::to_string(out->cmd);
}

}  // namespace store_wire

// ---------------------------------------------------------------------------------------------
// Client. Several threads may share it: each request gets an id; requests are written under
// send_mu; one waiting thread at a time (the "reader") reads answers and hands each to its
// requester, so that a blocked GET in one thread does not hold up a SET from another.

struct TcpStore::Impl {
  struct Reply {
    bool done = false;
    uint8_t status = 0;
    Bytes body;  // frame after the header
  };

  std::string host;
  uint16_t port = 0;
  Millis io_timeout{60000};
  std::unique_ptr<StoreServer> server;
  int fd = -1;
  std::string local_addr;

  std::mutex send_mu;
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  uint32_t next_id = 1;
  std::unordered_map<uint32_t, Reply*> pending;
  bool reader_active = false;
  std::string broken;  // why the connection is unusable ("" while fine)
  Bytes rx;            // owned by the active reader
  size_t rx_len = 0;

  ~Impl() {
    if (fd >= 0) close(fd);
  }

  std::string where() const { return host + ":" + std::to_string(port); }

  void mark_broken(std::unique_lock<std::mutex>& lk, const std::string& why) {
    if (broken.empty()) {
      broken = why;
      SHOAL_LOG(warn, "store: connection to %s lost: %s", where().c_str(), why.c_str());
    }
    cv.notify_all();
    (void)lk;
  }

  bool send_all(const uint8_t* p, size_t n, TimePoint deadline, std::string* err) {
    while (n > 0) {
      ssize_t r = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        *err = "send: " + errno_str(errno);
        return false;
      }
      pollfd pfd{fd, POLLOUT, 0};
      int pr = poll(&pfd, 1, poll_ms(deadline));
      if (pr == 0) {
        *err = "send timed out";
        return false;
      }
    }
    return true;
  }

  enum class ReadResult { frame, timeout, error };
  // Reads one whole frame (its payload, without the length) into `out`.
  ReadResult read_frame(TimePoint deadline, Bytes* out, std::string* err) {
    for (;;) {
      size_t want = rx_len + 65536;
      if (rx_len >= 4) {
        uint32_t len = get32(rx.data());
        if (len > kMaxFrame || len < kHeader - 4) {
          *err = "bad frame from the server (length " + std::to_string(len) + ")";
          return ReadResult::error;
        }
        if (rx_len >= 4 + size_t(len)) {
          out->assign(rx.begin() + 4, rx.begin() + 4 + len);
          std::memmove(rx.data(), rx.data() + 4 + len, rx_len - 4 - len);
          rx_len -= 4 + size_t(len);
          if (rx.size() > (1u << 20) && rx_len < 65536) {
            rx.resize(65536);
            rx.shrink_to_fit();
          }
          return ReadResult::frame;
        }
        want = std::max(want, 4 + size_t(len));
      }
      if (rx.size() < want) rx.resize(want);
      pollfd pfd{fd, POLLIN, 0};
      int pr = poll(&pfd, 1, poll_ms(deadline));
      if (pr < 0) {
        if (errno == EINTR) continue;
        *err = "poll: " + errno_str(errno);
        return ReadResult::error;
      }
      if (pr == 0) {
        if (Clock::now() >= deadline) return ReadResult::timeout;
        continue;
      }
      ssize_t r = recv(fd, rx.data() + rx_len, rx.size() - rx_len, MSG_DONTWAIT);
      if (r == 0) {
        *err = "the store server closed the connection";
        return ReadResult::error;
      }
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        *err = "recv: " + errno_str(errno);
        return ReadResult::error;
      }
      rx_len += static_cast<size_t>(r);
    }
  }

  // Sends a request frame (built with id 0, patched here) and waits for its answer until
  // `deadline`. Returns nullopt if no answer came by then; throws Error if the connection broke.
  std::optional<Reply> call(Bytes frame, TimePoint deadline, const char* what) {
    Reply reply;
    uint32_t id;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!broken.empty()) throw Error("store " + std::string(what) + ": connection to " + where() + " lost: " + broken);
      id = next_id++;
      if (next_id == 0) next_id = 1;
      pending[id] = &reply;
    }
    put32(&frame[5], id);
    struct Unregister {
      Impl* self;
      uint32_t id;
      ~Unregister() {
        std::lock_guard<std::mutex> lk(self->mu);
        self->pending.erase(id);
      }
    } unregister{this, id};

    {
      std::string err;
      std::lock_guard<std::mutex> slk(send_mu);
      if (!send_all(frame.data(), frame.size(), deadline, &err)) {
        std::unique_lock<std::mutex> lk(mu);
        mark_broken(lk, err);  // a partly written frame: the stream is unusable
        throw Error("store " + std::string(what) + ": connection to " + where() + " lost: " + broken);
      }
    }

    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      if (reply.done) return reply;
      if (!broken.empty()) throw Error("store " + std::string(what) + ": connection to " + where() + " lost: " + broken);
      if (Clock::now() >= deadline) return std::nullopt;
      if (reader_active) {
        cv.wait_until(lk, deadline);
        continue;
      }
      reader_active = true;
      lk.unlock();
      Bytes payload;
      std::string err;
      ReadResult rr = read_frame(deadline, &payload, &err);
      lk.lock();
      reader_active = false;
      if (rr == ReadResult::frame) {
        uint32_t rid = get32(payload.data() + 1);
        auto it = pending.find(rid);
        if (it != pending.end()) {
          it->second->done = true;
          it->second->status = payload[0];
          it->second->body.assign(payload.begin() + 5, payload.end());
        } else {
          SHOAL_LOG(debug, "store: dropping a late answer (request %u) from %s", rid, where().c_str());
        }
      } else if (rr == ReadResult::error) {
        mark_broken(lk, err);
      }
      cv.notify_all();  // hand the answer over, and the reader role with it
    }
  }

  // For requests that are answered at once (SET, ADD, CHECK, HELLO).
  Reply call_now(Bytes frame, const char* what, const std::string& key) {
    auto r = call(std::move(frame), deadline_after(io_timeout), what);
    if (!r) {
      throw Timeout("store " + std::string(what) + " of key '" + key + "': no answer from " + where() + " within " +
                    std::to_string(io_timeout.count()) + " ms");
    }
    if (r->status == kFailed) {
      FrameReader fr(r->body.data(), r->body.size());
      throw Error(fr.str());
    }
    if (r->status != kOk) throw Error("store " + std::string(what) + ": unexpected answer from " + where());
    return std::move(*r);
  }
};

TcpStore::TcpStore(const std::string& host, uint16_t port, bool is_server, Millis connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->io_timeout = std::max(clamp_timeout(connect_timeout), Millis(60000));
  if (is_server) {
    impl_->server = std::make_unique<StoreServer>("0.0.0.0", port);
    impl_->port = impl_->server->port();
  }
  TimePoint deadline = deadline_after(connect_timeout);
  impl_->fd = connect_with_retry(host, impl_->port, deadline, clamp_timeout(connect_timeout));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(impl_->fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) impl_->local_addr = sockaddr_ip(ss);

  auto r = impl_->call(FrameWriter(kHello, 0).u32(kMagic).u32(kVersion).str(store_token()).finish(),
                       std::max(deadline, deadline_after(Millis(5000))), "hello");
  if (!r) throw Error("store: no answer to HELLO from " + impl_->where() + " (not a shoal store server?)");
  if (r->status != kOk) {
    FrameReader fr(r->body.data(), r->body.size());
    throw Error("store: " + impl_->where() + " refused the connection: " + fr.str());
  }
  SHOAL_LOG(debug, "store: connected to %s from %s", impl_->where().c_str(), impl_->local_addr.c_str());
}

TcpStore::~TcpStore() {
  if (impl_->fd >= 0) {
    close(impl_->fd);
    impl_->fd = -1;
  }
  if (impl_->server) {
    // The ranks usually finish together, but the one serving the store may get here first: give
    // the others a moment to finish with the store (and disconnect) before pulling it away.
    if (!impl_->server->wait_no_clients(server_linger())) {
      SHOAL_LOG(warn, "store server on port %u: stopping with clients still connected", impl_->port);
    }
    impl_->server.reset();  // stops the server thread
  }
}

static void check_size(const std::string& key, size_t value_size) {
  if (key.size() + value_size + 64 > kMaxFrame) {
    throw InvalidArgument("store set: key '" + key + "' with a value of " + std::to_string(value_size) +
                          " bytes exceeds the store's 64 MiB frame limit");
  }
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  check_size(key, value.size());
  impl_->call_now(FrameWriter(kSet, 0, 8 + key.size() + value.size()).str(key).str(value.data(), value.size()).finish(),
                  "set", key);
}

Bytes TcpStore::get(const std::string& key, Millis timeout) {
  check_size(key, 0);
  timeout = clamp_timeout(timeout);
  auto r = impl_->call(FrameWriter(kGet, 0).i64(timeout.count()).str(key).finish(),
                       deadline_after(timeout + kReplyGrace), "get");
  if (!r || r->status == kTimedOut) {
    throw Timeout("store get: key '" + key + "' was not set within " + std::to_string(timeout.count()) +
                  " ms (store " + impl_->where() + ")");
  }
  FrameReader fr(r->body.data(), r->body.size());
  if (r->status != kOk) throw Error("store get of key '" + key + "': " + fr.str());
  Bytes v = fr.bytes();
  if (!fr.at_end()) throw Error("store get of key '" + key + "': malformed answer from " + impl_->where());
  return v;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_size(key, 0);
  Impl::Reply r = impl_->call_now(FrameWriter(kAdd, 0).str(key).i64(delta).finish(), "add", key);
  FrameReader fr(r.body.data(), r.body.size());
  int64_t v = fr.i64();
  if (!fr.at_end()) throw Error("store add of key '" + key + "': malformed answer from " + impl_->where());
  return v;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) return;
  size_t total = 0;
  for (auto& k : keys) total += k.size() + 4;
  check_size("(wait)", total);
  timeout = clamp_timeout(timeout);
  auto r = impl_->call(FrameWriter(kWait, 0).i64(timeout.count()).keys(keys).finish(),
                       deadline_after(timeout + kReplyGrace), "wait");
  if (!r) {
    throw Timeout("store wait: keys " + quote_keys(keys) + " were not all set within " +
                  std::to_string(timeout.count()) + " ms (store " + impl_->where() + ")");
  }
  FrameReader fr(r->body.data(), r->body.size());
  if (r->status == kTimedOut) {
    std::vector<std::string> missing = fr.keys();
    throw Timeout("store wait: " + std::to_string(missing.size()) + " of " + std::to_string(keys.size()) +
                  " keys were not set within " + std::to_string(timeout.count()) + " ms: missing " +
                  quote_keys(missing) + " (store " + impl_->where() + ")");
  }
  if (r->status != kOk) throw Error("store wait: " + fr.str());
}

bool TcpStore::check(const std::string& key) {
  check_size(key, 0);
  Impl::Reply r = impl_->call_now(FrameWriter(kCheck, 0).str(key).finish(), "check", key);
  FrameReader fr(r.body.data(), r.body.size());
  uint8_t v = fr.u8();
  if (!fr.at_end()) throw Error("store check of key '" + key + "': malformed answer from " + impl_->where());
  return v != 0;
}

uint16_t TcpStore::port() const { return impl_->port; }

std::string TcpStore::local_address() const { return impl_->local_addr; }

namespace detail {
// A server without a client, for the launcher tools (shoal-run, shoal-store). Not part of the
// public API: the tools declare it themselves. Destroying the returned handle stops the server.
std::shared_ptr<void> start_store_server(const std::string& bind_host, uint16_t port, uint16_t* bound_port) {
  auto s = std::make_shared<StoreServer>(bind_host, port);
  if (bound_port) *bound_port = s->port();
  return s;
}
}  // namespace detail

}  // namespace shoal
