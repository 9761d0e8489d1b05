"""``python -m gpuctl.lab.sim.bmc serve CONFIG``: the lab's BMC process (run by `gpuctl lab up`)."""

from __future__ import annotations

import sys

from gpuctl.lab.sim.bmc.process import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
