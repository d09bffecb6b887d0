"""Training libraries on top of torch.distributed, run on shoal as their users would (docs/torch.md,
"Accelerate, Transformers and Lightning"): Hugging Face Accelerate, which rewrites any CPU backend
to "gloo" but keeps a process group made before it, and PyTorch Lightning's DDPStrategy with
process_group_backend="shoal". Each script checks, on every rank, that the default group's CPU
backend is shoal's and that the ranks, fed different data, end with the same parameters (DDP
averaged their gradients), and that the loss went down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from harness import free_port

ACCELERATE = r'''
import json, os, sys
import torch, torch.distributed as dist
import shoal
from shoal._C import BackendShoal

dist.init_process_group("shoal")  # before Accelerator: it keeps a group it finds
from accelerate import Accelerator

acc = Accelerator(cpu=True)
rank, world = dist.get_rank(), dist.get_world_size()
assert acc.num_processes == world == 2, (acc.num_processes, world)
backend = dist.group.WORLD._get_backend(torch.device("cpu"))
assert isinstance(backend, BackendShoal), type(backend)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt = acc.prepare(model, opt)
g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
w = torch.arange(8.0) / 8
losses = []
for step in range(30):
    x = torch.randn(32, 8, generator=g)
    y = x @ w[:, None]
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    acc.backward(loss)
    opt.step()
    losses.append(loss.item())
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
assert all(torch.equal(every[0], e) for e in every), "the ranks' parameters differ: gradients were not synced"
print("CLIENT " + json.dumps({"rank": rank, "first": losses[0], "last": losses[-1]}), flush=True)
dist.destroy_process_group()
'''

LIGHTNING = r'''
import json, os, sys
import torch, torch.distributed as dist
import lightning as L
from lightning.pytorch.strategies import DDPStrategy
import shoal
from shoal._C import BackendShoal

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.losses = []
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

w = torch.arange(8.0) / 8
x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
data = torch.utils.data.TensorDataset(x, x @ w[:, None])
loader = torch.utils.data.DataLoader(data, batch_size=16)  # Lightning gives each rank its part
model = Model()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="shoal"),
                    max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, loader)
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2 and dist.get_backend() == "shoal", (world, dist.get_backend())
assert isinstance(dist.group.WORLD._get_backend(torch.device("cpu")), BackendShoal)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
assert all(torch.equal(every[0], e) for e in every), "the ranks' parameters differ: gradients were not synced"
print("CLIENT " + json.dumps({"rank": rank, "first": model.losses[0], "last": model.losses[-1]}), flush=True)
'''


def check(p, ranks):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # (the ranks share stdout: their lines may run into each other)
    got = [json.loads(m) for m in re.findall(r"CLIENT (\{[^}]*\})", p.stdout)]
    assert sorted(r["rank"] for r in got) == list(range(ranks)), p.stdout + p.stderr
    for r in got:
        assert r["last"] < 0.5 * r["first"], r  # it learned


def test_accelerate_keeps_a_shoal_group_made_first(tmp_path):
    pytest.importorskip("accelerate")
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
           str(script)]
    check(subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path), 2)


def test_lightning_ddp_strategy_on_shoal(tmp_path):
    pytest.importorskip("lightning")
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING)
    env = {"MASTER_PORT": str(free_port()), "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, **env})
    check(p, 2)
