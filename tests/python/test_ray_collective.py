"""shoal as a ray.util.collective backend: every BaseGroup op checked against numpy.

Actors live for the module (one set per world size); each remote call runs a batch of cases so
that Ray's round trips do not dominate. Inputs are a pure function of (rank, case), so the driver
computes the expected result independently with numpy.
"""

import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
import ray.util.collective as col  # noqa: E402

# Actor classes defined here travel by value (the workers cannot import this test module).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLD_SIZES = [1, 3, 4, 8, 2]  # 2 last: the tests below use the group of 2
# Group names may hold any characters.
GROUP = "shoal tests/ü:1*?"
DTYPES = ["uint8", "float16", "float32", "float64", "int32", "int64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX"]
SIZES = [0, 1, 7, 1000, 1 << 20]


def make_input(rank: int, case: int, dtype: str, n: int, op: str = "SUM") -> np.ndarray:
    """Small values so that PRODUCT and uint8 SUM over 8 ranks stay exact."""
    rng = np.random.default_rng(1000 * case + rank)
    if op == "PRODUCT":
        v = rng.choice([1, 1, 1, 2], size=n) if dtype in ("uint8", "int32", "int64") else rng.uniform(0.9, 1.1, n)
    elif dtype == "uint8":
        v = rng.integers(0, 20, n)
    elif dtype in ("int32", "int64"):
        v = rng.integers(-1000, 1000, n)
    else:
        v = rng.uniform(-1, 1, n)
    return v.astype(dtype)


def reference(inputs, op: str) -> np.ndarray:
    stack = np.stack(inputs).astype(np.float64 if inputs[0].dtype.kind == "f" else np.int64)
    r = {"SUM": stack.sum(0), "PRODUCT": stack.prod(0), "MIN": stack.min(0), "MAX": stack.max(0)}[op]
    return r.astype(inputs[0].dtype)


def close(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    if dtype == "float16":
        return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=2e-2)
    if dtype in ("float32", "float64"):
        return np.allclose(got, want, rtol=1e-5, atol=1e-5)
    return np.array_equal(got, want)


@ray.remote(num_cpus=1)
class Rank:
    def __init__(self):
        import shoal  # noqa: F401  the one line an actor needs: registers the "shoal" backend

    def init(self, world, rank, name, backend="shoal"):
        col.init_collective_group(world, rank, backend=backend, group_name=name)
        return col.get_rank(name), col.get_collective_group_size(name)

    def destroy(self, name):
        col.destroy_collective_group(name)

    def transports(self, name):
        return col.get_group_handle(name).transports()

    def run(self, name, cases, use_torch=False):
        """Run each case's op on this rank's input and return the outputs."""
        import ray.util.collective.types as types

        g = col.get_group_handle(name)  # forms a driver-managed group on first use
        rank, world = g.rank, g.world_size
        conv = torch.from_numpy if use_torch else (lambda a: a)
        out = []
        for i, (kind, dtype, n, op) in enumerate(cases):
            x = conv(make_input(rank, i, dtype, n, op))
            rop = getattr(types.ReduceOp, op)
            if kind == "allreduce":
                col.allreduce(x, name, rop)
                out.append(np.asarray(x))
            elif kind == "reduce":
                root = i % world
                col.reduce(x, root, name, rop)
                out.append(np.asarray(x))
            elif kind == "broadcast":
                root = (i + 1) % world
                col.broadcast(x, root, name)
                out.append(np.asarray(x))
            elif kind == "allgather":
                outs = [conv(np.zeros(n, dtype)) for _ in range(world)]
                col.allgather(outs, x, name)
                out.append(np.stack([np.asarray(o) for o in outs]))
            elif kind == "reducescatter":
                ins = [conv(make_input(rank, 100 * i + r, dtype, n, op)) for r in range(world)]
                before = [np.array(t) for t in ins]
                y = conv(np.zeros(n, dtype))
                col.reducescatter(y, ins, name, rop)
                assert all(np.array_equal(np.asarray(a), b) for a, b in zip(ins, before)), "input modified"
                out.append(np.asarray(y))
            elif kind == "barrier":
                col.barrier(name)
                out.append(None)
            else:
                raise ValueError(kind)
        return out

    def sendrecv_ring(self, name, dtype, n):
        """Rank r sends to r+1 and receives from r-1 (even ranks send first)."""
        rank, world = col.get_rank(name), col.get_collective_group_size(name)
        x = make_input(rank, 7, dtype, n)
        y = np.zeros(n, dtype)
        dst, src = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            col.send(x, dst, name)
            col.recv(y, src, name)
        else:
            col.recv(y, src, name)
            col.send(x, dst, name)
        return y

    def call(self, fn, *args):
        return fn(*args)


