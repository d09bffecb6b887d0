// Hierarchical collectives for groups spanning hosts (Algo::hier): the bytes move inside each host
// over shared memory, and only one host's worth crosses the network, between one rank per host.
// Each step is a flat algorithm run on a subgroup (Ctx's subgroup constructor): a host's ranks
// (Topo::one_host_tcp: point-to-point shm links, where every byte costs the same CPUs) or one rank
// per host (Topo::hosts), each picking its own algorithm automatically.
//
// h hosts, l ranks on the largest, n bytes; α_s β_s for shared memory, α_t β_t for the network;
// C_op(p, n) is the cost of the flat algorithm the subgroup picks.
//
// Allreduce, leader form (any layout; small messages): reduce to a leader inside each host, allreduce
// among the leaders, broadcast inside each host.
//   C_reduce(l, n)[shm] + C_allreduce(h, n)[net] + C_bcast(l, n)[shm]
// against the flat ring's 2·(p-1)/p·n·β_t on every rank's network share: the network carries each
// host's vector once (2·(h-1)/h·n per leader) instead of the ring's full share from every host.
// Allreduce, split form (every host the same number of ranks l, from the switch
// hier.allreduce.split_from: cost.h): ring reduce-scatter inside each host, so local rank i holds
// block i (n/l) reduced over its host; the l ranks with the same local index allreduce their block
// across hosts (l smaller allreduces side by side, over l network connections per host pair); ring
// allgather inside each host.
//   2·(l-1)/l·n·β_s + (l-1)/l·n·γ + C_allreduce(h, n/l)[net] + 2(l-1)·α_s
// No rank handles more than its 1/l share on the network and no leader is a bottleneck.
// Broadcast: the root's host is led by the root; one tree, pipelined end to end in kChunkBytes
// messages: a binomial tree over the leaders, and a binomial tree inside each host below its
// leader:  (⌈lg h⌉ + ⌈lg l⌉ + n/kChunkBytes - 1)·(α + kChunkBytes·β) at the deepest rank, the
// root's network link carrying ⌈lg h⌉·n. From hier.broadcast.chain_from a chain through the
// root's host, then host by host: (p - 2 + n/kChunkBytes)·(α + kChunkBytes·β); every rank sends n
// once and only h - 1 links cross hosts (bandwidth-optimal; the flat chain crosses hosts at every
// link of an interleaved layout).
// Reduce: reduce inside each host to its leader (the root on its host), then across the leaders to
// the root:  C_reduce(l, n)[shm] + C_reduce(h, n)[net].
// Allgather(v), leader form (below hier.allgather.ring_from in total): each host's blocks are
// gathered by its leader, the leaders allgather whole hosts' blocks (straight in the output when
// every host's ranks are consecutive, else packed in scratch by host), and each leader broadcasts
// the full result inside its host:  (l-1)·α_s + n_host·β_s + C_allgather(h, n)[net] + C_bcast(l, n)[shm].
// From hier.allgather.ring_from: the ring allgather with ring positions host by host, so that
// only h of its links cross hosts: (p-1)·α + (p-1)/p·n·β, no rank handling more than its share
// (the leader form's leaders handle all of their host's traffic, a bottleneck for large n).
//
// Except for broadcast, the stages run one after the other (a host's stage starts once the network
// stage is done); the flat algorithms inside each stage are pipelined as usual.
#include "algo/common.h"
#include "algo/cost.h"
#include "shoal/error.h"

