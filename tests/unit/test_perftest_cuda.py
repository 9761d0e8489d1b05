"""perftest with its buffer in GPU memory (--use_cuda, --use_cuda_dmabuf; issue 18, point 2):
the lines perftest's CUDA support prints before the test are read as what they say (which GPU,
its PCI address, the buffer, DMA-BUF), not as settings or lines not understood. Real captures
(tests/fixtures/perftest/ib-write-bw-use-cuda-*, ADDED.md)."""

from __future__ import annotations

from helpers import ROOT

from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsing import parse

FIX = ROOT / "tests" / "fixtures" / "perftest"


def _parse(name: str) -> dict[str, object]:
    result = parse("perftest", capture_output(FIX / name))
    return dict(result.data)


def test_the_gpu_buffer_is_read_and_no_cuda_line_becomes_a_setting() -> None:
    data = _parse("ib-write-bw-use-cuda-dmabuf-h200-gke-roce-all-sizes-gbits-client.txt")
    assert data["cuda"] == {
        "device": 0,
        "name": "NVIDIA H200",
        "listed": [{"index": 0, "pci": "8f:00"}],
        "buffer_bytes": 16777216,
        "dmabuf": True,
        "integrated": False,
    }
    settings = data["settings"]
    assert isinstance(settings, dict)
    # before: "CUDA device 0: PCIe address is 8F:00" gave the settings 'CUDA device 0': 'PCIe'
    # and 'address is 8F': '00'
    assert not [k for k in settings if "CUDA" in k or k.startswith("address")], settings
    assert settings["Device"] == "mlx5_3"


def test_a_gpu_buffer_the_adapter_cannot_register_is_a_failure_with_its_gpu() -> None:
    """nvidia-peermem missing (or no DMA-BUF): perftest allocates the GPU buffer, then fails
    to register it with the adapter."""
    result = parse(
        "perftest",
        capture_output(
            FIX / "ib-write-bw-use-cuda-k80-old-perftest-couldnt-allocate-mr-server.txt"
        ),
    )
    assert result.data["cuda"]["name"] == "Tesla K80"
    assert result.data["errors"][0] == "Couldn't allocate MR"
    assert result.data["rows"] == []


def test_host_memory_runs_have_no_cuda_facts() -> None:
    data = _parse("ib-write-bw-h200-gke-host-mem-completion-error-syndrom-0x88-client.txt")
    assert data["cuda"] is None
