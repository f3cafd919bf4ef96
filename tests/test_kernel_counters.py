"""Kernel counter exports of ncu / mcu become per-kernel verdicts, joined to the trace's kernels and recorded
as evidence; hostile files are refused with what to do next. Samples: tests/fixtures/kernel_counters/."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import TraceFormatError
from perfgate.traces.reading import counters as counters_module
from perfgate.traces.reading.counters import (
    KernelCounterTable,
    import_counter_csv,
    is_counter_csv,
    join_trace_kernels,
    name_keys,
)

pytestmark = pytest.mark.anyio

SAMPLES = Path(__file__).parent / "fixtures" / "kernel_counters"
REAL_DETAILS = SAMPLES / "ncu_details_sm100_cublaslt.csv"
RAW = SAMPLES / "ncu_raw_a100_written.csv"
MCU = SAMPLES / "mcu_details_s4000_written.csv"
MUSA_TRACE = Path(__file__).parent / "fixtures" / "traces" / "musa_s4000_rank1.json"


def _kernel(table: KernelCounterTable, part: str) -> Any:
    (found,) = [k for k in table.kernels if part in k.kernel]
    return found


def test_a_real_details_page_export_gives_the_verdict_and_the_occupancy_limiters() -> None:
    table = import_counter_csv(REAL_DETAILS)
    assert (table.tool, table.layout, table.launches) == ("ncu", "details", 1)
    (k,) = table.kernels
    # SM 23.59% and memory 21.68% of peak: neither unit is busy, the kernel waits on latency.
    assert k.bound == "latency"
    assert k.sm_throughput_pct == pytest.approx(23.59) and k.memory_throughput_pct == pytest.approx(21.68)
    assert k.duration_us == pytest.approx(406.24)
    assert k.registers_per_thread == 168 and k.shared_memory_per_block_bytes == 205696
    assert k.block_limits == {
        "registers": 1,
        "shared_memory": 1,
        "warps": 5,
        "block_slots": 32,
        "barriers": 9,
    }
    assert k.occupancy_limiters == ["registers", "shared_memory"]
    assert k.theoretical_occupancy_pct == pytest.approx(18.75)
    assert "latency-bound" in k.finding and "168/thread" in k.finding and "201 KiB/block" in k.finding
    # Frequencies and cycle counts are read and listed as not used, never guessed into a figure.
    assert "DRAM Frequency" in table.unrecognised_metrics and table.warnings == []


def test_a_raw_page_export_reads_the_units_row_and_thousands_separators() -> None:
    table = import_counter_csv(RAW)
    assert (table.tool, table.layout, table.launches) == ("ncu", "raw", 4)
    add = _kernel(table, "CUDAFunctor_add")
    gemm = _kernel(table, "cutlass::Kernel")
    reduce = _kernel(table, "reduce_kernel")
    assert add.launches == 2 and add.bound == "memory" and add.occupancy_limiters == []
    assert add.duration_us == pytest.approx((9.216 * 9.216 + 9.248 * 9.248) / (9.216 + 9.248))
    assert gemm.bound == "compute" and gemm.occupancy_limiters == ["shared_memory"]
    assert gemm.shared_memory_per_block_bytes == 73728
    assert reduce.bound == "latency" and reduce.occupancy_limiters == ["registers"]
    assert "achieved occupancy 22% of 50%" in reduce.finding
    assert table.unrecognised_metrics == ["l1tex__t_sector_hit_rate.pct"]


def test_an_mcu_export_in_the_same_layout_is_read_and_told_apart_by_its_device() -> None:
    table = import_counter_csv(MCU)
    assert (table.tool, table.layout) == ("mcu", "details")
    assert {k.kernel: k.bound for k in table.kernels} == {
        "flash_fwd_kernel": "latency",
        "gemm_kernel": "compute",
        "vectorized_elementwise_kernel": "memory",
    }
    gemm = _kernel(table, "gemm_kernel")
    assert gemm.shared_memory_per_block_bytes == pytest.approx(32770)  # Kbyte/block scaled
    assert table.unrecognised_metrics == ["Mem Busy"]


def test_an_nsys_summary_is_not_taken_for_a_counter_export(tmp_path: Path) -> None:
    summary = tmp_path / "r_cuda_gpu_kern_sum.csv"
    summary.write_text('"Time (%)","Total Time (ns)","Instances","Name"\n"90.0","1000","2","k"\n')
    assert not is_counter_csv(summary)
    assert all(is_counter_csv(p) for p in (REAL_DETAILS, RAW, MCU))


def test_the_forms_of_a_kernel_name_drop_params_then_templates_then_namespaces() -> None:
    keys = name_keys(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
    )
    assert keys["no_params"].startswith("at::native::vectorized_elementwise_kernel<4,")
    assert keys["no_templates"] == "at::native::vectorized_elementwise_kernel"
    assert keys["base_name"] == "vectorized_elementwise_kernel"


def test_counter_kernels_join_the_trace_kernels_exactly_by_base_name_ambiguously_or_by_prefix() -> None:
    table = import_counter_csv(RAW)
    gemm = next(k for k in table.kernels if "cutlass" in k.kernel)
    trace = {
        # The same kernel as the trace spells it (spaces inside templates differ from ncu's).
        gemm.kernel.replace("<", "< ").replace(">", " >"): 0.30,
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)": 0.2,
    }
    join_trace_kernels(table, trace)
    assert gemm.trace_match == "exact" and gemm.trace_share == pytest.approx(0.30)
    assert table.kernels[0] is gemm  # ranked by trace time now
    add = _kernel(table, "CUDAFunctor_add")
    assert add.trace_match == "exact"
    assert _kernel(table, "reduce_kernel").trace_match == "none"

    # mcu's short names (function base) meet the MUSA trace's demangled names; one base name that fits two
    # trace kernels is ambiguous and sums their time.
    mcu = import_counter_csv(MCU)
    join_trace_kernels(
        mcu,
        {
            "void mudnn::gemm_kernel<float, 128, 128>(float const*, float const*, float*)": 0.5,
            "void at::musa::vectorized_elementwise_kernel<4, at::musa::AddFunctor<float> >(int)": 0.1,
            "void at::musa::vectorized_elementwise_kernel<2, at::musa::MulFunctor<float> >(int)": 0.05,
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4> >(Flash_fwd_params)": 0.2,
        },
    )
    by = {k.kernel: k for k in mcu.kernels}
    assert by["gemm_kernel"].trace_match == "base_name" and by["gemm_kernel"].trace_share == 0.5
    assert by["vectorized_elementwise_kernel"].trace_match == "ambiguous"
    assert by["vectorized_elementwise_kernel"].trace_share == pytest.approx(0.15)
    assert [k.kernel for k in mcu.kernels] == [
        "gemm_kernel",
        "flash_fwd_kernel",
        "vectorized_elementwise_kernel",
    ]

    cut = KernelCounterTable.model_validate({**import_counter_csv(REAL_DETAILS).model_dump(), "path": "x"})
    cut.kernels[0].kernel = cut.kernels[0].kernel[:40] + "..."
    join_trace_kernels(cut, {import_counter_csv(REAL_DETAILS).kernels[0].kernel: 0.9})
    assert cut.kernels[0].trace_match == "prefix"


def test_the_real_trace_kernels_join_the_raw_sample(hta_traces: Path) -> None:
    from perfgate.traces import AnalysisOptions, analyze_trace

    prof = analyze_trace(hta_traces / "trace_diff_control_control.json.gz", AnalysisOptions(top_k=100))
    table = import_counter_csv(RAW)
    join_trace_kernels(table, {k.name: k.share for k in prof.top_kernels})
    assert {k.trace_match for k in table.kernels} == {"exact"}
    assert all(k.trace_share and k.trace_share > 0 for k in table.kernels)


# --------------------------------------------------------------------------- hostile files


def test_hostile_exports_are_refused_saying_how_to_re_export(tmp_path: Path, monkeypatch: Any) -> None:
    binary = tmp_path / "report.csv"
    binary.write_bytes(b"NVIDIA Nsight Compute\x00\x01\x02" * 100)
    with pytest.raises(TraceFormatError, match=r"binary data.*--csv --page details"):
        import_counter_csv(binary)

    latin = tmp_path / "latin.csv"
    latin.write_bytes(REAL_DETAILS.read_bytes().replace(b"cublaslt_gemm", b"cublaslt_g\xe9mm"))
    with pytest.raises(TraceFormatError, match=r"not UTF-8.*iconv"):
        import_counter_csv(latin)

    nothing = tmp_path / "app_output.csv"
    nothing.write_text("step,loss\n1,0.5\n")
    with pytest.raises(TraceFormatError, match=r"no ncu/mcu CSV header.*--page details"):
        import_counter_csv(nothing)

    header_only = tmp_path / "header.csv"
    header_only.write_text(REAL_DETAILS.read_text().splitlines()[0] + "\n")
    with pytest.raises(TraceFormatError, match="no kernel rows"):
        import_counter_csv(header_only)

    monkeypatch.setattr(counters_module, "MAX_COUNTER_CSV_BYTES", 1000)
    with pytest.raises(TraceFormatError, match=r"over the .* MiB.*--launch-count"):
        import_counter_csv(REAL_DETAILS)


def test_a_utf16_export_with_a_bom_is_read(tmp_path: Path) -> None:
    wide = tmp_path / "powershell.csv"
    wide.write_bytes(RAW.read_text().encode("utf-16"))  # what a PowerShell redirect writes
    assert is_counter_csv(wide)
    assert import_counter_csv(wide).launches == 4


def test_a_truncated_export_keeps_its_whole_rows_and_says_what_it_dropped(tmp_path: Path) -> None:
    text = RAW.read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: text.rindex('"3","4242"') + 200])  # the last launch's row ends mid-way
    table = import_counter_csv(cut)
    assert table.launches == 3
    assert any("too few columns" in w for w in table.warnings)


def test_formula_cells_are_never_taken_for_kernels_or_numbers(tmp_path: Path) -> None:
    rows = MCU.read_text().splitlines()
    planted = [rows[0], *rows[1:]]
    planted.append(planted[1].replace('"gemm_kernel"', '"=HYPERLINK(""http://x"",""k"")"'))
    planted.append(planted[1].replace('"38.50"', '"=1+2"'))
    path = tmp_path / "edited.csv"
    path.write_text("\n".join(planted) + "\n")
    table = import_counter_csv(path)
    assert all(not k.kernel.startswith("=") for k in table.kernels)
    assert any("spreadsheet formula" in w for w in table.warnings)
    gemm = _kernel(table, "gemm_kernel")
    assert gemm.memory_throughput_pct == pytest.approx(38.5)  # '=1+2' was not read as a value


# --------------------------------------------------------------------------- through the tools


async def test_analyze_trace_records_counters_joined_to_the_trace_as_evidence(
    workspace: Path, mode: str
) -> None:
    shutil.copy(MUSA_TRACE, workspace / "musa_rank1.json")
    shutil.copy(MCU, workspace / "mcu.csv")
    async with Client(build_server(ServerConfig.create(workspace, read_only=True)), mode=mode) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["musa_rank1.json", "mcu.csv"]})
        alone = await client.call_tool("analyze_trace", {"trace_paths": ["mcu.csv"]})
    assert not result.is_error, result.content
    out: Any = result.structured_content
    (table,) = out["kernel_counters"]
    assert table["path"] == "mcu.csv" and table["tool"] == "mcu"
    by = {k["kernel"]: k for k in table["kernels"]}
    assert by["gemm_kernel"]["trace_match"] == "base_name" and by["gemm_kernel"]["trace_share"] > 0
    assert by["flash_fwd_kernel"]["trace_match"] == "no_templates"  # no namespace to drop
    record = Ledger(workspace).get(out["evidence_id"])
    assert record.state == "executed"
    assert record.result["kernel_counters"][0]["kernels"] == table["kernels"]
    text = result.content[0].text  # type: ignore[union-attr]
    assert "kernel counters mcu.csv (mcu" in text and "compute-bound" in text
    # The export alone: the verdicts lead, ranked by counter time.
    assert not alone.is_error
    lead = alone.content[0].text  # type: ignore[union-attr]
    assert "ranked by counter time" in lead.splitlines()[0] or "ranked by counter time" in lead


async def test_profile_segment_summary_paths_take_a_counter_export_and_refuse_a_broken_one(
    workspace: Path, mode: str
) -> None:
    shutil.copy(REAL_DETAILS, workspace / "ncu.csv")
    (workspace / "broken.csv").write_bytes(
        b'"ID","Kernel Name","Metric Name","Metric Value"\n' + b"\x00" * 10
    )
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        ok = await client.call_tool("profile_segment", {"mode": "analyze", "summary_paths": ["ncu.csv"]})
        bad = await client.call_tool("analyze_trace", {"trace_paths": ["broken.csv"]})
    assert not ok.is_error, ok.content
    out: Any = ok.structured_content
    assert out["state"] == "executed" and out["imported_summaries"] == []
    assert out["kernel_counters"][0]["kernels"][0]["bound"] == "latency"
    assert bad.is_error
    assert "binary data" in bad.content[0].text  # type: ignore[union-attr]