def wait_in_allreduce(name: str, n: int):
    """In an actor: an allreduce of `n` floats on group `name` expected to fail; (its error, seconds)."""
    t0 = time.monotonic()
    try:
        col.allreduce(np.ones(n, np.float32), name)
        return "no error", 0.0
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}", time.monotonic() - t0


def regroup(rank: int, old: str, new: str, n: int):
    """In an actor: destroy group `old`, form the 2-rank group `new`, return an allreduce of `n` elements."""
    col.destroy_collective_group(old)
    col.init_collective_group(2, rank, backend="shoal", group_name=new)
    x = np.full(n, rank + 1.0, np.float32)
    col.allreduce(x, new)
    return x.tolist()


def expected(world, i, kind, dtype, n, op):
    ins = [make_input(r, i, dtype, n, op) for r in range(world)]
    if kind == "allreduce":
        return [reference(ins, op)] * world
    if kind == "reduce":
        root = i % world
        return [reference(ins, op) if r == root else ins[r] for r in range(world)]
    if kind == "broadcast":
        return [ins[(i + 1) % world]] * world
    if kind == "allgather":
        return [np.stack(ins)] * world
    if kind == "reducescatter":
        return [reference([make_input(s, 100 * i + r, dtype, n, op) for s in range(world)], op) for r in range(world)]
    return [None] * world


_pool: list = []  # up to 8 actors, kept for the module: starting an actor (it imports torch) is the slow part
_formed = [0]     # GROUP is formed among the first _formed[0] of them


def pool(ray_local, world):
    """The first `world` actors of the module's pool, with the group GROUP (worker-managed) formed
    among exactly them: a new world size destroys GROUP and forms it again, on the same actors."""
    if _formed[0] != world:
        ray.get([a.destroy.remote(GROUP) for a in _pool[:_formed[0]]])
        _formed[0] = 0
        _pool.extend(Rank.remote() for _ in range(world - len(_pool)))
        got = ray.get([a.init.remote(world, r, GROUP) for r, a in enumerate(_pool[:world])])
        assert got == [(r, world) for r in range(world)]
        _formed[0] = world
    return _pool[:world]


def spare(k):
    """k actors of the pool outside GROUP's 2 ranks (made if needed), for a test's own groups,
    each of which it names apart."""
    _pool.extend(Rank.remote() for _ in range(2 + k - len(_pool)))
    return _pool[2 : 2 + k]


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for a in _pool:
        ray.kill(a)
    _pool.clear()
    _formed[0] = 0


def check(actors, cases, use_torch=False):
    world = len(actors)
    results = ray.get([a.run.remote(GROUP, cases, use_torch) for a in actors])
    for i, case in enumerate(cases):
        want = expected(world, i, *case)
        for r in range(world):
            if case[0] == "barrier":
                continue
            assert results[r][i].dtype == np.dtype(case[1]), (case, r)
            assert close(results[r][i], want[r], case[1]), f"{case} rank {r}: {results[r][i][:8]} != {want[r][:8]}"


def check_allreduce(actors):
    sizes = SIZES if len(actors) <= 4 else [0, 1, 7, 1 << 20]
    cases = [("allreduce", d, n, op) for d in DTYPES for op in OPS for n in (sizes if op == "SUM" else [7, 1000])]
    check(actors, cases)


