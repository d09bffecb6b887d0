"""Ray Train on shoal: TorchTrainer(..., torch_config=TorchConfig(backend="shoal")) trains the
digits MLP of shoal.demo with DDP. Ray Train's workers never import shoal before
init_process_group("shoal"): the backend is there through torch's backend autoload (the entry
point "torch.backends" -> _shoal_autoload:load)."""

from __future__ import annotations

import json
import os
import sys

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train")
pytest.importorskip("sklearn")

# The workers cannot import this test module: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORKERS = 2
EPOCHS = 8


def _train_loop(config):
    import torch
    import torch.distributed as dist

    import ray.train
    import shoal.torch
    from shoal.demo import train

    ctx = ray.train.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    res = train(rank, size, epochs=config["epochs"])
    on_shoal = torch.tensor([1.0 if shoal.torch.is_shoal_group() else 0.0])
    dist.all_reduce(on_shoal)
    res.update(rank=rank, size=size, backend=dist.get_backend(), shoal_ranks=on_shoal.item(),
               params=res["params"].tolist())
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    ray.train.report({"loss": res["losses"][-1], "accuracy": res["accuracy"]})


def test_import_torch_registers_shoal():
    """The entry point alone: a fresh `import torch` knows "shoal", without importing Ray."""
    import subprocess

    code = "import sys, torch, torch.distributed as dist; print('SHOAL' in dist.Backend._plugins, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_torch_trainer_on_shoal(ray_local, tmp_path, monkeypatch):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Less of Ray Train's own machinery on this small machine (it passes RAY_TRAIN_* variables set in
    # the driver on to its controller): no preemption-watcher actor, no metrics, a faster poll.
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    monkeypatch.setenv("RAY_TRAIN_METRICS_ENABLED", "0")
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    out = tmp_path / "out"
    out.mkdir()
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"epochs": EPOCHS, "out": str(out)},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        torch_config=TorchConfig(backend="shoal", timeout_s=120),
        run_config=RunConfig(storage_path=str(tmp_path / "storage"), name="shoal_ddp"),
    )
    result = trainer.fit()
    assert result.error is None
    res = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)]
    for r, x in enumerate(res):
        assert (x["rank"], x["size"], x["backend"], x["shoal_ranks"]) == (r, WORKERS, "shoal", WORKERS)
        assert len(x["losses"]) == EPOCHS
    losses = res[0]["losses"]
    assert res[1]["losses"] == losses  # the all-reduced per-epoch means agree on every rank
    assert res[1]["params"] == res[0]["params"]  # DDP kept the replicas identical
    assert losses[-1] < 0.5 * losses[0], losses
    assert res[0]["accuracy"] > 0.9, res[0]["accuracy"]
