"""DeepSpeed's CPU shared-memory allreduce as a peer of ``python -m shoal.bench`` (``--backends
...,deepspeed``): what CPU tensor-parallel inference with DeepSpeed calls
(``deepspeed.comm.inference_all_reduce``, which runs ``torch.ops.deepspeed.inference_all_reduce_``
when every rank is on one host).

It needs ``pip install deepspeed`` (0.19.8 installs from PyPI without changing torch); the first
use compiles DeepSpeed's ``shm.cpp`` with torch's extension builder (about a minute; cached under
``~/.cache/torch_extensions``). Only all_reduce of float32, bfloat16 and float16 exists there; its
float32 kernel needs AVX2. Its waits spin without yielding: with more ranks than cores each call
takes milliseconds. DeepSpeed never removes the names of its segments (~66 MiB a rank in
``/dev/shm``): the bench removes each rank's once every rank has mapped them (``unlink_name``).
"""

from __future__ import annotations

import os


class DeepSpeedShm:
    """One rank's handle on DeepSpeed's shm allreduce (a stand-in for a process group in the bench)."""

    name = "deepspeed"
    ops = ("all_reduce",)

    @staticmethod
    def missing() -> str | None:
        """Why this peer cannot run here, or None."""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        try:
            from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder  # noqa: F401
        except ImportError as e:
            return f"the deepspeed backend needs DeepSpeed: pip install deepspeed (it keeps the installed torch) [{e}]"
        return None

    def __init__(self, rank: int, size: int):
        why = self.missing()
        if why:
            raise RuntimeError(why)
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        # The op uses shared memory only when it is told that every rank is local (LOCAL_SIZE),
        # and names its segment after MASTER_ADDR/MASTER_PORT, which the launcher set.
        os.environ["LOCAL_SIZE"] = str(size)
        self._mod = ShareMemCommBuilder().load(verbose=False)
        if self._mod.vector_kernel_level() < 1:
            raise RuntimeError("DeepSpeed's shm allreduce needs AVX2 for float32; this CPU has none")
        self._mod.initialize(size, rank)
        # shm.cpp's name for this rank's segment: its prefix, uid, MASTER_ADDR, MASTER_PORT, rank.
        self._name = "deepspeed_allreduce_buffer_{}_{}_{}_{}".format(
            os.getuid(), os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"), rank)

    def unlink_name(self) -> None:
        """Removes the name of this rank's segment (the mappings stay). Only once every rank has
        made its DeepSpeedShm: a rank still starting waits for the names of the others'."""
        try:
            os.unlink(os.path.join("/dev/shm", self._name))
        except FileNotFoundError:
            pass

    def all_reduce(self, t) -> None:
        import torch

        torch.ops.deepspeed.inference_all_reduce_(t)
