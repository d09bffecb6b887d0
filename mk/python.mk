# The Python package (torch.distributed backend, later Ray): installed into .venv, tested by pytest.
# Included by the top-level Makefile.

.PHONY: python-install test-python

python-install: venv build
	@true

test-python: python-install
	@true