def check_every_op(actors):
    cases = []
    for kind in ["reduce", "broadcast", "allgather", "reducescatter", "barrier"]:
        for d in ["float32", "int64", "uint8", "float16"]:
            for n in [0, 1, 1001]:
                cases.append((kind, d, n, "MAX" if kind == "reducescatter" and d == "uint8" else "SUM"))
    cases.append(("reduce", "float64", 1 << 20, "MIN"))
    cases.append(("allgather", "float32", 1 << 18, "SUM"))
    check(actors, cases)


def check_torch_and_mixed(actors):
    world = len(actors)
    cases = [(k, "float32", 513, "SUM") for k in ["allreduce", "reduce", "broadcast", "allgather", "reducescatter"]]
    check(actors, cases, use_torch=True)
    # numpy on some ranks, torch on the others
    results = ray.get([a.run.remote(GROUP, cases, r % 2 == 0) for r, a in enumerate(actors)])
    for i, case in enumerate(cases):
        want = expected(world, i, *case)
        for r in range(world):
            assert close(results[r][i], want[r], "float32"), (case, r)


def check_send_recv(actors):
    world = len(actors)
    for dtype, n in [("float32", 1), ("int64", 1001), ("uint8", (1 << 20) + 3)]:
        got = ray.get([a.sendrecv_ring.remote(GROUP, dtype, n) for a in actors])
        for r in range(world):
            np.testing.assert_array_equal(got[r], make_input((r - 1) % world, 7, dtype, n))


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_ops_of_one_world_size(ray_local, world):
    """Every op at one world size (one test per size: starting the actors is the slow part)."""
    actors = pool(ray_local, world)
    check_allreduce(actors)
    check_every_op(actors)
    if world in (2, 3):
        check_torch_and_mixed(actors)
    if world > 1:
        check_send_recv(actors)
        # peers on one host are reached over shared memory
        for r in range(min(world, 2)):
            want = ["shm"] * world
            want[r] = "self"
            assert ray.get(actors[r].transports.remote(GROUP)) == want


def test_bad_input_is_refused_clearly(ray_local):
    """Each refusal names the problem on the refusing rank; the first one aborts the group, so a
    peer already waiting in the op fails at once naming it (not after the 300 s timeout); the
    group can then be made again."""
    actors = spare(2)
    ray.get([a.init.remote(2, r, "refusals") for r, a in enumerate(actors)])

    def bad_calls():
        errors = []
        for fn in [
            lambda: col.allreduce([1, 2, 3], "refusals"),  # not a tensor
            lambda: col.broadcast(np.zeros(3, np.float32), 5, "refusals"),  # invalid rank
            lambda: col.allgather([np.zeros(3, np.float32)], np.zeros(3, np.float32), "refusals"),  # list too short
            lambda: col.allreduce(np.zeros(3, np.float32).view(np.dtype(">f4")), "refusals"),  # byte order
            lambda: col.allreduce(np.frombuffer(b"\0" * 12, np.float32), "refusals"),  # memory of a bytes object
            # ... also seen through a memoryview of an array over it
            lambda: col.allreduce(np.frombuffer(memoryview(np.frombuffer(bytes(12), np.float32)), np.float32),
                                  "refusals"),
        ]:
            try:
                fn()
                errors.append(None)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {e}")
        return errors

    waiting = actors[1].call.remote(wait_in_allreduce, "refusals", 3)
    time.sleep(1.0)
    errors = ray.get(actors[0].call.remote(bad_calls))
    assert all(e is not None for e in errors), errors
    assert "ndarray" in errors[0] and "rank" in errors[1] and "byte order" in errors[3], errors
    assert "cannot be written" in errors[4] and "cannot be written" in errors[5], errors
    msg, secs = ray.get(waiting, timeout=60)
    assert "rank 0 refused the arguments of its" in msg, msg
    assert "refusals" in msg, msg  # the Ray group, by name
    assert secs < 1.0 + 10, (msg, secs)

    got = ray.get([a.call.remote(regroup, r, "refusals", "refusals", 5) for r, a in enumerate(actors)], timeout=120)
    assert got == [[3.0] * 5] * 2


