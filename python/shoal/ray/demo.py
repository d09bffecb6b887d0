"""shoal in Ray, end to end (the Ray part of ``make demo``):

    python -m shoal.ray.demo [--workers 4] [--epochs 10] [--world 8] [--size 8388608]

1. starts a local Ray (``ray.init``);
2. a 4-worker ``shoal.ray.WorkerGroup`` trains the digits MLP of ``python -m shoal.demo`` with
   DistributedDataParallel over torch.distributed on shoal;
3. a tensor (and a dict of them) passes from one actor to another by the Ray Direct Transport
   ``"shoal"``, checked on arrival, timed against Ray's object store;
4. the algorithm profile (``python -m shoal.ray.profile``): p2p, Ray's GLOO allreduce and shoal's
   ring/BDE/MST/automatic allreduce among ``--world`` actors, in one run.
"""

from __future__ import annotations

import argparse
import os
import time


def _train(epochs: int):
    """Runs in every worker of the group: DDP training, rank 0 prints the epochs."""
    import torch
    import torch.distributed as dist

    from shoal.demo import train
    from shoal.torch import is_shoal_group

    torch.set_num_threads(1)
    assert is_shoal_group(), "the worker group's process group is not shoal"
    return train(dist.get_rank(), dist.get_world_size(), epochs=epochs, verbose=True, label="shoal ")


def demo_worker_group(workers: int, epochs: int) -> None:
    from shoal.ray import WorkerGroup

    print(f"== WorkerGroup({workers}): DDP over shoal, MLP 64-128-128-10 on scikit-learn digits", flush=True)
    t0 = time.perf_counter()
    with WorkerGroup(workers, resources_per_worker={"CPU": 1}) as wg:
        print(f"   {len(wg)} actors, process group up in {time.perf_counter() - t0:.1f} s", flush=True)
        results = wg.execute(_train, epochs)
    r = results[0]
    print(f"   loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} in {epochs} epochs, "
          f"held-out accuracy {100 * r['accuracy']:.2f}%, {r['seconds']:.2f} s of training\n", flush=True)
    if not r["losses"][-1] < r["losses"][0] / 2:
        raise SystemExit("demo: the training did not converge")


def _actor_class():
    import ray
    import torch

    @ray.remote(num_cpus=1)
    class Peer:
        def __init__(self):
            import shoal  # noqa: F401  registers the collective backend and the transport

            self.t = None

        def make(self, n: int) -> float:
            self.t = torch.arange(n, dtype=torch.float32)
            return float(self.t.sum())

        @ray.method(tensor_transport="shoal")
        def give(self):
            return {"weights": self.t, "bias": [torch.ones(3), torch.zeros(2, 2, dtype=torch.int64)]}

        def give_objstore(self):
            return {"weights": self.t, "bias": [torch.ones(3), torch.zeros(2, 2, dtype=torch.int64)]}

        def take(self, d) -> float:
            assert d["bias"][0].tolist() == [1.0, 1.0, 1.0] and d["bias"][1].dtype == torch.int64
            return float(d["weights"].sum())

    return Peer


def demo_direct_transport(n: int = 16 << 20, repeat: int = 5) -> None:
    import ray
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    print(f"== Ray Direct Transport \"shoal\": a dict with a {n * 4 >> 20} MiB float32 tensor, actor to actor", flush=True)
    Peer = _actor_class()
    a, b = Peer.remote(), Peer.remote()
    try:
        want = ray.get(a.make.remote(n))
        create_collective_group([a, b], backend="shoal", name="shoal-demo-rdt")
        times = {}
        for how, give in (("shoal", a.give), ("object store", a.give_objstore)):
            got = ray.get(b.take.remote(give.remote()))  # warm-up, checked
            if got != want:
                raise SystemExit(f"demo: {how} delivered a tensor summing to {got}, not {want}")
            t0 = time.perf_counter()
            for _ in range(repeat):
                assert ray.get(b.take.remote(give.remote())) == want
            times[how] = (time.perf_counter() - t0) / repeat
        print(f"   arrived intact (sum {want:.6g}); per transfer: shoal {1e3 * times['shoal']:.1f} ms, "
              f"object store {1e3 * times['object store']:.1f} ms "
              f"({times['object store'] / times['shoal']:.1f}x)\n", flush=True)
        destroy_collective_group("shoal-demo-rdt")
    finally:
        for x in (a, b):
            ray.kill(x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.ray.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--world", type=int, default=8, help="actors of the profile")
    p.add_argument("--size", default="8388608", help="float32 elements of the profile's large allreduce")
    p.add_argument("--no-profile", action="store_true")
    a = p.parse_args(argv)

    import ray

    import shoal  # noqa: F401  registers the "shoal" backend and transport in this driver

    # Logical CPUs: the actors mostly wait on each other, and the groups (8 actors) must fit on
    # small machines; ray.init() alone would offer one per core.
    ray.init(num_cpus=max(os.cpu_count() or 1, a.world, a.workers) + 2, include_dashboard=False,
             logging_level="warning")
    try:
        demo_worker_group(a.workers, a.epochs)
        demo_direct_transport()
        if not a.no_profile:
            from . import profile

            print(f"== Algorithm profile: {a.world} actors, python -m shoal.ray.profile --world {a.world} "
                  f"--size {a.size}", flush=True)
            rc = profile.main(["--world", str(a.world), "--size", a.size])
            if rc:
                return rc
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
