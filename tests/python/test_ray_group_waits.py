"""The Ray group waits for each op's Work at once, so it must say so to shoal's backend: torch's
options objects default to asyncOp True, and the backend starts an async op on the group's progress
thread at once, a hand-off per call that made Ray's small broadcasts 2-3x slower (BENCHMARKS.md,
"Ray's collectives ran as async ops"); with asyncOp False the backend runs the op on the caller's
thread before the call returns. A wait with a timeout cannot run the op on its thread (it could not
stop at its deadline), so such a call must be an async op: with asyncOp False the timeout would not
bound it. Every collective of ShoalGroup is called here on a backend that records the options it is
given. (The group is made without its constructor: no Ray cluster, no store; the methods under test
only need the backend.)"""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("ray")
torch = pytest.importorskip("torch")
import ray.util.collective.types as types  # noqa: E402
from ray.util.collective.collective_group.base_collective_group import BaseGroup  # noqa: E402

from shoal.ray.group import ShoalGroup  # noqa: E402


class _Work:
    def wait(self, timeout=None):
        return True


class _Backend:
    """Records (op, options) for each call; every op completes at once without touching data."""

    def __init__(self):
        self.calls = []

    def _record(self, op, opts):
        self.calls.append((op, opts))
        return _Work()

    def abort_because(self, why):
        raise AssertionError(f"the group refused its arguments: {why}")

    def allreduce_inline(self, tensor, op):
        return False  # as for a tensor the blocking call does not take: the Work path runs

    def allreduce(self, tensors, opts):
        return self._record("allreduce", opts)

    def barrier(self, opts):
        return self._record("barrier", opts)

    def reduce(self, tensors, opts):
        return self._record("reduce", opts)

    def allgather(self, outputs, inputs, opts=None):
        return self._record("allgather", opts)

    def broadcast(self, tensors, opts):
        return self._record("broadcast", opts)

    def reduce_scatter(self, outputs, inputs, opts):
        return self._record("reduce_scatter", opts)


def _group(world=2, rank=0):
    g = object.__new__(ShoalGroup)
    BaseGroup.__init__(g, world, rank, "waits")
    g._timeout_s = 10.0
    g._store = None
    g._backend = _Backend()
    return g


@pytest.mark.parametrize("timeout_ms", [None, datetime.timedelta(seconds=5)])
def test_every_collective_runs_on_the_caller_unless_its_wait_is_bounded(timeout_ms):
    g = _group()
    t = torch.ones(16)

    def with_timeout(opts):
        if timeout_ms is not None:
            opts.timeout_ms = timeout_ms
        return opts

    # ray.util.collective passes one tensor as a one-element list, and a list of them as a list
    # holding one list.
    g.allreduce([t], with_timeout(types.AllReduceOptions()))
    g.barrier(with_timeout(types.BarrierOptions()))
    reduce_opts = with_timeout(types.ReduceOptions())
    reduce_opts.root_rank = 0
    g.reduce([t], reduce_opts)
    g.allgather([[torch.zeros(16), torch.zeros(16)]], [t], with_timeout(types.AllGatherOptions()))
    bcast_opts = with_timeout(types.BroadcastOptions())
    bcast_opts.root_rank = 1
    g.broadcast([t], bcast_opts)
    g.reducescatter([torch.zeros(16)], [[torch.ones(16), torch.ones(16)]], with_timeout(types.ReduceScatterOptions()))

    ops = [op for op, _ in g._backend.calls]
    assert ops == ["allreduce", "barrier", "reduce", "allgather", "broadcast", "reduce_scatter"], ops
    for op, opts in g._backend.calls:
        assert opts is not None, f"{op}: no options given, so torch's default (asyncOp True) applies"
        if timeout_ms is None:
            assert opts.asyncOp is False, f"{op}: asyncOp True: the backend would start it on its progress thread"
        else:
            assert opts.asyncOp is True, f"{op}: asyncOp False: the backend would run it to the end, past the timeout"
