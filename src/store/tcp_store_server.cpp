// TcpStore's server (tcp_store_server.h).
#include "store/tcp_store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "store/quote_keys.h"
#include "store/tcp_store_wire.h"

namespace shoal {

using namespace store_wire;

class StoreServer::Impl {
 public:
  Impl(const std::string& bind_host, uint16_t port) {
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

  ~Impl() {
    stop_.store(true);
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    for (auto& [id, c] : clients_) close(c->fd);
    clients_.clear();
    cleanup_fds();
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

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

StoreServer::StoreServer(const std::string& bind_host, uint16_t port) : impl_(std::make_unique<Impl>(bind_host, port)) {}
StoreServer::~StoreServer() = default;
uint16_t StoreServer::port() const { return impl_->port(); }
bool StoreServer::wait_no_clients(Millis max) { return impl_->wait_no_clients(max); }

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
