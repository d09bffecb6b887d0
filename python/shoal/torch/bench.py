"""Old name of ``python -m shoal.bench`` (which see), kept as an alias: ``--op`` means ``--ops``."""

from __future__ import annotations

import sys

from ..bench import main

if __name__ == "__main__":
    raise SystemExit(main(["--ops" if a == "--op" else a for a in sys.argv[1:]]))
