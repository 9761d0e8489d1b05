"""Benchmark: `gpuctl validate --level quick` against clush and Ansible on 64 SSH nodes.

Run (root, openssh-server installed): .venv/bin/python benchmarks/validate_quick_64.py [--nodes 64]

The nodes are sshd-only network namespaces on this machine (benchmarks/sshnodes.py) whose
sessions find the lab simulator's nvidia-smi, ibstat, journalctl and systemctl first on PATH.
In the same run, on the same nodes, with the same key and host key checking on, each of these
collects the quick level's probe outputs from every GPU node:

  gpuctl   `gpuctl validate CLUSTER --level quick --limit gpu[001-064] --out DIR` (collects over
           SSH, judges, writes the bundle and the report; its defaults otherwise)
  clush    ClusterShell, one `clush -w 198.19.0.[11-74] -b -S CMD` per probe command, its
           default fanout (64)
  ansible  one `ansible all -i INVENTORY -m command -a CMD` per probe command, its defaults
           (forks 5, ControlPersist 60 s: a fresh control socket directory per run, so each
           run starts without open connections)

With --clush-joined, clush also runs every probe as one shell line (one connection per node,
the outputs run together): printed, not gated.

Each tool runs --repeat times (default 3), in rotating order; the medians are compared.
Target: gpuctl / clush <= 1.2. The ratio gpuctl / ansible is printed. Exit 0 when the target
is met, 1 when it is missed or a tool failed on a node (every run must succeed on every node:
a tool that did less work is not faster), 2 when the benchmark cannot run (not root, no sshd,
`gpuctl validate` not in this tree yet: then the two peers are measured and printed anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sshnodes import HarnessError, SshNodes, address_nodeset, gpu_nodeset

RATIO_MAX = 1.2
BIN = Path(sys.executable).parent


def quick_commands(cluster: Path, node: str) -> list[str]:
    """The quick level's probe command lines for ``node``, as gpuctl runs them (probes.py)."""
    from gpuctl.config import load_cluster
    from gpuctl.validation.expect import expectations
    from gpuctl.validation.probes import QUICK, probes_for

    exp = expectations(load_cluster(cluster))[node]
    return [shlex.join(p.command(exp)) for p in probes_for(exp, QUICK)]


# ------------------------------------------------------------------------------------------
# Measuring one run


@dataclass
class Run:
    tool: str
    wall_s: float
    cpu_s: float  # the tool's own processes (waited-for children included), user + system
    max_rss_mb: float  # the largest of them
    machine_busy: float  # share of all CPUs busy during the run (sshd and stand-ins included)
    machine_mem_mb: float  # the most memory in use during the run, above what it was before


@dataclass
class Tool:
    name: str
    steps: Callable[[Path], list[list[str]]]  # argv lists, run one after the other
    check: Callable[[Path, list[subprocess.CompletedProcess[str]]], str | None]
    env: Callable[[Path], dict[str, str]] = field(default=lambda work: dict(os.environ))
    after: Callable[[Path], None] = field(default=lambda work: None)
    runs: list[Run] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)


def _busy_ticks() -> tuple[int, int]:
    with open("/proc/stat", encoding="utf-8") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, sum(fields[:8])


def mem_available_mb() -> float:
    with open("/proc/meminfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


class _MemorySampler:
    """The lowest MemAvailable while a run goes on (sampled every 100 ms in a thread)."""

    def __init__(self) -> None:
        self.lowest = self.before = mem_available_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.lowest = min(self.lowest, mem_available_mb())

    def __enter__(self) -> _MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return max(self.before - self.lowest, 0.0)


def _run_steps(tool: Tool, work: Path) -> tuple[Run, list[subprocess.CompletedProcess[str]]]:
    with _MemorySampler() as memory:
        run, results = _timed_steps(tool, work)
    run.machine_mem_mb = memory.peak_mb
    return run, results


def _timed_steps(tool: Tool, work: Path) -> tuple[Run, list[subprocess.CompletedProcess[str]]]:
    results: list[subprocess.CompletedProcess[str]] = []
    cpu = rss = 0.0
    env = tool.env(work)
    busy0, total0 = _busy_ticks()
    start = time.perf_counter()
    for i, argv in enumerate(tool.steps(work)):
        out_path = work / f"step{i}.out"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(  # noqa: S603 - argv lists built above
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                env=env,
            )
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:  # Ctrl-C / SIGTERM: the tool goes too, then the nodes
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss / 1024)
        text = out_path.read_text(encoding="utf-8", errors="replace")
        results.append(subprocess.CompletedProcess(argv, proc.returncode, text, ""))
    wall = time.perf_counter() - start
    busy1, total1 = _busy_ticks()
    share = (busy1 - busy0) / max(total1 - total0, 1)
    return Run(tool.name, wall, cpu, rss, share, 0.0), results


