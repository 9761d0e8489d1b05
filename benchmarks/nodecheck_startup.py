"""Benchmark: start-up of `gpuctl-node-check` against the full `gpuctl` application.

Run: .venv/bin/python benchmarks/nodecheck_startup.py [--repeat R]

Slurm starts `gpuctl-node-check` as HealthCheckProgram on every node every HealthCheckInterval,
so what it imports is paid on every node, every few minutes. This starts both programs with
`--help` (argument parsing, no check run) ``R`` times each, alternating, in fresh interpreters,
and prints the median wall time of each, their ratio (node-check / gpuctl, the peer measured in
the same run) and how many modules each imports (gpuctl's own and all). Exits 0: the modules that
node-check must not import are held by tests/unit/test_architecture.py, not by a timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PROGRAMS = {
    "gpuctl-node-check": "gpuctl.cli.nodecheck_main",
    "gpuctl": "gpuctl.cli.app",
}
_COUNT = (
    "import sys, json, importlib; importlib.import_module({module!r}); "
    "print(json.dumps([len([m for m in sys.modules if m.split('.')[0] == 'gpuctl']), "
    "len(sys.modules)]))"
)
_HELP = (
    "import sys, importlib; sys.argv = [{name!r}, '--help']; "
    "m = importlib.import_module({module!r})\n"
    "try:\n    m.main()\nexcept SystemExit:\n    pass"
)


def _time_once(name: str, module: str) -> float:
    start = time.perf_counter()
    subprocess.run(  # noqa: S603 - this interpreter, with our own -c text
        [sys.executable, "-c", _HELP.format(name=name, module=module)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _modules(module: str) -> tuple[int, int]:
    out = subprocess.run(  # noqa: S603 - this interpreter, with our own -c text
        [sys.executable, "-c", _COUNT.format(module=module)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    own, total = json.loads(out)
    return int(own), int(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    for _ in range(args.repeat):
        for name, module in PROGRAMS.items():
            times[name].append(_time_once(name, module))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, module in PROGRAMS.items():
        own, total = _modules(module)
        print(
            f"{name:18} --help median {medians[name]:.3f} s over {args.repeat} runs; "
            f"imports {own} gpuctl modules, {total} modules in all"
        )
    ratio = medians["gpuctl-node-check"] / medians["gpuctl"]
    print(f"ratio node-check / gpuctl: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
