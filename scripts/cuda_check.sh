#!/usr/bin/env bash
# The CUDA-tensor checks, on a machine with an NVIDIA GPU and a CUDA build of torch (CI has no GPU:
# there tests/python/test_cuda.py skips). Builds shoal against the torch of $PYTHON (the wheel pins
# torch==2.13.0 for CPU users; this builds against whatever torch is installed, without touching
# it) into a folder of its own, then runs
#   1. tests/python/test_cuda.py: streams, futures, large and odd sizes, DDP with device_ids,
#      init_process_group forms, mixed devices refused;
#   2. the pooled suites again with every tensor on the GPU (SHOAL_TEST_DEVICE=cuda, see
#      tests/python/harness.py): every op, dtype and reduce op of test_collectives.py, and DDP
#      and FSDP2 of test_ddp_fsdp.py (not the digits training, which loads its data on the CPU);
#   3. where Ray is importable, tests/python/test_ray_cuda.py: the direct transport, the
#      collective backend and a WorkerGroup on the GPU.
#     scripts/cuda_check.sh [extra pytest args...]
set -euo pipefail
PY=${PYTHON:-python3}
SITE=${SHOAL_SITE:-/tmp/shoal-site}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())'
TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -m pip install -q --no-build-isolation --no-deps --no-index \
  --upgrade --target "$SITE" .
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
cd tests/python
rc=0
"$PY" -m pytest -q -p no:cacheprovider -rs test_cuda.py "$@" || rc=1
SHOAL_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider -rs test_collectives.py test_ddp_fsdp.py \
  -k "not digits" "$@" || rc=1
if "$PY" -c "import ray" 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -rs test_ray_cuda.py "$@" || rc=1
else
  echo "ray is not importable: test_ray_cuda.py not run"
fi
exit $rc