def test_read_only_numpy_arrays(ray_local):
    """Ray hands numpy arguments to actors read-only (the pattern of Ray's own collective tests:
    an actor keeps an array it was given and runs collectives on it). Inputs are read as they are;
    outputs get the result written into them, as on Ray's GLOO backend, with one warning per process."""
    actors = pool(ray_local, 2)
    n = 1 << 16  # past Ray's inline limit: these arrays live in the object store

    def run(given):
        import warnings

        import shoal.ray.group as grp

        grp._warned_read_only = False
        g = col.get_group_handle(GROUP)
        r, w = g.rank, g.world_size

        def ro(a):
            a.setflags(write=False)
            return a

        out = {"given_writeable": bool(given.flags.writeable)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            col.allreduce(given, GROUP)  # read-only output, from Ray
            out["allreduce"] = given.copy()
            x = ro(np.full(7, r + 1.0, np.float32))
            col.reduce(x, 1, GROUP)  # rank 0: an input only; rank 1: the result
            out["reduce"] = x.copy()
            b = ro(np.full(5, 10.0 * (r + 1), np.float32))
            col.broadcast(b, 0, GROUP)  # the root only reads
            out["broadcast"] = b.copy()
            outs = [ro(np.zeros(3, np.int64)) for _ in range(w)]
            col.allgather(outs, ro(np.full(3, r + 5, np.int64)), GROUP)
            out["allgather"] = np.stack(outs)
            ins = [ro(np.full(4, float(10 * r + k), np.float64)) for k in range(w)]
            y = ro(np.zeros(4, np.float64))
            col.reducescatter(y, ins, GROUP)
            out["reducescatter"] = (y.copy(), [i.copy() for i in ins])
            if r == 0:
                col.send(ro(np.arange(6, dtype=np.int32)), 1, GROUP)
            else:
                z = ro(np.zeros(6, np.int32))
                col.recv(z, 0, GROUP)
                out["recv"] = z.copy()
        out["warnings"] = [str(c.message) for c in caught if "read-only" in str(c.message)]
        return out

    given = np.full(n, 0.25, np.float32)
    got = ray.get([a.call.remote(run, given) for a in actors], timeout=120)
    for r, g in enumerate(got):
        assert g["given_writeable"] is False  # what Ray does, and what this test is about
        np.testing.assert_array_equal(g["allreduce"], np.full(n, 0.5, np.float32))
        np.testing.assert_array_equal(g["reduce"], np.full(7, 3.0 if r == 1 else r + 1.0, np.float32))
        np.testing.assert_array_equal(g["broadcast"], np.full(5, 10.0, np.float32))
        np.testing.assert_array_equal(g["allgather"], np.array([[5] * 3, [6] * 3], np.int64))
        y, ins = g["reducescatter"]
        np.testing.assert_array_equal(y, np.full(4, float(r + (10 + r)), np.float64))
        for k, i in enumerate(ins):  # the inputs stay as they were
            np.testing.assert_array_equal(i, np.full(4, float(10 * r + k), np.float64))
        if r == 1:
            np.testing.assert_array_equal(g["recv"], np.arange(6, dtype=np.int32))
        # once per process, at the first read-only output
        assert len(g["warnings"]) == 1 and "GLOO" in g["warnings"][0], g["warnings"]
    np.testing.assert_array_equal(given, np.full(n, 0.25, np.float32))  # the driver's copy


def test_mismatched_calls_fail_on_every_rank(ray_local):
    """Different sizes on two ranks: an error on both, never a wrong result or a hang."""
    actors = spare(2)
    ray.get([a.init.remote(2, r, "mismatch") for r, a in enumerate(actors)])

    def mismatched(n):
        try:
            col.allreduce(np.ones(n, np.float32), "mismatch")
            return "no error"
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"

    got = ray.get([a.call.remote(mismatched, n) for a, n in zip(actors, [10, 12])], timeout=120)
    assert all(g != "no error" for g in got), got


def test_several_groups_destroy_and_create_again(ray_local):
    actors = spare(3)
    # two groups in the same actors, different rank orders
    ray.get([a.init.remote(3, r, "first") for r, a in enumerate(actors)])
    ray.get([a.init.remote(3, 2 - r, "second") for r, a in enumerate(actors)])
    for name, ranks in [("first", [0, 1, 2]), ("second", [2, 1, 0])]:
        got = ray.get([a.run.remote(name, [("broadcast", "int32", 5, "SUM")]) for a in actors])
        want = make_input(1, 0, "int32", 5)  # root of case 0 is rank 1
        for g in got:
            np.testing.assert_array_equal(g[0], want)
    ray.get([a.destroy.remote("first") for a in actors])
    # a destroyed group refuses clearly; the other keeps working
    with pytest.raises(ray.exceptions.RayTaskError, match="not initialized"):
        ray.get(actors[0].run.remote("first", [("allreduce", "float32", 5, "SUM")]))
    ray.get([a.init.remote(3, r, "first") for r, a in enumerate(actors)])  # and again
    for name in ["first", "second"]:
        got = ray.get([a.run.remote(name, [("allreduce", "float32", 1000, "SUM")]) for a in actors])
        ranks = [0, 1, 2] if name == "first" else [2, 1, 0]
        want = reference([make_input(r, 0, "float32", 1000) for r in ranks], "SUM")
        for g in got:
            assert close(g[0], want, "float32")


def test_driver_managed_group(ray_local):
    """create_collective_group in the driver; the group forms on the first collective."""
    actors = spare(3)
    col.create_collective_group(actors, 3, [2, 0, 1], backend="shoal", group_name="driver managed")
    got = ray.get([a.run.remote("driver managed", [("allreduce", "int64", 33, "SUM")]) for a in actors])
    want = reference([make_input(r, 0, "int64", 33) for r in range(3)], "SUM")
    for g in got:
        np.testing.assert_array_equal(g[0], want)
    ray.kill(ray.get_actor("info_driver managed"))


def test_torch_only_dtypes_and_strided_inputs(ray_local):
    """bfloat16/int8/bool tensors, and non-contiguous arrays (results land in the caller's view)."""
    actors = pool(ray_local, 2)

    def run():
        g = col.get_group_handle(GROUP)
        r = g.rank
        out = {}
        for name, t, op in [
            ("bfloat16", torch.full((9,), 0.5 * (r + 1), dtype=torch.bfloat16), "SUM"),
            ("int8", torch.arange(9, dtype=torch.int8) * (r + 1), "MAX"),
            ("bool", torch.tensor([r == 0, r == 1, True, False]), "MAX"),
        ]:
            col.allreduce(t, GROUP, getattr(col.types.ReduceOp, op))
            out[name] = t.float().tolist()
        base = np.zeros((4, 6), np.float32)
        view = base[:, ::2]  # strided
        view[...] = r + 1
        col.allreduce(view, GROUP)
        out["strided"] = base.tolist()
        return out

    got = ray.get([a.call.remote(run) for a in actors])
    for g in got:
        assert g["bfloat16"] == [1.5] * 9
        assert g["int8"] == [2.0 * i for i in range(9)]
        assert g["bool"] == [1.0, 1.0, 1.0, 0.0]
        want = np.zeros((4, 6), np.float32)
        want[:, ::2] = 3
        assert g["strided"] == want.tolist()  # the skipped columns stay 0


def test_killed_actor_fails_the_others_then_survivors_regroup(ray_local):
    """An actor of the group is killed while the others wait in an allreduce: they raise within
    seconds, naming its rank; then they destroy the group and form a new one that works."""
    actors = [Rank.remote() for _ in range(3)]
    ray.get([a.init.remote(3, r, "doomed") for r, a in enumerate(actors)])

    pending = [a.call.remote(wait_in_allreduce, "doomed", 1 << 16) for a in actors[:2]]
    time.sleep(1.0)
    ray.kill(actors[2])
    got = ray.get(pending, timeout=60)
    for msg, secs in got:
        assert msg != "no error"
        assert "rank 2" in msg, msg
        assert secs < 1.0 + 10, (msg, secs)

    got = ray.get([a.call.remote(regroup, r, "doomed", "doomed, again", 7) for r, a in enumerate(actors[:2])],
                  timeout=120)
    assert got == [[3.0] * 7] * 2
    for a in actors[:2]:
        ray.kill(a)
