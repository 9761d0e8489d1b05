"""``python3 -m <package> TOOL [ARGS...]``: run one stand-in by name (for debugging a node)."""

from __future__ import annotations

import sys

from .standin import main

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python3 -m gpuctl.lab.sim TOOL [ARGS...]\n")
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