namespace shoal::algo {
namespace {

// Whether an op of `bytes` is past `s`, where it changes form (the group's tuning).
bool from(const Ctx& c, Switch s, size_t bytes) { return bytes >= c.ways().switch_at(s, c.size); }

const HostMap& hosts_of(const Ctx& c) {
  if (!c.hosts()) throw Error(std::string(c.what) + ": internal error: no host layout for a hierarchical algorithm");
  return *c.hosts();
}

struct Layout {
  std::vector<int> local;    // this host's ranks, its leader first
  std::vector<int> leaders;  // one rank per host, by host index (so host h is rank h among them)
  bool leader = false;
};

// Each host's leader is its lowest rank, except that the root (root >= 0) leads its own host.
Layout layout(const Ctx& c, int root) {
  const HostMap& m = hosts_of(c);
  Layout l;
  for (size_t h = 0; h < m.ranks.size(); ++h)
    l.leaders.push_back(root >= 0 && m.host_of[root] == static_cast<int>(h) ? root : m.ranks[h][0]);
  const int host = m.host_of[c.rank], lead = l.leaders[host];
  l.local.push_back(lead);
  for (int r : m.ranks[host])
    if (r != lead) l.local.push_back(r);
  l.leader = lead == c.rank;
  return l;
}

void allreduce_split(Ctx& c, const HostMap& m, const void* in, void* out, size_t count) {
  const int host = m.host_of[c.rank];
  const std::vector<int>& mine = m.ranks[host];
  Ctx local(c, mine, Topo::one_host_tcp);
  const int l = local.size, li = local.rank;
  Blocks b = even_blocks(count, l, c.esize);
  ring_reduce_scatter(local, u8(in), u8(out), nullptr, b);
  std::vector<int> peers;  // the rank with local index li on every host
  for (auto& h : m.ranks) peers.push_back(h[li]);
  {
    Ctx across(c, peers, Topo::hosts);
    uint8_t* blk = u8(out) + b.off[li];
    allreduce(across, Algo::automatic, blk, blk, b.len[li] / c.esize);
  }
  ring_allgather(local, u8(out), b, li, mod(li - 1, l), mod(li + 1, l));
  local.wait_all();
}

// Every rank, host by host from the host of `first` (that rank first, then the rest of its host in
// rank order; then the next hosts, each in rank order): a ring or chain in this order crosses
// between hosts only h times (h - 1 for a chain).
std::vector<int> host_order(const HostMap& m, int first) {
  const int hosts = static_cast<int>(m.ranks.size()), h0 = m.host_of[first];
  std::vector<int> order{first};
  for (int r : m.ranks[h0])
    if (r != first) order.push_back(r);
  for (int k = 1; k < hosts; ++k)
    for (int r : m.ranks[mod(h0 + k, hosts)]) order.push_back(r);
  return order;
}

int position(const std::vector<int>& order, int rank) {
  return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
}

// Whether every host's ranks are consecutive (hosts are numbered by their lowest rank, so then
// host h's blocks form one range of the output, in host order).
bool consecutive(const HostMap& m) {
  for (size_t r = 1; r < m.host_of.size(); ++r)
    if (m.host_of[r] < m.host_of[r - 1]) return false;
  return true;
}

}  // namespace

void allreduce_hier(Ctx& c, const void* in, void* out, size_t count) {
  const HostMap& m = hosts_of(c);
  if (m.uniform() && m.ranks[0].size() > 1 && from(c, Switch::hier_allreduce_split_from, count * c.esize) && count >= m.ranks[0].size())
    return allreduce_split(c, m, in, out, count);
  Layout l = layout(c, -1);
  Ctx local(c, l.local, Topo::one_host_tcp);
  reduce(local, Algo::automatic, in, out, count, 0);
  if (l.leader) {
    Ctx across(c, l.leaders, Topo::hosts);
    allreduce(across, Algo::automatic, out, out, count);
  }
  broadcast(local, Algo::automatic, out, count, 0);
}

void broadcast_hier(Ctx& c, void* buf, size_t count, int root) {
  const HostMap& m = hosts_of(c);
  const size_t n = count * c.esize;
  if (from(c, Switch::hier_broadcast_chain_from, n)) {  // the chain: root, its host, then host by host
    const std::vector<int> order = host_order(m, root);
    const int v = position(order, c.rank), p = c.size;
    std::vector<int> next;
    if (v + 1 < p) next.push_back(order[v + 1]);
    return tree_bcast(c, u8(buf), n, v == 0 ? -1 : order[v - 1], next);
  }
  // One tree, pipelined end to end: a binomial tree over the leaders (relative to the root's
  // host), and below each leader a binomial tree over its host's ranks.
  Layout l = layout(c, root);
  const int hosts = static_cast<int>(l.leaders.size()), hr = m.host_of[root], me = m.host_of[c.rank];
  int parent = -1, par;
  std::vector<int> children, ch;  // cross-host children first: they head the larger subtrees
  if (l.leader) {
    binomial_tree(mod(me - hr, hosts), hosts, par, ch);
    if (par >= 0) parent = l.leaders[mod(par + hr, hosts)];
    for (int v : ch) children.push_back(l.leaders[mod(v + hr, hosts)]);
    ch.clear();
  }
  binomial_tree(position(l.local, c.rank), static_cast<int>(l.local.size()), par, ch);
  if (par >= 0) parent = l.local[par];
  for (int v : ch) children.push_back(l.local[v]);
  tree_bcast(c, u8(buf), n, parent, children);
}

void reduce_hier(Ctx& c, const void* in, void* out, size_t count, int root) {
  const HostMap& m = hosts_of(c);
  Layout l = layout(c, root);
  // The leaders' partials: the root's in its output, the other leaders' in scratch.
  void* acc = c.rank == root ? out : l.leader ? c.scratch(std::max<size_t>(count * c.esize, 1), 2) : nullptr;
  {
    Ctx local(c, l.local, Topo::one_host_tcp);
    reduce(local, Algo::automatic, in, acc, count, 0);
  }
  if (l.leader) {
    Ctx across(c, l.leaders, Topo::hosts);
    reduce(across, Algo::automatic, acc, acc, count, m.host_of[root]);
  }
}

void allgatherv_hier(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts) {
  const HostMap& m = hosts_of(c);
  const Blocks b = counted_blocks(counts, c.esize);
  uint8_t* o = u8(out);
  if (from(c, Switch::hier_allgather_ring_from, b.total())) {  // the ring, host by host
    const std::vector<int> order = host_order(m, 0);
    const int p = c.size, v = position(order, c.rank);
    // Ring position k holds rank order[k]'s block, at that rank's place in the output.
    Blocks byPos;
    byPos.off.resize(p + 1);
    byPos.len.resize(p);
    for (int k = 0; k < p; ++k) {
      byPos.off[k] = b.off[order[k]];
      byPos.len[k] = b.len[order[k]];
    }
    byPos.off[p] = b.total();
    copy_bytes(o + b.off[c.rank], in, b.len[c.rank]);
    return ring_allgather(c, o, byPos, v, order[mod(v - 1, p)], order[mod(v + 1, p)]);
  }
  Layout l = layout(c, -1);
  Ctx local(c, l.local, Topo::one_host_tcp);
  // 1. The leader gathers its host's blocks, each at its place in the output.
  if (l.leader) {
    copy_bytes(o + b.off[c.rank], in, b.len[c.rank]);
    std::vector<Request*> recvs;
    for (int i = 1; i < local.size; ++i) post_recv_chunks(local, i, o + b.off[l.local[i]], b.len[l.local[i]], recvs);
    local.wait(recvs);
  } else {
    send_chunks(local, 0, in, b.len[c.rank]);
  }
  // 2. The leaders exchange whole hosts' blocks.
  if (l.leader) {
    const int hosts = static_cast<int>(m.ranks.size()), host = m.host_of[c.rank];
    std::vector<size_t> host_counts(hosts, 0);
    for (int r = 0; r < c.size; ++r) host_counts[m.host_of[r]] += counts[r];
    Ctx across(c, l.leaders, Topo::hosts);
    if (consecutive(m)) {
      uint8_t* own = o + b.off[m.ranks[host][0]];
      allgatherv(across, Algo::automatic, own, o, host_counts);
    } else {
      const Blocks hb = counted_blocks(host_counts, c.esize);
      uint8_t* packed = c.scratch(std::max<size_t>(b.total(), 1), 2);
      size_t pos = hb.off[host];
      for (int r : m.ranks[host]) {
        copy_bytes(packed + pos, o + b.off[r], b.len[r]);
        pos += b.len[r];
      }
      allgatherv(across, Algo::automatic, packed + hb.off[host], packed, host_counts);
      for (int h = 0; h < hosts; ++h) {
        if (h == host) continue;
        pos = hb.off[h];
        for (int r : m.ranks[h]) {
          copy_bytes(o + b.off[r], packed + pos, b.len[r]);
          pos += b.len[r];
        }
      }
    }
  }
  // 3. Each leader hands the whole result to its host.
  broadcast(local, Algo::automatic, out, b.total() / c.esize, 0);
}

}  // namespace shoal::algo
