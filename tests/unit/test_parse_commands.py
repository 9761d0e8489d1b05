"""`gpuctl parse list` shows, per kind, the commands gpuctl really runs: each one taken from where
it is declared (the probe table and the few runners outside it), none declared by a parser."""

from __future__ import annotations

import dataclasses

from helpers import ROOT

from gpuctl import slurm
from gpuctl.cli.parse_cmd import commands_by_kind
from gpuctl.rollout import tools
from gpuctl.validation import burn, gpudirect, multinode, probes
from gpuctl.validation.parsing import ParserSpec, registry


def _line(argv: tuple[str, ...] | list[str]) -> str:
    return " ".join(argv)


def test_a_parser_declares_no_command() -> None:
    assert "command" not in {f.name for f in dataclasses.fields(ParserSpec)}


def test_every_probe_command_is_listed_under_its_kind() -> None:
    commands = commands_by_kind()
    for probe in probes.PROBES:
        if probe.per_gpu or probe.burn:  # per GPU, the burn loop: their argv made at run time
            continue
        shown = _line(
            [
                arg.format(
                    gpus="<gpus>", hca="<hca>", port="<port>", mounts="<paths>", cuda="<cuda>"
                )
                for arg in probe.argv
            ]
        )
        assert shown in commands[probe.parser], (probe.kind, shown)


def test_every_listed_command_comes_from_where_it_is_run() -> None:
    port = probes.IB_WRITE_BW_BASE_PORT
    declared: dict[str, set[str]] = {}
    for probe in probes.PROBES:
        if probe.per_gpu or probe.burn:
            continue
        argv = [
            arg.format(gpus="<gpus>", hca="<hca>", port="<port>", mounts="<paths>", cuda="<cuda>")
            for arg in probe.argv
        ]
        declared.setdefault(probe.parser, set()).add(_line(argv))
    # GPUDirect RDMA (one per GPU, nvidia-peermem shown; a loopback: the client adds the node)
    gdr = gpudirect.server_argv(
        "<hca>", gpudirect.BASE_PORT, 0, gpudirect.PEERMEM, probes.IB_WRITE_BW_SIZE
    )
    declared["perftest"] = {_line(gdr), _line((*gdr, "<node>"))}
    declared["perftest"].update(
        {
            _line(probes.ib_write_bw_server("<hca>", port)),
            _line(probes.ib_write_bw_client("<hca>", port, "<server>")),
        }
    )
    declared.setdefault("nccl", set()).add(_line(multinode.srun_argv(("node1", "node2"), 8)))
    declared.setdefault("mlxfwmanager", set()).add(_line(tools.nic_query_argv()))
    declared.setdefault("flint-query", set()).add(_line(tools.flint_query_argv("<device>")))
    declared.setdefault("scontrol-node", set()).add(_line(slurm.show_argv()))
    # the burn loop (gpuctl/validation/burn_collect.py runs these, built by burn.py)
    rules = burn.rules()
    dmon = list(burn.dmon_argv(60, rules.dmon_interval_s, (0, 1)))
    dmon[dmon.index("-i") + 1] = "<gpus>"
    dmon[dmon.index("-d") + 1] = "<interval>"
    dmon[dmon.index("-c") + 1] = "<samples>"
    declared.setdefault("dmon", set()).add(_line(dmon))
    declared["dcgm-diag"] |= {_line(burn.stress_argv(i, "<s>")) for i in (0, 1)}
    declared["nccl"].add(_line(burn.nccl_argv("<gpus>")))
    commands = commands_by_kind()
    assert set(commands) <= set(registry()), "a command listed for a kind no parser reads"
    assert {kind: set(lines) for kind, lines in commands.items()} == declared


def test_the_commands_the_issue_named_are_the_real_ones() -> None:
    commands = commands_by_kind()
    assert commands["xid"] == ["journalctl -t kernel -b --no-pager -o short-iso"]
    assert commands["dcgm-diag"] == [
        "dcgmi diag -r 2",
        "dcgmi diag -r 3",
        "dcgmi diag -r 4",
        "dcgmi diag -r targeted_stress -p targeted_stress.test_duration=<s>",
        "dcgmi diag -r targeted_power -p targeted_power.test_duration=<s>",
    ]
    # every collective on each node, then all_reduce across the nodes of a group
    assert [c.split(" ", 1)[0] for c in commands["nccl"][:5]] == [
        "all_reduce_perf",
        "all_gather_perf",
        "reduce_scatter_perf",
        "alltoall_perf",
        "sendrecv_perf",
    ]
    assert all(c.endswith(" -b 8 -e 8G -f 2 -g <gpus>") for c in commands["nccl"][:5])
    assert commands["nccl"][5].startswith("srun ")
    assert commands["nccl"][5].endswith(_line(multinode.NCCL_ARGS))


def test_docs_parse_md_table_shows_the_listed_commands() -> None:
    text = (ROOT / "docs" / "parse.md").read_text(encoding="utf-8")
    index = text.split("| kind | command | section |", 1)[1].split("\n\n", 1)[0]
    commands = commands_by_kind()
    for row in (line for line in index.splitlines() if line.startswith("| `")):
        kind, cell = row.split(" | ")[0].strip("|` "), row.split(" | ")[1]
        quoted = cell.split("`")[1::2]
        if kind not in commands:
            assert cell == "-", f"docs/parse.md: {kind} is run by no gpuctl code"
            continue

        # a command in full, or (the long srun line) its program and the nccl-tests tail
        def shows(command: str, quoted: list[str] = quoted) -> bool:
            return command in quoted or (
                command.split(" ", 1)[0] in quoted
                and any(" " in q and command.endswith(q) for q in quoted)
            )

        assert all(shows(c) for c in commands[kind]), f"docs/parse.md: update {kind}'s commands"
        assert len(quoted) == len(commands[kind]) + (
            sum(1 for c in commands[kind] if c not in quoted)
        ), f"docs/parse.md: {kind} shows a command gpuctl does not run"
