// FileStore: every key in one append-only file, guarded by flock.
//
// The file is a sequence of records: u32 magic | u32 key length | u32 value length | key | value
// (little-endian); for a key set several times the last record wins. Writers (set, add) hold
// LOCK_EX while they read the file and append; readers hold LOCK_SH while they read it, so nobody
// sees half a record. A torn tail (a writer killed mid-write) is cut off by the next writer.
// get/wait poll the file with a short sleep (1 ms growing to 20 ms) until their deadline.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "base/le32.h"
#include "store/quote_keys.h"
#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kRecordMagic = 0x53465348;  // "HSFS"
constexpr size_t kRecordHeader = 12;

// An open, locked store file; unlocks and closes when it goes away.
class LockedFile {
 public:
  LockedFile(const std::string& path, bool exclusive) : path_(path) {
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("file store: cannot open '" + path + "': " + std::strerror(errno));
    int rc;
    do rc = flock(fd_, exclusive ? LOCK_EX : LOCK_SH); while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      int e = errno;
      close(fd_);
      throw Error("file store: cannot lock '" + path + "': " + std::strerror(e));
    }
  }
  ~LockedFile() {
    flock(fd_, LOCK_UN);
    close(fd_);
  }
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;

  off_t size() const {
    struct stat st;
    if (fstat(fd_, &st) != 0) throw Error("file store: fstat '" + path_ + "': " + std::strerror(errno));
    return st.st_size;
  }

  Bytes read_all() const {
    Bytes buf(static_cast<size_t>(size()));
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t r = pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error("file store: read '" + path_ + "': " + std::strerror(errno));
      if (r == 0) break;  // shrank under us (should not happen while locked)
      done += static_cast<size_t>(r);
    }
    buf.resize(done);
    return buf;
  }

  void write_at(off_t off, const Bytes& data) const {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t r = pwrite(fd_, data.data() + done, data.size() - done, off + static_cast<off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error("file store: write '" + path_ + "': " + std::strerror(errno));
      done += static_cast<size_t>(r);
    }
  }

  void truncate(off_t len) const {
    if (ftruncate(fd_, len) != 0) throw Error("file store: truncate '" + path_ + "': " + std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

struct Parsed {
  std::unordered_map<std::string, Bytes> kv;
  size_t valid_end = 0;  // end of the last whole record
};

// Parses every record; when `only` is non-null, keeps the values of those keys only.
Parsed parse(const Bytes& buf, const std::unordered_set<std::string>* only) {
  Parsed p;
  size_t off = 0;
  while (buf.size() - off >= kRecordHeader) {
    const uint8_t* h = buf.data() + off;
    if (get32(h) != kRecordMagic) break;
    uint64_t klen = get32(h + 4), vlen = get32(h + 8);
    if (buf.size() - off - kRecordHeader < klen + vlen) break;
    std::string key(reinterpret_cast<const char*>(h + kRecordHeader), klen);
    if (!only || only->count(key)) {
      const uint8_t* v = h + kRecordHeader + klen;
      p.kv[std::move(key)] = Bytes(v, v + vlen);
    }
    off += kRecordHeader + klen + vlen;
  }
  p.valid_end = off;
  return p;
}

Bytes make_record(const std::string& key, const Bytes& value) {
  if (key.size() > UINT32_MAX || value.size() > UINT32_MAX) throw InvalidArgument("file store: key or value too large");
  Bytes r(kRecordHeader + key.size() + value.size());
  put32(&r[0], kRecordMagic);
  put32(&r[4], static_cast<uint32_t>(key.size()));
  put32(&r[8], static_cast<uint32_t>(value.size()));
  std::memcpy(&r[kRecordHeader], key.data(), key.size());
  if (!value.empty()) std::memcpy(&r[kRecordHeader + key.size()], value.data(), value.size());
  return r;
}

// Appends under an exclusive lock that the caller holds, first cutting off any torn tail.
void append(const LockedFile& f, const std::string& path, const Parsed& p, size_t file_size, const Bytes& record) {
  if (p.valid_end != file_size) {
    SHOAL_LOG(warn, "file store '%s': dropping %zu bytes of a torn record", path.c_str(), file_size - p.valid_end);
    f.truncate(static_cast<off_t>(p.valid_end));
  }
  f.write_at(static_cast<off_t>(p.valid_end), record);
}

Millis clamp_timeout(Millis t) {
  constexpr Millis kMax = std::chrono::hours(24 * 365 * 10);
  if (t < Millis(0)) return Millis(0);
  return t > kMax ? kMax : t;
}

// Polls `probe` (true when done) until the deadline; false on timeout.
template <class Probe>
bool poll_until(Millis timeout, Probe probe) {
  auto deadline = Clock::now() + clamp_timeout(timeout);
  auto sleep = std::chrono::microseconds(1000);
  for (;;) {
    if (probe()) return true;
    auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - now));
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
}

}  // namespace

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw InvalidArgument("file store: empty path");
  LockedFile f(path_, false);  // creates the file; fails early on a bad path
}

