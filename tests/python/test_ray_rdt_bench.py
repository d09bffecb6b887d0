"""python -m shoal.ray.rdt_bench on the session's local Ray: every transport moves the right
tensor, the floor rows (shoal.ray.rdt_floor) run only for small tensors, the JSON is well formed;
and the floor transports' metadata round trip gives back the producer's tensors."""

import json

import pytest

pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from shoal.ray import rdt_bench, rdt_floor  # noqa: E402


@pytest.mark.parametrize("cls", [rdt_floor.NoDataTwoSided, rdt_floor.NoDataOneSided])
def test_floor_round_trip(cls):
    tensors = [torch.arange(7, dtype=torch.float32).view(7, 1), torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
               torch.empty(0, 3, dtype=torch.int64), torch.tensor([True, False, True]),
               torch.arange(12, dtype=torch.int32).view(3, 4).t()]  # not contiguous
    t = cls()
    meta = t.extract_tensor_transport_metadata("obj", tensors)
    got = t.recv_multiple_tensors("obj", meta, t.get_communicator_metadata(None, None))
    assert len(got) == len(tensors)
    for a, b in zip(got, tensors):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    assert cls.is_one_sided() == (cls is rdt_floor.NoDataOneSided)


def test_rdt_bench_small(ray_local, tmp_path, capsys):
    big = rdt_floor.MAX_BYTES // 4 + 1  # one element past the floor rows' limit
    out = tmp_path / "rdt.json"
    rc = rdt_bench.main(["--sizes", f"1,7,{big}", "--min-time", "0.05", "--min-iters", "2",
                         "--max-iters", "5", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    rows = {r["elements"]: r for r in doc["rows"]}
    assert sorted(rows) == [1, 7, big]
    for n, r in rows.items():
        expect = rdt_bench.TRANSPORTS + (rdt_bench.FLOORS if 4 * n <= rdt_floor.MAX_BYTES else [])
        assert sorted(t for t in r if isinstance(r[t], dict)) == sorted(expect), n
        for t in expect:
            assert r[t]["iters"] >= 2 and r[t]["per_s"] > 0
        assert r["shoal/objstore"] == pytest.approx(r["shoal"]["per_s"] / r["objstore"]["per_s"])
    table = capsys.readouterr().out
    assert "nodata1/s" in table and " -" in table  # the big row has no floor figures


def test_rdt_bench_rejects_unknown_transport(ray_local):
    with pytest.raises(SystemExit):
        rdt_bench.main(["--transports", "shoal,carrier-pigeon"])
