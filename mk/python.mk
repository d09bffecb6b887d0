# The Python package (torch.distributed backend, later Ray): installed into .venv, tested by pytest.
# Included by the top-level Makefile.
#
#   make python-install    build shoal._C + libshoal.so (scikit-build-core) and pip-install the
#                          package into .venv, against the torch already there (no build
#                          isolation: that would download a multi-GB torch)
#   make test-python       pytest tests/python: shoal's own tests, then a subset of PyTorch's
#                          distributed test suite on the shoal backend (world sizes 2 and 3)
#   make test-torch-suite  PyTorch's whole distributed test suite on shoal (slow)

.PHONY: python-install test-python test-torch-suite

PY_SOURCES := pyproject.toml CMakeLists.txt VERSION cmake/version.h.in python/shoal_ray_autoload.pth csrc/torch/build_info.py.in $(shell find python/shoal python/_shoal_autoload csrc/torch src include \
	-type f \( -name '*.py' -o -name '*.cpp' -o -name '*.h' \) 2>/dev/null)

python-install: .venv/.shoal-installed
.venv/.shoal-installed: .venv/.stamp $(PY_SOURCES)
	$(CCACHE_ENV) CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install -q --no-build-isolation --no-deps \
	  -C cmake.define.CMAKE_CXX_COMPILER=$(CXX) -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) .
	@touch $@

test-python: python-install
	$(PY) -m pytest -q --durations=25 tests/python

test-torch-suite: python-install
	SHOAL_TORCH_SUITE=full $(PY) -m pytest -q tests/python/test_torch_suite.py
