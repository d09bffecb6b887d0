"""Times ray.util.collective's broadcast, barrier, allgather, reduce and allreduce on shoal inside W
Ray actors on this host: each op 2,000 times in a loop in every actor, three rounds. Prints µs per
op, the largest over the actors, one line per round (BENCHMARKS.md, "Ray's collectives ran as
async ops").

    .venv/bin/python scripts/ray_collective_ops.py W BYTES     e.g. 2 4096
"""
import sys, time, numpy as np, ray, ray.util.collective as col
ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
@ray.remote(num_cpus=0)
class A:
    def __init__(self):
        import shoal  # noqa
    def init(self, w, r): col.init_collective_group(w, r, backend="shoal", group_name="g")
    def run(self, n, iters):
        import torch
        t = torch.ones(n // 4); out = [torch.zeros(n // 4) for _ in range(W)]
        res = {}
        for name, f in (("broadcast", lambda: col.broadcast(t, 0, "g")),
                        ("barrier", lambda: col.barrier("g")),
                        ("allgather", lambda: col.allgather(out, t, "g")),
                        ("reduce", lambda: col.reduce(t, 0, "g")),
                        ("allreduce", lambda: col.allreduce(t, "g"))):
            for _ in range(50): f()
            col.barrier("g")
            t0 = time.perf_counter()
            for _ in range(iters): f()
            res[name] = (time.perf_counter() - t0) / iters * 1e6
        return res
W = int(sys.argv[1]); n = int(sys.argv[2])
acts = [A.remote() for _ in range(W)]
ray.get([a.init.remote(W, r) for r, a in enumerate(acts)])
for rnd in range(3):
    rs = ray.get([a.run.remote(n, 2000) for a in acts])
    print(" ".join(f"{k} {max(r[k] for r in rs):.1f}" for k in rs[0]), flush=True)
ray.shutdown()
