#include "core/rendezvous.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <utility>

#include "algo/cost.h"
#include "algo/direct_common.h"
#include "base/cpus.h"
#include "base/log.h"
#include "base/params.h"
#include "shoal/error.h"
#include "transport/fd_limit.h"
#include "transport/net_address.h"
#include "core/peer_transport.h"
#include "transport/tcp_link.h"

namespace shoal {
namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

void random_bytes(uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("getrandom: ") + std::strerror(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

// Hostname, boot id and PID namespace: two processes that agree on all three may share memory
// (the probe of each other's segment decides). The PID namespace is part of it because a rank
// watches a shared-memory peer through the peer's pid (pidfd) and reads its memory by pid (CMA):
// containers of one Kubernetes pod share a hostname and may share /dev/shm, but each has its own
// PID namespace, where a peer's pid names another process or none.
// SHOAL_HOST_ID replaces it: ranks given different ids behave as if on different hosts (no shared
// memory between them, the hierarchical algorithms apply), so that multi-host layouts can be
// tested on one machine.
std::string boot_id() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return boot;
}

// This process's namespace of a kind ("pid", "net"), as /proc names it: "pid:[4026531836]".
std::string namespace_of(const char* kind) {
  char link[64] = {0};
  if (readlink((std::string("/proc/self/ns/") + kind).c_str(), link, sizeof link - 1) < 0) link[0] = 0;
  return link;
}

std::string host_identity() {
  if (auto id = params::text("SHOAL_HOST_ID")) return "id:" + *id;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + boot_id() + "/" + namespace_of("pid");
}

// Boot id and network namespace: ranks that agree on both reach each other over loopback, whatever
// SHOAL_HOST_ID says (it simulates hosts; the network is still one).
std::string network_identity() { return boot_id() + "/" + namespace_of("net"); }

size_t pow2_at_least(size_t v) {
  size_t p = 4096;
  while (p < v) p <<= 1;
  return p;
}

// Bytes of each inbound ring when SHOAL_SHM_RING is not set: 1 MiB while a host has at most 9
// ranks, then shrinking so that a rank's rings stay within kRingBudget (at least 64 KiB each):
// with the 16 MiB scratch, a rank reserves at most about 24 MiB up to 128 ranks on a host.
constexpr size_t kRingBudget = size_t(8) << 20;
size_t default_ring_bytes(int slots) {
  size_t r = size_t(1) << 20;
  while (r > (size_t(64) << 10) && r * static_cast<size_t>(std::max(1, slots - 1)) > kRingBudget) r >>= 1;
  return r;
}

}  // namespace

ShmSizes shm_sizes(int local_ranks) {
  ShmSizes s;
  const uint64_t ring = params::bytes("SHOAL_SHM_RING").value_or(0);
  s.ring = ring ? pow2_at_least(ring) : default_ring_bytes(local_ranks);
  s.scratch = algo::direct::scratch_setting();
  s.segment = ShmSegment::bytes_for(local_ranks, s.ring, s.scratch);
  return s;
}

namespace {

Millis left_until(Clock::time_point deadline) {
  return std::max(Millis(0), std::chrono::ceil<Millis>(deadline - Clock::now()));
}

// Every rank sets key/<rank>; rank 0 reads them all and sets key/all, which every rank reads:
// 3p store requests per gather instead of p^2 (each rank reading every other's key), which at 128
// ranks made the group's creation take seconds. key/all holds each value as "<length>:<bytes>".
// A rank that times out names the ranks whose keys are missing.
std::vector<std::string> all_gather(Store& store, const std::string& key, int rank, int size, const std::string& mine,
                                    Clock::time_point deadline) {
  if (size == 1) return {mine};
  auto rank_key = [&](int r) { return key + "/" + std::to_string(r); };
  store.set_string(rank_key(rank), mine);
  std::string all;
  try {
    if (rank == 0) {
      for (int r = 0; r < size; ++r) {
        const std::string v = r == 0 ? mine : store.get_string(rank_key(r), left_until(deadline));
        all += std::to_string(v.size()) + ":" + v;
      }
      store.set_string(key + "/all", all);
    } else {
      all = store.get_string(key + "/all", left_until(deadline));
    }
  } catch (const Timeout&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r)
      if (!store.check(rank_key(r))) missing.push_back(r);
    std::string who;
    for (int r : missing) who += (who.empty() ? "" : ", ") + std::to_string(r);
    throw Timeout("rendezvous timed out waiting for rank(s) " + (who.empty() ? std::string("0") : who) + " (" + key +
                  ")");
  }
  std::vector<std::string> out;
  for (size_t at = 0; at < all.size() && out.size() < static_cast<size_t>(size);) {
    const size_t colon = all.find(':', at);
    size_t len = 0;
    const auto [end, ec] = std::from_chars(all.data() + at, all.data() + std::min(colon, all.size()), len);
    if (colon == std::string::npos || ec != std::errc() || end != all.data() + colon || len > all.size() - colon - 1)
      break;
    out.push_back(all.substr(colon + 1, len));
    at = colon + 1 + len;
  }
  if (out.size() != static_cast<size_t>(size)) throw Error("rendezvous: malformed " + key + "/all in the store");
  return out;
}

// Before every rank leaves rendezvous with an error found in key/all: rank 0, which serves the
// store in torch's and Ray's groups, must not take the store down while a peer has still to read
// key/all (that peer would report a lost store instead of the cause). Every other rank says it has
// read; rank 0 waits for them, briefly, as they are all past the gather already.
void hold_store_until_read(Store& store, const std::string& key, int rank, int size, Clock::time_point deadline) {
  if (size == 1) return;
  const std::string read = key + "/read/";
  if (rank != 0) {
    store.set_string(read + std::to_string(rank), "1");
    return;
  }
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(read + std::to_string(r));
  try {
    store.wait(keys, std::min(left_until(deadline), Millis(10000)));
  } catch (const Error&) {
    // A peer that has not read by now is gone or stuck: the cause is still ours to raise.
  }
}

// all_gather, where a rank that cannot take part gives "!" and why (own_failure, non-empty)
// instead of its value: then every rank fails, with its own reason first, else the first failed
// rank's, and rank 0 keeps the store up until the others have read.
std::vector<std::string> gather_or_fail(Store& store, const std::string& key, int rank, int size,
                                        const std::string& mine, const std::string& own_failure,
                                        Clock::time_point deadline) {
  auto values = all_gather(store, key, rank, size, own_failure.empty() ? mine : "!" + own_failure, deadline);
  int failed = own_failure.empty() ? -1 : rank;
  for (int r = 0; r < size && failed < 0; ++r)
    if (!values[r].empty() && values[r][0] == '!') failed = r;
  if (failed < 0) return values;
  hold_store_until_read(store, key, rank, size, deadline);
  if (failed == rank) throw Error(own_failure);
  throw Error("rank " + std::to_string(failed) + " failed to set up: " + values[failed].substr(1));
}

}  // namespace

