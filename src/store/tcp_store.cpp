// TcpStore: shoal's own rendezvous store over TCP, the client; the serving rank's TcpStore also
// runs the server (tcp_store_server.h), and the protocol is in tcp_store_wire.h.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "store/quote_keys.h"
#include "store/tcp_store_server.h"
#include "store/tcp_store_wire.h"

namespace shoal {
namespace {

using namespace store_wire;

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

}  // namespace shoal
