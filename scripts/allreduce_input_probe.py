"""Probe for issue 4's 32 MiB gap, outside Ray: 8 plain Python ranks (torch.distributed on shoal)
time one 32 MiB all_reduce after a barrier, as shoal.ray.profile does, with a chosen step before
the barrier (XMODE: none, copy = np.copyto of fresh input as the profile does, copysleep, read,
sleep, torchcopy). Prints medians over 20 trials: the barrier-exit skew and the op's span.
    .venv/bin/python scripts/allreduce_input_probe.py      (XMODE=copy by default)
"""
import sys, time, os
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from shoal._launch import launch

def rank_fn(rank, n, count, trials):
    import torch, torch.distributed as dist
    import shoal
    dist.init_process_group("shoal", rank=rank, world_size=n)
    src = np.ones(count, dtype=np.float32)
    buf = np.empty(count, dtype=np.float32)
    t = torch.from_numpy(buf)
    rec = []
    for i in range(trials + 3):
        mode = os.environ.get("XMODE", "copy")
        if mode == "copy": np.copyto(buf, src)
        elif mode == "copysleep": np.copyto(buf, src); time.sleep(0.05)
        elif mode == "read": float(buf[::16].sum())
        elif mode == "sleep": time.sleep(0.05)
        elif mode == "torchcopy": t.copy_(torch.from_numpy(src))
        a = time.time()
        dist.barrier()
        b = time.time()
        dist.all_reduce(t)
        c = time.time()
        if i >= 3: rec.append((a, b, c))
    dist.destroy_process_group()
    return rec

if __name__ == "__main__":
    res = launch(rank_fn, 8, 8388608, 20, timeout=600)
    T = len(res[0])
    skew, span, last_to_end, bar = [], [], [], []
    for k in range(T):
        a = [r[k][0] for r in res]; b = [r[k][1] for r in res]; c = [r[k][2] for r in res]
        skew.append(max(b) - min(b)); span.append(max(c) - min(b)); last_to_end.append(max(c) - max(b))
        bar.append(max(b) - max(a))
    med = lambda x: round(float(np.median(x)) * 1e3, 1)
    print("barrier-exit skew", med(skew), "| first exit -> last end", med(span), "| last exit -> last end", med(last_to_end), "| last arrival -> last exit", med(bar))
