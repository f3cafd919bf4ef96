"""Export one experiment as a conventional run directory.

Layout: environment.json, command.txt, source.txt, baseline.json, candidate.json, comparison.json,
correctness.json, profiles/framework/, decisions.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfgate.decisions.experiments import Experiment
from perfgate.decisions.render import render_experiment
from perfgate.evidence import EvidenceRecord, Ledger
from perfgate.evidence.access import as_dict, str_list
from perfgate.evidence.artifacts import copy_artifact

__all__ = ["export_experiment"]


def _dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export_experiment(ledger: Ledger, exp: Experiment, out: Path) -> list[Path]:
    """Write the run directory for ``exp`` into ``out`` (created); returns the files written.

    Raises:
        ArtifactChanged: an artifact to copy is not the bytes its record hashed (swapped after recording).
    """
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def put(name: str, value: Any) -> None:
        path = out / name
        _dump(path, value)
        written.append(path)

    envs = ledger.get_many(exp.ids("environment"))
    if envs:
        env = envs[-1]
        artifact = next((a for a in env.artifacts if a.name == "environment.json"), None)
        if artifact is not None:
            copy_artifact(ledger.workspace, artifact, out / "environment.json")
            written.append(out / "environment.json")
        else:
            put("environment.json", env.result)
        provenance = as_dict(env.result.get("provenance"))
        source = out / "source.txt"
        source.write_text(
            "\n".join(f"{k}: {v}" for k, v in sorted(provenance.items())) + "\n"
            if provenance
            else "no provenance recorded\n",
            encoding="utf-8",
        )
        written.append(source)

    comparisons = ledger.get_many(exp.ids("comparison"))
    baseline_ids = exp.ids("baseline")
    candidate_ids = exp.ids("candidate")
    if comparisons:
        comp = comparisons[-1]
        put("comparison.json", {"id": comp.id, "inputs": comp.inputs, "result": comp.result})
        baseline_ids = baseline_ids or str_list(comp.inputs.get("baseline"))
        candidate_ids = candidate_ids or str_list(comp.inputs.get("candidate"))
    windows: dict[str, list[EvidenceRecord]] = {
        "baseline": ledger.get_many(baseline_ids),
        "candidate": ledger.get_many(candidate_ids),
    }
    for side, records in windows.items():
        if records:
            put(
                f"{side}.json",
                [
                    {"id": r.id, "state": r.state.value, "inputs": r.inputs, "result": r.result}
                    for r in records
                ],
            )
    commands = [
        f"# {side} {r.id}\n{' '.join(r.command or r.inputs.get('command') or [])}"
        for side, rs in windows.items()
        for r in rs
    ]
    if commands:
        (out / "command.txt").write_text("\n".join(commands) + "\n", encoding="utf-8")
        written.append(out / "command.txt")

    checks = ledger.get_many(exp.ids("correctness") + exp.ids("audit") + exp.ids("quality"))
    if checks:
        put(
            "correctness.json",
            [{"id": r.id, "tool": r.tool, "state": r.state.value, "result": r.result} for r in checks],
        )

    for profile in ledger.get_many(exp.ids("profile")):
        folder = out / "profiles" / "framework" / profile.id
        folder.mkdir(parents=True, exist_ok=True)
        _dump(folder / "summary.json", profile.result)
        written.append(folder / "summary.json")
        for artifact in profile.artifacts:
            copy_artifact(ledger.workspace, artifact, folder / artifact.name)
            written.append(folder / artifact.name)
    for layer in ("framework", "system", "compute"):
        (out / "profiles" / layer).mkdir(parents=True, exist_ok=True)

    decisions = out / "decisions.md"
    decisions.write_text(f"# {exp.id}\n\n" + render_experiment(exp), encoding="utf-8")
    written.append(decisions)
    return written