void FileStore::set(const std::string& key, const Bytes& value) {
  Bytes record = make_record(key, value);
  LockedFile f(path_, true);
  Bytes buf = f.read_all();
  std::unordered_set<std::string> none;
  append(f, path_, parse(buf, &none), buf.size(), record);
}

Bytes FileStore::get(const std::string& key, Millis timeout) {
  std::unordered_set<std::string> want{key};
  Bytes value;
  off_t seen = -1;
  bool found = poll_until(timeout, [&] {
    LockedFile f(path_, false);
    off_t size = f.size();
    if (size == seen) return false;  // append-only: nothing new
    seen = size;
    Parsed p = parse(f.read_all(), &want);
    auto it = p.kv.find(key);
    if (it == p.kv.end()) return false;
    value = std::move(it->second);
    return true;
  });
  if (!found) {
    throw Timeout("file store get: key '" + key + "' was not set within " +
                  std::to_string(clamp_timeout(timeout).count()) + " ms (store file " + path_ + ")");
  }
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  LockedFile f(path_, true);
  Bytes buf = f.read_all();
  std::unordered_set<std::string> want{key};
  Parsed p = parse(buf, &want);
  int64_t cur = 0;
  auto it = p.kv.find(key);
  if (it != p.kv.end()) {
    std::string s(it->second.begin(), it->second.end());
    errno = 0;
    char* end = nullptr;
    cur = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || errno != 0 || end != s.c_str() + s.size()) {
      throw Error("file store add: the value of key '" + key + "' is not an integer");
    }
  }
  int64_t next;
  if (__builtin_add_overflow(cur, delta, &next)) throw Error("file store add: key '" + key + "' overflows int64");
  std::string s = std::to_string(next);
  append(f, path_, p, buf.size(), make_record(key, Bytes(s.begin(), s.end())));
  return next;
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) return;
  std::unordered_set<std::string> want(keys.begin(), keys.end());
  std::vector<std::string> missing = keys;
  off_t seen = -1;
  bool found = poll_until(timeout, [&] {
    LockedFile f(path_, false);
    off_t size = f.size();
    if (size == seen) return false;
    seen = size;
    Parsed p = parse(f.read_all(), &want);
    missing.clear();
    for (auto& k : keys)
      if (!p.kv.count(k)) missing.push_back(k);
    return missing.empty();
  });
  if (!found) {
    throw Timeout("file store wait: " + std::to_string(missing.size()) + " of " + std::to_string(keys.size()) +
                  " keys were not set within " + std::to_string(clamp_timeout(timeout).count()) + " ms: missing " +
                  quote_keys(missing) + " (store file " + path_ + ")");
  }
}

bool FileStore::check(const std::string& key) {
  std::unordered_set<std::string> want{key};
  LockedFile f(path_, false);
  return parse(f.read_all(), &want).kv.count(key) > 0;
}

}  // namespace shoal
