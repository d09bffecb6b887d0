"""The floor for data-movement collectives over loopback TCP: the op's bytes, moved by plain sockets.

    .venv/bin/python scripts/tcp_floor.py [--ranks 4] [--sizes 16M,64M] [--ops broadcast,gather,allgather,alltoall]
        [--iters 5]

Starts --ranks processes on this host, one TCP connection per pair over 127.0.0.1 (default socket
buffers, TCP_NODELAY), and per op and size moves exactly the bytes the op must move, in the
simplest pattern, with one sender and one receiver thread per peer (blocking sendall/recv_into,
which release the GIL: the time is the kernel's). SIZE is the nccl-tests size, as in shoal-bench:
the buffer of broadcast, the total of all ranks' blocks for gather/allgather/alltoall.

    broadcast  rank 0 sends SIZE to every other rank (flat; Gloo uses a binomial tree)
    gather     every other rank sends its block (SIZE/ranks) to rank 0
    allgather  every rank sends its block to every other rank
    alltoall   every rank sends block j to rank j

No library code runs between the kernel's copies, so no library moving the same bytes over TCP
on this host can do much better. Per size: the mean time over --iters back-to-back iterations
(between two barriers), the largest over ranks, as shoal-bench reports; compare with
`build/shoal-bench OP -n 4 -b 16M -e 64M -f 4 --transport tcp --vs gloo` run just before or after.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import threading
import time

OPS = ["broadcast", "gather", "allgather", "alltoall"]


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed")
        view = view[n:]


def connect_all(rank: int, world: int, base_port: int) -> dict:
    """One connection per pair: the lower rank listens, the higher connects."""
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", base_port + rank))
    lst.listen(world)
    peers = {}
    for j in range(rank):
        for _ in range(200):
            try:
                s = socket.create_connection(("127.0.0.1", base_port + j))
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        s.sendall(rank.to_bytes(4, "little"))
        peers[j] = s
    for _ in range(world - 1 - rank):
        s, _addr = lst.accept()
        j = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "little")
        peers[j] = s
    lst.close()
    for s in peers.values():
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return peers


def barrier(rank: int, peers: dict) -> None:
    """Everyone tells rank 0, rank 0 tells everyone."""
    one = bytearray(1)
    if rank == 0:
        for s in peers.values():
            recv_exact(s, memoryview(one))
        for s in peers.values():
            s.sendall(b"\0")
    else:
        peers[0].sendall(b"\0")
        recv_exact(peers[0], memoryview(one))


def plan(op: str, rank: int, world: int, size: int):
    """(peer, bytes) lists to send and to receive in one iteration of `op`."""
    block = size // world
    others = [j for j in range(world) if j != rank]
    if op == "broadcast":
        return ([(j, size) for j in others], []) if rank == 0 else ([], [(0, size)])
    if op == "gather":
        return ([], [(j, block) for j in others]) if rank == 0 else ([(0, block)], [])
    if op in ("allgather", "alltoall"):
        return [(j, block) for j in others], [(j, block) for j in others]
    raise ValueError(op)


def run_rank(rank: int, world: int, base_port: int, ops, sizes, iters: int, out) -> None:
    peers = connect_all(rank, world, base_port)
    buf = bytearray(max(sizes))
    results = {}
    for op in ops:
        for size in sizes:
            sends, recvs = plan(op, rank, world, size)

            def iteration():
                threads = [threading.Thread(target=peers[j].sendall, args=(memoryview(buf)[:n],)) for j, n in sends]
                threads += [threading.Thread(target=recv_exact, args=(peers[j], memoryview(buf)[:n])) for j, n in recvs]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

            iteration()  # warm-up
            barrier(rank, peers)
            t0 = time.perf_counter()
            for _ in range(iters):
                iteration()
            barrier(rank, peers)
            results[(op, size)] = (time.perf_counter() - t0) / iters
    out.put((rank, results))


def main() -> None:
    from shoal.bench import parse_size  # here, not at the top: the spawned ranks need none of shoal

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="16M,64M")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--port", type=int, default=29731)
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    ops = [o for o in a.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            p.error(f"unknown op {o!r}; choose from {OPS}")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(r, a.ranks, a.port, ops, sizes, a.iters, q)) for r in range(a.ranks)]
    for pr in procs:
        pr.start()
    per_rank = dict(q.get(timeout=600) for _ in procs)
    for pr in procs:
        pr.join()
    print(f"# TCP floor: plain sockets over loopback, {a.ranks} ranks, {a.iters} iterations per size; "
          "time = mean per iteration, the largest over ranks")
    print(f"# {'op':<10} {'size (B)':>12} {'time (us)':>12}")
    for op in ops:
        for size in sizes:
            t = max(per_rank[r][(op, size)] for r in per_rank)
            print(f"  {op:<10} {size:>12} {t * 1e6:>12.1f}")


if __name__ == "__main__":
    main()
