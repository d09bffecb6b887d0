"""``python -m shoal COMMAND`` (and the ``shoal`` command): ``doctor`` (shoal/doctor.py)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: shoal doctor [-n N] [--json] [--params]   what shoal will do on this machine")
        return 0 if argv else 2
    if argv[0] == "doctor":
        from .doctor import main as doctor

        return doctor(argv[1:])
    print(f"shoal: unknown command '{argv[0]}' (doctor)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