Topology rendezvous(Store& store, Engine& engine, const Options& opts, const std::string& store_address) {
  const int rank = engine.rank, size = engine.size;
  const Millis timeout = opts.timeout;
  const auto deadline = Clock::now() + timeout;
  Topology topo;
  topo.segs.resize(size);
  topo.transport.assign(size, "tcp");
  topo.transport[rank] = "self";

  // Group id (names the segments) and secret (every TCP connection must present it).
  uint8_t secret[32];
  std::string id;
  if (rank == 0) {
    random_bytes(secret, sizeof secret);
    id = hex(secret, sizeof secret);
    store.set_string("id", id);
  } else {
    id = store.get_string("id", timeout);
    if (id.size() != 64) throw Error("rendezvous: malformed group id in the store");
    for (size_t i = 0; i < 32; ++i) secret[i] = static_cast<uint8_t>(std::stoi(id.substr(2 * i, 2), nullptr, 16));
  }
  const std::string short_id = id.substr(0, 16);

  // Whether every rank runs on this host (the choice of algorithm differs when all TCP bytes
  // cost the same CPUs), and whether some peer is outside this network namespace (then loopback
  // is no address to advertise).
  // With them, what the automatic choices on one host read (algo/cost.h): ranks that read
  // different costs or settings could run one op different ways. Reading them here also fails
  // the group's creation on a value that cannot be used (SHOAL_TUNING, SHOAL_TUNING_BUILTIN,
  // SHOAL_DIRECT_*), not an op. Such a value fails this rank with its own error and its peers at
  // once, naming it, rather than leaving them to wait for this rank's identity until the timeout.
  const std::string me = host_identity(), my_network = network_identity();
  std::string ways_error;
  std::exception_ptr ways_failure;
  try {
    topo.ways = algo::Ways::current();
  } catch (const std::exception& e) {
    ways_error = *e.what() ? e.what() : "reading the settings of the automatic choice failed";
    ways_failure = std::current_exception();
  }
  const std::string my_tuning =
      ways_failure ? "" : std::to_string(topo.ways.digest()) + "/" + std::to_string(topo.ways.switches_digest());
  std::vector<std::string> ids;
  try {
    ids = gather_or_fail(store, "hostid", rank, size,
                         me + "|" + my_network + "|" + my_tuning + "|" + std::to_string(topo.ways.l2()) + "|" + affinity_text(),
                         ways_error, deadline);
  } catch (const Error&) {
    if (ways_failure) std::rethrow_exception(ways_failure);
    throw;
  }
  std::vector<std::string> host_ids(size);
  bool peer_elsewhere = false;
  std::vector<std::string> tunings(size), switches(size), cpus(size), machines(size);
  std::vector<size_t> l2s(size);
  for (int r = 0; r < size; ++r) {
    const size_t cbar = ids[r].rfind('|');
    const size_t lbar = cbar == std::string::npos || cbar == 0 ? std::string::npos : ids[r].rfind('|', cbar - 1);
    const std::string l2 = lbar == std::string::npos ? "" : ids[r].substr(lbar + 1, cbar - lbar - 1);
    const auto [end, ec] = std::from_chars(l2.data(), l2.data() + l2.size(), l2s[r]);
    if (lbar == std::string::npos || std::count(ids[r].begin(), ids[r].end(), '|') < 4 || ec != std::errc() ||
        end != l2.data() + l2.size())
      throw Error("rank " + std::to_string(r) + " published a malformed identity '" + ids[r] +
                  "' (is every rank running the same build of shoal?)");
    cpus[r] = ids[r].substr(cbar + 1);
    ids[r].resize(lbar);
    const size_t tbar = ids[r].rfind('|'), bar = ids[r].rfind('|', tbar - 1), slash = ids[r].rfind('/');
    host_ids[r] = ids[r].substr(0, bar);
    const std::string network = ids[r].substr(bar + 1, tbar - bar - 1);
    peer_elsewhere = peer_elsewhere || network != my_network;
    // The machine: its boot id (shared by its containers and by hosts that SHOAL_HOST_ID simulates).
    machines[r] = network.substr(0, network.find('/'));
    if (machines[r].empty()) machines[r] = host_ids[r];
    tunings[r] = ids[r].substr(tbar + 1, slash - tbar - 1);
    switches[r] = ids[r].substr(slash + 1);
  }
  // The switches drive choices among ranks of any hosts: every rank must read the same.
  for (int r = 1; r < size; ++r) {
    if (switches[r] == switches[0]) continue;
    hold_store_until_read(store, "hostid", rank, size, deadline);
    throw InvalidArgument("ranks 0 and " + std::to_string(r) +
                          " read different switches of the automatic choice (SHOAL_TUNING's 'switch' lines): set "
                          "them the same for every rank of a group");
  }
  // The choices they drive run among the ranks of one host: each host's ranks must agree (hosts
  // of other kinds may have files of their own). Every rank finds the same first pair.
  for (int r = 1; r < size; ++r) {
    const int first = static_cast<int>(std::find(host_ids.begin(), host_ids.end(), host_ids[r]) - host_ids.begin());
    if (tunings[r] == tunings[first]) continue;
    hold_store_until_read(store, "hostid", rank, size, deadline);
    throw InvalidArgument("ranks " + std::to_string(first) + " and " + std::to_string(r) +
                          ", on one host, read different measured costs or settings (" + algo::agreed_settings() +
                          "): set them the same for every rank of a host");
  }
  // The chunks of the direct ops are cut by one L2 (Ways::l2): every rank of a host cuts by the
  // smallest that one of them read.
  size_t host_l2 = topo.ways.l2();
  for (int r = 0; r < size; ++r)
    if (host_ids[r] == host_ids[rank]) host_l2 = std::min(host_l2, l2s[r]);
  topo.ways.agree_l2(host_l2);
  const bool one_host = std::all_of(host_ids.begin(), host_ids.end(), [&](auto& h) { return h == host_ids[0]; });
  topo.hosts = HostMap::from_ids(host_ids);
  // Shared-memory ring slots: the ranks of this host, in rank order.
  const std::vector<int>& local = topo.hosts.ranks[topo.hosts.host_of[rank]];
  // The CPUs of this machine's ranks (those of other host identities on it too: containers, or
  // simulated hosts, take the same CPUs).
  std::vector<std::string> machine_cpus;
  for (int r = 0; r < size; ++r)
    if (machines[r] == machines[rank]) machine_cpus.push_back(cpus[r]);
  topo.machine_ranks = static_cast<int>(machine_cpus.size());
  topo.machine_cpus = cpus_in_union(machine_cpus);
  engine.set_cpus(topo.machine_ranks, topo.machine_cpus);
  topo.ways.stores().set_machine(topo.machine_ranks, topo.machine_cpus);

  TcpConfig cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.same_host.assign(size, false);
  for (int r = 0; r < size; ++r) cfg.same_host[r] = r != rank && host_ids[r] == host_ids[rank];
  // A value the user set applies to every peer; the defaults differ by host (TcpConfig says why).
  if (opts.tcp_streams > 0) cfg.streams = cfg.local_streams = opts.tcp_streams;
  if (opts.tcp_notsent_lowat >= 0) cfg.notsent_lowat = cfg.local_notsent_lowat = opts.tcp_notsent_lowat;

  // What can fail on this rank alone, found before any peer waits on it: room for every
  // descriptor the links may take (a pidfd per shared-memory peer, the sockets of a TCP one; a
  // peer of this host counts as TCP, which it becomes if the probe fails), and the address to
  // advertise. The failure reaches the peers in place of this rank's next published value.
  std::string setup_error;
  {
    size_t fds = 1;  // the TCP listener
    bool striped = false;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const bool shm_only = cfg.same_host[r] && opts.transport == TransportKind::shm;
      fds += shm_only ? 1 : static_cast<size_t>(tcp_streams(cfg, r) + 1);
      striped = striped || (!shm_only && tcp_streams(cfg, r) > 1);
    }
    setup_error = make_fd_room(fds, "rank " + std::to_string(rank) + "'s links to its peers (sockets and pidfds)",
                               striped ? "use one socket per pair (SHOAL_TCP_STREAMS=1)" : "");
  }
  if (setup_error.empty()) {
    try {
      cfg.advertise_host = advertise_address(store_address, peer_elsewhere);
    } catch (const Error& e) {
      setup_error = e.what();
    }
  }
  ShmSizes sizes;
  if (setup_error.empty() && opts.transport != TransportKind::tcp) {
    try {
      sizes = shm_sizes(static_cast<int>(local.size()));
    } catch (const Error& e) {
      setup_error = e.what();
    }
  }

  // Per peer, the first transport that can connect (shared memory, then TCP), a round of the
  // store each: every rank publishes what its peers need (or, in the first round, why it cannot
  // take part: every rank then fails with that reason), says which of the peers still without a
  // transport it can reach, and a pair takes the transport when both sides can. Every rank sees
  // every answer, so every rank knows every pair's transport.
  std::shared_ptr<ShmPeers> shm;
  std::shared_ptr<TcpPeers> tcp;
  std::vector<std::shared_ptr<PeerTransport>> transports;
  if (opts.transport != TransportKind::tcp) {
    uint64_t nonce;
    random_bytes(reinterpret_cast<uint8_t*>(&nonce), sizeof nonce);
    shm = std::make_shared<ShmPeers>(rank, me, short_id, local, sizes.ring, sizes.scratch, opts.single_copy, nonce,
                                     topo.ways.shared_stores(), topo.segs);
    transports.push_back(shm);
  }
  if (opts.transport != TransportKind::shm) {
    std::memcpy(cfg.secret.data(), secret, sizeof secret);
    cfg.epoll_fd = engine.epoll_fd();
    tcp = std::make_shared<TcpPeers>(cfg);
    transports.push_back(tcp);
  }
  // The transport of pair (a, b), an index into `transports` (-1: none yet): a byte each, as a
  // group of thousands of ranks holds size^2 of them.
  std::vector<std::vector<int8_t>> pair_of(size, std::vector<int8_t>(size, -1));
  const std::vector<int8_t>& of = pair_of[rank];  // this rank's pairs
  auto undecided = [&] {
    for (int a = 0; a < size; ++a)
      for (int b = 0; b < size; ++b)
        if (a != b && pair_of[a][b] < 0) return true;
    return false;
  };
  for (size_t k = 0; k < transports.size(); ++k) {
    // A round runs for the pairs left (the same answer on every rank), and the shared-memory
    // round always: a group of one keeps its own segment (the direct algorithms' scratch).
    if (!undecided() && transports[k] != shm) continue;
    PeerTransport& t = *transports[k];
    std::vector<bool> wanted(size);
    for (int r = 0; r < size; ++r) wanted[r] = r != rank && of[r] < 0;
    std::string failure = k == 0 ? setup_error : "";
    std::string info;
    if (failure.empty()) {
      try {
        info = t.prepare(wanted);
      } catch (const Error& e) {
        failure = e.what();
      }
    }
    const auto infos = gather_or_fail(store, t.name(), rank, size, info, failure, deadline);
    std::string reach(size, '0');
    reach[rank] = '1';
    for (int r = 0; r < size; ++r)
      if (wanted[r]) reach[r] = t.can_connect(r, infos[r]);
    // A transport that reaches every peer needs no round for the answers: every rank knows them.
    std::vector<std::string> reaches(size, std::string(size, '1'));
    if (!t.reaches_all()) reaches = all_gather(store, std::string(t.name()) + "/reach", rank, size, reach, deadline);
    std::vector<bool> mine(size, false);
    for (int a = 0; a < size; ++a)
      for (int b = 0; b < size; ++b)
        if (a != b && pair_of[a][b] < 0 && reaches[a][b] != '0' && reaches[b][a] != '0') pair_of[a][b] = static_cast<int8_t>(k);
    for (int r = 0; r < size; ++r) {
      mine[r] = r != rank && of[r] == static_cast<int>(k);  // this round's: rounds give different k
      if (mine[r]) topo.transport[r] = t.name();
    }
    t.agreed(reaches, mine);
  }
  if (opts.transport == TransportKind::shm && undecided()) {
    // On every rank alike (every rank knows every pair).
    hold_store_until_read(store, "shm/reach", rank, size, deadline);
    for (int r = 0; r < size; ++r)
      if (r != rank && of[r] < 0)
        throw Error("SHOAL_TRANSPORT=shm but rank " + std::to_string(r) + " cannot be reached through shared memory");
    for (int a = 0; a < size; ++a)
      for (int b = 0; b < size; ++b)
        if (a != b && pair_of[a][b] < 0)
          throw Error("SHOAL_TRANSPORT=shm but ranks " + std::to_string(a) + " and " + std::to_string(b) +
                      " cannot reach each other through shared memory");
  }
  std::vector<std::unique_ptr<Link>> links(size);
  for (int r = 0; r < size; ++r)
    if (of[r] >= 0) links[r] = transports[of[r]]->connect(r);
  if (tcp && tcp->listener()) {
    auto conn = tcp->listener();
    engine.background = [conn] { return tcp_accept_step(*conn); };
  }
  // Some pair of the group shares memory, every pair does (the same answers on every rank).
  bool any_shm = false, every_shm = shm != nullptr;
  for (int a = 0; a < size; ++a)
    for (int b = 0; b < size; ++b)
      if (a != b) {
        any_shm = any_shm || (shm && pair_of[a][b] == 0);
        every_shm = every_shm && pair_of[a][b] == 0;
      }
  topo.single_copy = shm && shm->single_copy_all();

  std::vector<ShmControl*> ctl(size, nullptr);
  for (int r = 0; r < size; ++r)
    if (topo.segs[r].valid()) ctl[r] = topo.segs[r].control();
  engine.set_shm(topo.segs[rank].valid() ? topo.segs[rank].control() : nullptr, ctl);
  engine.set_links(std::move(links));

  topo.shm_all = every_shm;
  topo.single_copy = topo.single_copy && topo.shm_all;
  topo.topo = topo.shm_all ? Topo::shm : one_host ? Topo::one_host_tcp : any_shm ? Topo::hosts_shm : Topo::hosts;
  std::string summary;
  for (int r = 0; r < size; ++r) summary += " " + topo.transport[r];
  SHOAL_LOG(info, "group ready: rank %d of %d, transports:%s%s; %d ranks on this machine, %d CPU%s for them: %s",
            rank, size, summary.c_str(), topo.single_copy ? " (single-copy reads)" : "", topo.machine_ranks,
            topo.machine_cpus, topo.machine_cpus == 1 ? "" : "s",
            topo.machine_ranks > topo.machine_cpus ? "waiters hand their CPU over" : "waiters poll first");
  return topo;
}

}  // namespace shoal