# ------------------------------------------------------------------------------------------
# The three tools


def gpuctl_tool(nodes: SshNodes, cluster: Path) -> Tool:
    limit = gpu_nodeset(nodes.count)

    def steps(work: Path) -> list[list[str]]:
        out = work / "bundle"
        return [
            [
                str(BIN / "gpuctl"),
                "validate",
                str(cluster),
                "--level",
                "quick",
                "--limit",
                limit,
                "--out",
                str(out),
            ],
        ]

    def check(work: Path, results: list[subprocess.CompletedProcess[str]]) -> str | None:
        res = results[0]
        if res.returncode != 0:
            return f"gpuctl validate exited {res.returncode}:\n{res.stdout[-3000:]}"
        metas = list((work / "bundle").rglob("meta.json"))
        if len(metas) != nodes.count:
            return f"gpuctl validate wrote {len(metas)} node folders, not {nodes.count}"
        for meta in metas:
            doc = json.loads(meta.read_text(encoding="utf-8"))
            if "unreachable" in doc:
                return f"{meta.parent.name}: unreachable: {doc['unreachable']}"
        return None

    return Tool("gpuctl", steps, check)


def clush_tool(nodes: SshNodes, commands: list[str]) -> Tool:
    target = address_nodeset(nodes.count)
    ssh = shlex.join(nodes.ssh_options())

    def steps(work: Path) -> list[list[str]]:
        base = [str(BIN / "clush"), "-w", target, "-l", "root", "-o", ssh, "-b", "-S"]
        return [[*base, command] for command in commands]

    def check(work: Path, results: list[subprocess.CompletedProcess[str]]) -> str | None:
        for command, res in zip(commands, results, strict=True):
            if res.returncode != 0:
                return f"clush {command!r} exited {res.returncode}:\n{res.stdout[-2000:]}"
            if "clush: " in res.stdout and "exited with exit code" in res.stdout:
                return f"clush {command!r}: a node failed:\n{res.stdout[-2000:]}"
        return None

    return Tool("clush", steps, check)


def clush_joined_tool(nodes: SshNodes, commands: list[str]) -> Tool:
    """Informational: one clush run of every probe in one shell line (one connection per node;
    the outputs run together and only the last command's status comes back)."""
    tool = clush_tool(nodes, ["; ".join(commands)])
    tool.name = "clush-1"
    return tool


def ansible_tool(nodes: SshNodes, inventory: Path, commands: list[str]) -> Tool:
    def env(work: Path) -> dict[str, str]:
        values = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        # locations only (ANSIBLE_HOME holds the ControlPersist sockets): each run starts cold
        # and nothing is written under /root/.ansible
        values["ANSIBLE_HOME"] = str(work / "ansible-home")
        values["ANSIBLE_REMOTE_TMP"] = str(work / "ansible-remote-tmp")
        values["ANSIBLE_NOCOLOR"] = "1"
        return values

    def steps(work: Path) -> list[list[str]]:
        base = [str(BIN / "ansible"), "all", "-i", str(inventory), "-m", "command", "-a"]
        return [[*base, command] for command in commands]

    def check(work: Path, results: list[subprocess.CompletedProcess[str]]) -> str | None:
        for command, res in zip(commands, results, strict=True):
            ok = res.stdout.count(" | CHANGED | rc=0 >>")
            if res.returncode != 0 or ok != nodes.count:
                return (
                    f"ansible {command!r} exited {res.returncode}, {ok}/{nodes.count} hosts "
                    f"rc=0:\n{res.stdout[-2000:]}"
                )
        return None

    def after(work: Path) -> None:
        close_control_masters(work / "ansible-home")

    return Tool("ansible", steps, check, env, after)


def close_control_masters(folder: Path) -> None:
    """``ssh -O exit`` for every ControlPersist socket under ``folder`` (ansible's masters)."""
    if not folder.is_dir():
        return
    for sock in folder.rglob("*"):
        if sock.is_socket():
            subprocess.run(  # noqa: S603 - argv list
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"],  # noqa: S607
                capture_output=True,
                check=False,
                timeout=10,
            )


def gpuctl_validate_available() -> bool:
    res = subprocess.run(  # noqa: S603 - argv list
        [str(BIN / "gpuctl"), "validate", "--help"], capture_output=True, check=False, timeout=60
    )
    return res.returncode == 0


# ------------------------------------------------------------------------------------------


