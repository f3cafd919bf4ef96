"""Command lines read as the comparison reads them: options, positionals, changes and the topology they set."""

from __future__ import annotations

from perfgate.benchmarking.workload.argv import (
    argv_changes,
    argv_degrees,
    argv_options,
    argv_topology,
    launched_argv,
    positionals,
)


def test_options_are_named_by_their_last_dotted_segment_in_snake_case() -> None:
    tokens = ["train.py", "--lr=0.1", "--train.Batch-Size", "8", "--compile", "--seed", "-3", "--eval"]
    assert argv_options(tokens) == {
        "lr": "0.1",
        "batch_size": "8",
        "compile": "true",
        "seed": "-3",
        "eval": "true",
    }


def test_positionals_skip_options_and_their_values_but_keep_the_script() -> None:
    assert positionals(["python", "train.py", "--lr", "0.1", "--steps=5", "config.yaml"]) == [
        "python",
        "train.py",
        "config.yaml",
    ]


def test_changes_name_each_changed_option_and_a_changed_script() -> None:
    base = ["python", "train.py", "--lr", "0.1", "--workers", "2"]
    cand = ["python", "other.py", "--lr", "0.1", "--workers", "4", "--fused"]
    assert argv_changes(base, cand) == ["--fused", "--workers", "positional arguments"]
    assert argv_changes(base, list(base)) == []


def test_a_slurm_launch_carries_its_resources_as_trailing_tokens() -> None:
    local = {"command": ["python", "train.py"]}
    slurm = {"command": ["python", "train.py"], "launcher": "slurm", "slurm": {"nodes": 2}}
    assert launched_argv(local) == ["python", "train.py"]
    assert launched_argv(slurm) == ["python", "train.py", "launcher=slurm", 'slurm={"nodes":2}']
    assert launched_argv({"launcher": "slurm"}) is None


def test_degrees_ignore_options_that_are_not_degrees_and_values_that_are_not_counts() -> None:
    assert argv_degrees(["train.py", "--tp", "auto", "--pp", "2", "--lr", "4"]) == {"pipeline_parallel": "2"}
    assert argv_degrees("python train.py --tp 2") == {}


def test_an_undeclared_degree_change_on_the_command_line_is_a_topology_change() -> None:
    changed, reasons = argv_topology(
        ["train.py", "--tp", "1"],
        ["train.py", "--tp", "2"],
        {"tensor_parallel": 1},
        {"tensor_parallel": 2},
        [],
    )
    assert changed == ["tensor_parallel"]
    assert len(reasons) == 1
    assert "changes tensor_parallel (1 -> 2) but it was not declared" in reasons[0]
    assert "per_device=true" in reasons[0]


def test_a_declared_degree_change_the_contracts_omit_asks_for_the_contract_entry() -> None:
    changed, reasons = argv_topology(
        ["train.py", "--tp=1"], ["train.py", "--tp=2"], {}, {}, ["tensor_parallel"]
    )
    assert changed == ["tensor_parallel"]
    assert reasons == [
        "the command line changes tensor_parallel but the baseline and candidate contracts do not declare it: "
        "add execution.tensor_parallel (baseline 1, candidate 2) so the comparison is of what ran"
    ]


def test_a_command_line_that_contradicts_its_contract_is_named() -> None:
    changed, reasons = argv_topology(
        ["train.py", "--pp", "2"],
        ["train.py", "--pp", "2"],
        {"pipeline_parallel": 2},
        {"pipeline_parallel": 4},
        [],
    )
    assert changed == []
    assert reasons == [
        "the candidate command line sets pipeline_parallel=2 but its contract declares 4: fix the contract to "
        "what ran"
    ]
