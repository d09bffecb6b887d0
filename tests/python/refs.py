"""Deterministic per-rank inputs and reference results for the collective tests."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
]
# Dtypes shoal cannot reduce but can move (broadcast, gather, all-to-all, send/recv...).
MOVE_ONLY_DTYPES = [torch.int16, torch.complex64, torch.float8_e4m3fn] if hasattr(torch, "float8_e4m3fn") else [
    torch.int16,
    torch.complex64,
]
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AVG": dist.ReduceOp.AVG,
    "BAND": dist.ReduceOp.BAND,
    "BOR": dist.ReduceOp.BOR,
    "BXOR": dist.ReduceOp.BXOR,
}
FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def supported(dtype, op: str) -> bool:
    if op in ("BAND", "BOR", "BXOR"):
        return dtype not in FLOATS
    if op == "AVG":
        return dtype != torch.bool
    return True


def data(rank: int, shape, dtype, seed: int = 0) -> torch.Tensor:
    """Small values, so that sums and products of up to 4 ranks are exact in every dtype. Drawn on
    the CPU (the same values on every device), returned on torch's default device: the CUDA run of
    these tests (SHOAL_TEST_DEVICE=cuda, harness.py) makes that a GPU."""
    g = torch.Generator().manual_seed(seed * 1009 + rank * 7919 + 1)
    randint = functools.partial(torch.randint, size=shape, generator=g, device="cpu")
    if dtype == torch.bool:
        t = randint(0, 2).bool()
    elif dtype.is_complex:
        t = torch.complex(randint(-3, 4).float(), randint(-3, 4).float()).to(dtype)
    elif dtype in FLOATS or dtype.is_floating_point:
        t = randint(1, 4).to(torch.float32).to(dtype)
    else:
        t = randint(0, 4).to(dtype)
    return t.to(torch.get_default_device())


def reduce_ref(tensors, op: str, dtype) -> torch.Tensor:
    n = len(tensors)
    if dtype == torch.bool:
        b = [t.bool() for t in tensors]
        f = {
            "SUM": torch.logical_or,
            "MAX": torch.logical_or,
            "BOR": torch.logical_or,
            "PRODUCT": torch.logical_and,
            "MIN": torch.logical_and,
            "BAND": torch.logical_and,
            "BXOR": torch.logical_xor,
        }[op]
        return functools.reduce(f, b)
    wide = torch.float64 if dtype in FLOATS else torch.int64
    s = torch.stack([t.to(wide) for t in tensors])
    if op == "SUM":
        r = s.sum(0)
    elif op == "PRODUCT":
        r = s.prod(0)
    elif op == "MIN":
        r = s.amin(0)
    elif op == "MAX":
        r = s.amax(0)
    elif op == "AVG":
        r = s.sum(0) / n if dtype in FLOATS else torch.div(s.sum(0), n, rounding_mode="trunc")
    else:
        f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        r = functools.reduce(f, list(s))
    return r.to(dtype)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    if actual.dtype.is_floating_point and actual.element_size() == 1:  # float8: compare bits
        actual, expected = actual.view(torch.uint8), expected.view(torch.uint8)
    if actual.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(actual, expected, rtol=1e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")
    elif actual.dtype.is_floating_point or actual.dtype.is_complex:
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(actual, expected), f"{what}: got {actual} expected {expected}"