def _print_table(tools: list[Tool], count: int, repeat: int) -> None:
    print(f"validate --level quick on {count} SSH nodes, {os.cpu_count()} CPUs, {repeat} runs each")
    print(
        f"{'tool':<8} {'median s':>9}  {'runs s':<24} {'tool CPU s':>10} {'tool RSS MB':>11}"
        f" {'CPUs busy':>9} {'mem +MB':>8}"
    )
    for tool in tools:
        runs = ", ".join(f"{r.wall_s:.2f}" for r in tool.runs)
        cpu = statistics.median(r.cpu_s for r in tool.runs)
        rss = max(r.max_rss_mb for r in tool.runs)
        busy = statistics.median(r.machine_busy for r in tool.runs)
        mem = max(r.machine_mem_mb for r in tool.runs)
        print(
            f"{tool.name:<8} {tool.median():>9.2f}  {runs:<24} {cpu:>10.2f} {rss:>11.1f}"
            f" {busy:>8.0%} {mem:>8.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="results as JSON on stdout")
    parser.add_argument(
        "--clush-joined",
        action="store_true",
        help="also time clush running all probes as one shell line (printed, not gated)",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat takes 1 or more")
    have_gpuctl = gpuctl_validate_available()
    started = time.perf_counter()
    try:
        with SshNodes(args.nodes, log=sys.stderr) as nodes:
            work_root = nodes.state / "runs"
            cluster = nodes.cluster_yml()
            inventory = nodes.inventory()
            commands = quick_commands(cluster, nodes.gpu_nodes[0].name)
            tools = [clush_tool(nodes, commands), ansible_tool(nodes, inventory, commands)]
            if args.clush_joined:
                tools.insert(1, clush_joined_tool(nodes, commands))
            if have_gpuctl:
                tools.insert(0, gpuctl_tool(nodes, cluster))
            sys.stderr.write(
                f"{args.nodes} nodes up in {nodes.setup_s:.1f} s; the quick level's probes:\n"
                + "".join(f"  {c}\n" for c in commands)
            )
            # warm-up, not timed: neighbour caches, page cache of the tools and the stand-ins
            warm = clush_tool(nodes, ["nvidia-smi -L"])
            _, res = _run_steps(warm, _fresh(work_root / "warm-up"))
            failure = warm.check(work_root, res)
            if failure:
                raise HarnessError(f"warm-up: {failure}")
            for r in range(args.repeat):
                order = tools[r % len(tools) :] + tools[: r % len(tools)]
                for tool in order:
                    work = _fresh(work_root / f"{tool.name}-{r + 1}")
                    try:
                        run, results = _run_steps(tool, work)
                    finally:
                        tool.after(work)
                    failure = tool.check(work, results)
                    if failure:
                        sys.stderr.write(f"{tool.name} run {r + 1} failed: {failure}\n")
                        return 1
                    tool.runs.append(run)
                    sys.stderr.write(f"  {tool.name} run {r + 1}: {run.wall_s:.2f} s\n")
    except HarnessError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the nodes are down again\n")
        return 130
    total = time.perf_counter() - started
    by_name = {t.name: t for t in tools}
    ratios: dict[str, float] = {}
    if have_gpuctl:
        ratios["gpuctl/clush"] = by_name["gpuctl"].median() / by_name["clush"].median()
        ratios["gpuctl/ansible"] = by_name["gpuctl"].median() / by_name["ansible"].median()
        if "clush-1" in by_name:
            ratios["gpuctl/clush-1"] = by_name["gpuctl"].median() / by_name["clush-1"].median()
    ok = have_gpuctl and ratios["gpuctl/clush"] <= RATIO_MAX
    if args.json:
        doc = {
            "nodes": args.nodes,
            "cpus": os.cpu_count(),
            "repeat": args.repeat,
            "commands": commands,
            "setup_s": round(nodes.setup_s, 3),
            "total_s": round(total, 1),
            "runs": {t.name: [vars(r) for r in t.runs] for t in tools},
            "medians_s": {t.name: t.median() for t in tools},
            "ratios": ratios,
            "target": {"gpuctl/clush": RATIO_MAX},
            "ok": ok,
        }
        print(json.dumps(doc, indent=2))
    else:
        _print_table(tools, args.nodes, args.repeat)
        if have_gpuctl:
            verdict = "ok" if ok else "MISSED"
            print(f"gpuctl/clush   {ratios['gpuctl/clush']:.3f} (target <= {RATIO_MAX}): {verdict}")
            print(f"gpuctl/ansible {ratios['gpuctl/ansible']:.3f}")
            if "gpuctl/clush-1" in ratios:
                print(f"gpuctl/clush-1 {ratios['gpuctl/clush-1']:.3f} (all probes in one line)")
        print(f"nodes up in {nodes.setup_s:.1f} s; whole benchmark {total:.0f} s")
    if not have_gpuctl:
        sys.stderr.write(
            "error: `gpuctl validate` is not in this tree yet (issue 6): only the peers were "
            "measured\n"
        )
        return 2
    return 0 if ok else 1


def _fresh(path: Path) -> Path:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
