"""Contract keys are canonical everywhere: synonyms, framework spellings, the served vocabulary, refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.benchmarking import Contract, ContractError, check_contract
from perfgate.benchmarking.workload.vocabulary import (
    NOT_KEYS,
    VOCABULARY,
    VOCABULARY_URI,
    render_vocabulary,
    vocabulary_name,
    vocabulary_problems,
)
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.skills.catalog import reference

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("spelling", "entry"),
    [
        ("micro_batch_size", "microbatch"),
        ("per_device_train_batch_size", "microbatch"),
        ("train_micro_batch_size_per_gpu", "microbatch"),
        ("gradient_accumulation_steps", "accumulation"),
        ("accumulate_grad_batches", "accumulation"),
        ("data_parallel_size", "data_parallel"),
        ("tensor_model_parallel_size", "tensor_parallel"),
        ("pipeline_model_parallel_size", "pipeline_parallel"),
        ("expert_model_parallel_size", "expert_parallel"),
        ("context_parallel_size", "context_parallel"),
        ("global_batch_size", "global_batch"),
        ("batch_size", "global_batch"),
        ("train_batch_size", "global_batch"),
        ("Seq-Length", "seq_len"),
        ("dataloader_num_workers", "workers"),
        ("learning_rate", "lr"),
        ("num_train_epochs", "epochs"),
        ("DEVICE_TYPE", "hardware"),
    ],
)
def test_framework_spellings_are_stored_under_one_name(spelling: str, entry: str) -> None:
    assert vocabulary_name(spelling) == entry


def test_a_batch_declared_in_framework_spellings_is_cross_checked() -> None:
    contract = Contract(
        {"global_batch_size": 64, "model_name": "m"},
        {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "data_parallel_size": 4},
    )
    assert contract.invariants == {"global_batch": 64, "model": "m"}
    assert contract.execution == {"microbatch": 8, "accumulation": 2, "data_parallel": 4}
    assert check_contract(contract) == []
    wrong = Contract({"batch_size": 64}, {"micro_batch_size": 8, "data_parallel_size": 4})
    (problem,) = check_contract(wrong)
    assert "global_batch 64 != microbatch 8 x accumulation 1 x data_parallel 4 = 32" in problem
    assert VOCABULARY_URI in problem  # every contract refusal names where the keys are explained
    with pytest.raises(ContractError, match="vocabulary"):
        check_contract(Contract({"global_batch": "64"}, {"microbatch": 8, "world_size": 8}))


def test_two_spellings_of_one_entry_merge_when_equal_and_are_refused_when_not() -> None:
    assert Contract({"batch_size": 64, "global_batch": 64}).invariants == {"global_batch": 64}
    with pytest.raises(ContractError) as refused:
        Contract({"batch_size": 64, "Global-Batch": 32})
    message = str(refused.value)
    assert "'batch_size'" in message and "'Global-Batch'" in message and "global_batch" in message
    assert VOCABULARY_URI in message


def test_members_of_one_entry_stay_distinct_keys() -> None:
    contract = Contract(
        {"lr": 1e-3, "weight_decay": 0.1, "learning_rate": 1e-3, "epochs": 3, "max_steps": 90}
    )
    assert contract.invariants == {"lr": 1e-3, "weight_decay": 0.1, "epochs": 3, "steps": 90}


def test_an_unknown_key_is_refused_with_the_nearest_entries_and_the_vocabulary_resource() -> None:
    problems = vocabulary_problems({"batchsize": 64, "lerning_rate": 1e-3}, {}, {})
    text = " ".join(problems)
    assert "'batchsize': global_batch (as batch_size)" in text
    assert "'lerning_rate': lr (as learning_rate)" in text
    assert VOCABULARY_URI in text


def test_spellings_that_name_no_single_entry_are_refused_with_what_to_declare() -> None:
    (problem, _uri) = vocabulary_problems({}, {"nproc_per_node": 8}, {})
    assert "'nproc_per_node' is not a contract key: declare world_size" in problem
    assert set(NOT_KEYS).isdisjoint(VOCABULARY)


def _bench(
    workspace: Path, name: str, invariants: dict[str, Any], execution: dict[str, Any], s: float
) -> None:
    doc = {
        "schema_version": 2,
        "invariants": invariants,
        "execution": execution,
        "unit": "samples",
        "runs": [{"seconds": s * f, "units": 256 * 100, "steps": 100} for f in (1.0, 1.02, 0.99)],
    }
    (workspace / f"{name}.json").write_text(json.dumps(doc))


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content


async def test_a_synonym_on_one_side_and_the_entry_on_the_other_compare_as_one_key(
    workspace: Path, mode: str
) -> None:
    _bench(
        workspace,
        "base",
        {"model_name": "resnet", "batch_size": 256, "dtype": "fp32", "data": "imagenet"},
        {"micro_batch_size": 256, "gradient_accumulation_steps": 1, "nproc": 1, "torch_compile": False},
        20.0,
    )
    _bench(
        workspace,
        "cand",
        {"model": "resnet", "global_batch": 256, "precision": "fp32", "dataset": "imagenet"},
        {"microbatch": 256, "accumulation": 1, "world_size": 1, "compile": True},
        10.0,
    )
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        base = await _call(client, "import_benchmark", {"paths": ["base.json"], "format": "benchmark_json"})
        cand = await _call(client, "import_benchmark", {"paths": ["cand.json"], "format": "benchmark_json"})
        assert base["contract"]["invariants"] == cand["contract"]["invariants"]
        assert base["contract"]["execution"] == {**cand["contract"]["execution"], "compile": False}
        cmp = await _call(
            client,
            "compare_benchmarks",
            {
                "baseline": [base["evidence_id"]],
                "candidate": [cand["evidence_id"]],
                "declared_changes": ["torch-compile"],
            },
        )
    assert cmp["status"] == "comparable", cmp["reasons"]
    assert cmp["declared_changes"] == ["compile"] and cmp["actual_changes"] == ["compile"]
    assert [d["field"] for d in cmp["differences"]] == ["contract.execution.compile"]


async def test_a_refused_contract_names_the_vocabulary_resource_and_the_resource_lists_every_key(
    workspace: Path, mode: str
) -> None:
    (workspace / "run.log").write_text("not read: the contract is refused first\n")
    odd = {"invariants": {"model": "m", "batchsize": 256}}
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(
            "import_benchmark", {"paths": ["run.log"], "format": "megatron", "contract": odd}
        )
        assert result.is_error
        refusal = result.content[0].text  # type: ignore[union-attr]
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        served = (await client.read_resource(VOCABULARY_URI)).contents[0].text  # type: ignore[union-attr]
        tools = (await client.list_tools()).tools
    assert VOCABULARY_URI in refusal and "global_batch (as batch_size)" in refusal
    assert VOCABULARY_URI in listed
    assert served == render_vocabulary() == reference("vocabulary").path.read_text(encoding="utf-8")
    words = set(re.findall(r"\w+", served))
    assert [s for s in VOCABULARY if s not in words] == []
    described = [t.name for t in tools if VOCABULARY_URI in (t.description or "")]
    assert {"run_benchmark_window", "import_benchmark", "compare_benchmarks"} <= set(described)


def test_command_line_degrees_are_read_through_the_vocabulary() -> None:
    from perfgate.benchmarking.workload.argv import argv_degrees

    argv = ["python", "train.py", "--tensor-model-parallel-size", "2", "--pp_degree=3", "--lr", "1"]
    argv += [
        "--parallelism.expert_parallel_degree",
        "4",
        "--cp-size",
        "2",
        "--data-parallel-shard-degree",
        "8",
    ]
    assert argv_degrees(argv) == {
        "tensor_parallel": "2",
        "pipeline_parallel": "3",
        "expert_parallel": "4",
        "context_parallel": "2",
        "data_parallel": "8",
    }


@pytest.mark.parametrize(
    ("spelling", "member"),
    [
        # Megatron-Core options and Megatron-Bridge / NeMo config fields
        ("--num-experts", "num_experts"),
        ("num_moe_experts", "num_experts"),
        ("--moe-router-topk", "router_topk"),
        ("--moe-expert-capacity-factor", "capacity_factor"),
        ("--moe-token-drop-policy", "token_drop_policy"),
        ("--moe-aux-loss-coeff", "aux_loss_coeff"),
        ("--moe-z-loss-coeff", "z_loss_coeff"),
        ("--moe-router-load-balancing-type", "load_balancing_type"),
        ("--moe-router-score-function", "router_score_function"),
        ("--moe-router-topk-scaling-factor", "router_topk_scaling_factor"),
        ("--moe-router-enable-expert-bias", "router_expert_bias"),
        ("--moe-router-dtype", "router_dtype"),
        # Megatron-DeepSpeed options
        ("--topk", "router_topk"),
        ("--moe-train-capacity-factor", "capacity_factor"),
        ("--moe-eval-capacity-factor", "eval_capacity_factor"),
        ("--moe-min-capacity", "min_capacity"),
        ("--moe-loss-coeff", "aux_loss_coeff"),
        ("--disable-moe-token-dropping", "dropless"),
        # DeepSpeed's MoE layer
        ("capacity_factor", "capacity_factor"),
        ("eval_capacity_factor", "eval_capacity_factor"),
        ("min_capacity", "min_capacity"),
        ("drop_tokens", "drop_tokens"),
        ("noisy_gate_policy", "noisy_gate_policy"),
        # torchtitan's MoEArgs
        ("top_k", "router_topk"),
        ("score_func", "router_score_function"),
        ("load_balance_coeff", "aux_loss_coeff"),
        ("route_scale", "router_topk_scaling_factor"),
        # Hugging Face MoE configs, MegaBlocks
        ("num_experts_per_tok", "router_topk"),
        ("router_aux_loss_coef", "aux_loss_coeff"),
        ("moe_top_k", "router_topk"),
        ("moe_num_experts", "num_experts"),
        ("moe_capacity_factor", "capacity_factor"),
        ("moe_loss_weight", "aux_loss_coeff"),
    ],
)
def test_routing_spellings_of_the_moe_frameworks_are_semantic_members_of_moe_routing(
    spelling: str, member: str
) -> None:
    from perfgate.benchmarking.workload.observed import option_name
    from perfgate.benchmarking.workload.vocabulary import classify

    key = option_name(spelling)  # a command-line option is read as the comparison reads it
    assert vocabulary_name(key) == member
    assert classify(key) == ("semantic", "vocabulary: moe_routing")


def test_a_routing_key_declared_as_an_execution_setting_is_refused_as_a_training_change() -> None:
    contract = Contract({"moe_router_topk": 2}, {})
    assert contract.invariants == {"router_topk": 2}
    problems = vocabulary_problems({}, {"moe_router_topk": 2, "moe_expert_capacity_factor": 1.0}, {})
    assert len([p for p in problems if "is a semantic setting" in p and "training_change" in p]) == 2
    refused = vocabulary_problems({}, {"moe_router_topk": 2}, {"moe_router_topk": "execution"})
    assert any("the vocabulary's class cannot be overridden" in p for p in refused)


def test_padding_experts_to_capacity_is_an_execution_setting_of_its_own() -> None:
    from perfgate.benchmarking.workload.vocabulary import classify

    assert vocabulary_name("moe-pad-expert-input-to-capacity") == "expert_padding"
    assert classify("moe_pad_expert_input_to_capacity")[0] == "execution"
