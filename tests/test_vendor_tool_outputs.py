"""collect_env's vendor tool parsing on outputs laid out as nvidia-smi, rocm-smi and mthreads-gmi print them.

The outputs live in tests/fixtures/vendor_tools (see its README: real layouts, illustrative values). They
are replayed for the exact argv perfgate issues, through the same collection code a real host runs, so an
argv perfgate changes or a layout it no longer reads fails here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from perfgate.envprobe.models import SystemTool
from perfgate.envprobe.systools import RawRun, collect_system_tools, parse_rocm_smi_json

OUT = Path(__file__).parent / "fixtures" / "vendor_tools"
NVIDIA_QUERY = "--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,pci.bus_id"
NVIDIA_QUERY_OLD = "--query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id"
ROCM_ARGS = ("--showproductname", "--showdriverversion", "--showmeminfo", "vram", "--json")


def _text(name: str) -> str:
    return (OUT / name).read_text(encoding="utf-8")


Replies = dict[tuple[str, ...], tuple[int, str, str]]


def _collect(tmp_path: Path, tool: str, replies: Replies) -> tuple[SystemTool, str, list[tuple[str, ...]]]:
    """Run the real collection with ``tool`` on PATH and its output replayed per argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / tool
    stub.write_text("#!/bin/sh\nexit 99\n")  # found on PATH, never executed: the runner replays
    stub.chmod(0o755)
    seen: list[tuple[str, ...]] = []

    def replay(argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> RawRun:
        args = tuple(argv[1:])
        seen.append(args)
        assert env.get("LC_ALL") == "C"
        if args not in replies:
            return RawRun(tuple(argv), 2, "", f"unexpected arguments {args}")
        code, out, err = replies[args]
        return RawRun(tuple(argv), code, out, err)

    tools, transcripts, _ = collect_system_tools(
        env={"PATH": str(bin_dir)}, workspace=None, run=replay, use_nvml=False
    )
    found = next(t for t in tools if t.name == tool)
    return found, transcripts[tool], seen


def test_nvidia_smi_r550_version_and_query_are_parsed(tmp_path: Path) -> None:
    replies: Replies = {
        ("--version",): (0, _text("nvidia-smi_version_r550.txt"), ""),
        (NVIDIA_QUERY, "--format=csv,noheader,nounits"): (0, _text("nvidia-smi_query_h100x8.csv"), ""),
    }
    smi, transcript, seen = _collect(tmp_path, "nvidia-smi", replies)
    assert seen == list(replies)
    assert (smi.version, smi.driver_version, smi.runtime_version) == ("550.54.15", "550.54.15", "12.4")
    devices = smi.devices or []
    assert [d.index for d in devices] == list(range(8))
    assert {d.name for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert devices[7].pci_bus_id == "00000000:DB:00.0" and devices[7].capability == "9.0"
    assert devices[0].total_memory_bytes == 81559 * 2**20
    assert devices[3].uuid == "GPU-1d6a2b88-6b1c-4e0a-9f7d-000000000003"
    assert "NVIDIA H100 80GB HBM3" in transcript and smi.errors == []


def test_nvidia_smi_r470_falls_back_to_the_banner_and_the_query_without_compute_cap(tmp_path: Path) -> None:
    replies: Replies = {
        ("--version",): (
            2,
            "",
            "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n",
        ),
        (): (0, _text("nvidia-smi_banner_r470.txt"), ""),
        (NVIDIA_QUERY, "--format=csv,noheader,nounits"): (
            2,
            _text("nvidia-smi_query_compute_cap_r470.stdout"),
            "",
        ),
        (NVIDIA_QUERY_OLD, "--format=csv,noheader,nounits"): (
            0,
            _text("nvidia-smi_query_a100x4_r470.csv"),
            "",
        ),
    }
    smi, _, seen = _collect(tmp_path, "nvidia-smi", replies)
    assert seen == list(replies)
    assert (smi.version, smi.driver_version, smi.runtime_version) == ("470.182.03", "470.182.03", "11.4")
    devices = smi.devices or []
    assert [d.name for d in devices] == ["NVIDIA A100-SXM4-80GB"] * 4
    assert all(d.capability is None for d in devices) and devices[2].total_memory_bytes == 81251 * 2**20


def test_the_r550_banner_alone_yields_driver_and_cuda_versions(tmp_path: Path) -> None:
    replies: Replies = {
        ("--version",): (2, "", "Invalid combination of input arguments.\n"),
        (): (0, _text("nvidia-smi_banner_r550.txt"), ""),
        (NVIDIA_QUERY, "--format=csv,noheader,nounits"): (0, _text("nvidia-smi_query_h100x8.csv"), ""),
    }
    smi, _, _ = _collect(tmp_path, "nvidia-smi", replies)
    assert (smi.version, smi.driver_version, smi.runtime_version) == ("550.54.15", "550.54.15", "12.4")


@pytest.mark.parametrize(
    ("name", "driver", "card", "count", "memory", "gfx"),
    [
        ("rocm-smi_6.1_mi300x.json", "6.7.0", "AMD Instinct MI300X OAM", 8, 206141652992, "gfx942"),
        (
            "rocm-smi_5.4_mi250x.json",
            "5.16.9.22.20",
            "Aldebaran/MI200 [Instinct MI250X/MI250]",
            2,
            68702699520,
            None,
        ),
    ],
)
def test_rocm_smi_json_of_both_key_spellings_is_parsed(
    tmp_path: Path, name: str, driver: str, card: str, count: int, memory: int, gfx: str | None
) -> None:
    smi, transcript, seen = _collect(tmp_path, "rocm-smi", {ROCM_ARGS: (0, _text(name), "")})
    assert seen == [ROCM_ARGS]
    assert smi.driver_version == driver and smi.errors == []
    devices = smi.devices or []
    assert [d.index for d in devices] == list(range(count))
    # ROCm 6 spells the key 'Card Series'; the name must not fall back to the SKU ('M3000100').
    assert {d.name for d in devices} == {card}
    assert devices[-1].total_memory_bytes == memory and devices[0].capability == gfx
    assert card in transcript


def test_rocm_smi_parsing_matches_keys_whatever_their_case() -> None:
    driver, devices = parse_rocm_smi_json('{"card0": {"CARD SERIES": "X", "Card SKU": "S"}, "system": {}}')
    assert driver is None and devices[0].name == "X"


def test_mthreads_gmi_query_and_list_are_parsed_and_merged(tmp_path: Path) -> None:
    replies: Replies = {
        ("-q",): (0, _text("mthreads-gmi_q_s4000x2.txt"), ""),
        ("-L",): (0, _text("mthreads-gmi_L_s4000x2.txt"), ""),
    }
    gmi, transcript, seen = _collect(tmp_path, "mthreads-gmi", replies)
    assert seen == list(replies)
    assert gmi.driver_version == "2.7.0" and gmi.errors == []
    assert gmi.runtime_version is None  # this layout states no MUSA version; nothing is guessed
    devices = gmi.devices or []
    assert [(d.index, d.name) for d in devices] == [(0, "MTT S4000"), (1, "MTT S4000")]
    assert devices[1].total_memory_bytes == 49152 * 2**20
    assert devices[1].pci_bus_id == "00000000:3D:00.0"
    assert devices[0].uuid == "GPU-4b7d0000-93e2-4d1a-8c5f-1e6a20c9b000"
    # memory 'Total' is read under 'FB Memory Usage' only, never from another block
    assert "Graphics" in transcript


def test_every_recorded_output_is_used_by_a_test() -> None:
    used = {p.name for p in OUT.iterdir() if p.suffix != ".md"}
    source = Path(__file__).read_text(encoding="utf-8")
    assert {name for name in used if name not in source} == set(), "unused fixture files"
    assert os.path.isfile(OUT / "README.md")
