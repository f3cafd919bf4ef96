"""benchmarks/bench_paired.py's report and its rows in benchmarks/run.py's goals' table: the structure, not
the timings (the figures are the host's)."""

from __future__ import annotations

from test_bench_traces import _load


def _rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for host in ("quiet", "loaded"):
        for change in ("1.3x", "3x"):
            rows.append(
                {
                    "host": host,
                    "change": change,
                    "way": "today",
                    "launches": 12,
                    "wall_s": 90.0,
                    "verdict": "within_noise",
                }
            )
            rows.append(
                {
                    "host": host,
                    "change": change,
                    "way": "paired",
                    "launches": 6,
                    "wall_s": 20.0,
                    "verdict": "improved",
                }
            )
    return rows


def test_each_host_and_change_gets_one_ratio_of_the_paired_run_to_todays_calls() -> None:
    ratios = _load("bench_paired").ratios(_rows())
    assert {(r["host"], r["change"]) for r in ratios} == {
        (h, c) for h in ("quiet", "loaded") for c in ("1.3x", "3x")
    }
    assert all(r["launches"] == 0.5 and r["wall"] == 20.0 / 90.0 for r in ratios)
    assert all(r["verdicts"] == "within_noise -> improved" for r in ratios)


def test_the_goals_table_has_a_row_per_host_and_change() -> None:
    bench = _load("bench_paired")
    rows = _load("run").goal_rows({"bench_paired": {"rows": _rows(), "ratios": bench.ratios(_rows())}})
    assert len(rows) == 4
    assert all(r[2] == "<= 0.5x launches, <= 0.33x wall time" for r in rows)
    assert all(r[3].startswith("0.50x launches, 0.22x wall (within_noise -> improved): met") for r in rows)
    slow = [{**r, "wall": 0.5} for r in bench.ratios(_rows())]
    assert all(r[3].endswith("not met") for r in _load("run").goal_rows({"bench_paired": {"ratios": slow}}))
