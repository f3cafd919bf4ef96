"""Export one experiment as a conventional run directory, for sharing.

Layout: environment.json, command.txt, source.txt, baseline.json, candidate.json, comparison.json,
correctness.json, profiles/framework/, decisions.md.

By default every file is sanitised on the way out (`perfgate.decisions.sharing`): host and user names,
the home folder, the workspace's place, other absolute paths and dataset locations become placeholders,
and the map back to the real values is written under the workspace's state folder (`SHARE_MAPS`), never
in the exported folder. A binary artifact (a compressed trace is decompressed and sanitised; an npz is not)
is copied as it is and named in `Export.unsanitised`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from perfgate.decisions.experiments import Experiment
from perfgate.decisions.render import render_experiment
from perfgate.decisions.sharing import Sanitizer, restore_text
from perfgate.evidence import Artifact, EvidenceRecord, Ledger
from perfgate.evidence.access import as_dict, str_list
from perfgate.evidence.artifacts import copy_artifact

__all__ = ["SHARE_MAPS", "Export", "export_experiment", "restore_export", "share_map_path"]

SHARE_MAPS = "exports"
"""The folder, under the workspace's state folder, that keeps each sanitised export's map back."""
_TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".txt", ".md", ".log", ".csv", ".yaml", ".yml", ".toml"})
"""Artifacts read as text (line by line) and sanitised; ``.gz`` of these too."""


@dataclass
class Export:
    """What `export_experiment` wrote: ``written``, the map back to the real values (None when not
    sanitised), and the artifacts copied without sanitising (binary formats)."""

    written: list[Path] = field(default_factory=list[Path])
    map_path: Path | None = None
    unsanitised: list[Path] = field(default_factory=list[Path])


def share_map_path(ledger: Ledger, exp_id: str, out: Path) -> Path:
    """Where the map of ``exp_id``'s export into ``out`` is kept: one file per experiment and folder."""
    folder = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:12]
    return ledger.state_dir / SHARE_MAPS / f"{exp_id}-{folder}.json"


def _is_text(name: str) -> bool:
    path = Path(name.removesuffix(".gz"))
    return path.suffix.lower() in _TEXT_SUFFIXES


def _rewrite(path: Path, edit: Callable[[str], str]) -> None:
    """``path`` (text, or gzip of text) rewritten line by line through ``edit``, in bounded memory."""
    zipped = path.suffix == ".gz"
    tmp = path.with_name(path.name + ".tmp")

    def opener(p: Path, writing: bool) -> IO[str]:
        mode = "wb" if writing else "rb"
        raw = gzip.GzipFile(p, mode) if zipped else p.open(mode)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")

    with opener(path, False) as src, opener(tmp, True) as dst:
        for line in src:
            dst.write(edit(line))
    os.replace(tmp, path)


def export_experiment(ledger: Ledger, exp: Experiment, out: Path, *, sanitize: bool = True) -> Export:
    """Write the run directory for ``exp`` into ``out`` (created), sanitised unless ``sanitize`` is
    False, with the map back saved at `share_map_path`.

    Raises:
        ArtifactChanged: an artifact to copy is not the bytes its record hashed (swapped after recording).
    """
    out.mkdir(parents=True, exist_ok=True)
    done = Export()
    written = done.written
    records = _records(ledger, exp)
    share = Sanitizer.for_export(ledger.workspace, records) if sanitize else None
    clean: Callable[[str], str] = share.text if share is not None else (lambda s: s)

    def put(name: str, value: Any) -> None:
        path = out / name
        tree = share.tree(value) if share is not None else value
        path.write_text(json.dumps(tree, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)

    def text(name: str, value: str) -> None:
        path = out / name
        path.write_text(clean(value), encoding="utf-8")
        written.append(path)

    def copy(artifact: Artifact, dest: Path) -> None:
        copy_artifact(ledger.workspace, artifact, dest)
        written.append(dest)
        if share is None:
            return
        if _is_text(dest.name):
            _rewrite(dest, share.text)
        else:
            done.unsanitised.append(dest)

    envs = ledger.get_many(exp.ids("environment"))
    if envs:
        env = envs[-1]
        artifact = next((a for a in env.artifacts if a.name == "environment.json"), None)
        if artifact is not None:
            copy(artifact, out / "environment.json")
        else:
            put("environment.json", env.result)
        provenance = as_dict(env.result.get("provenance"))
        text(
            "source.txt",
            "\n".join(f"{k}: {v}" for k, v in sorted(provenance.items())) + "\n"
            if provenance
            else "no provenance recorded\n",
        )

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
        text("command.txt", "\n".join(commands) + "\n")

    checks = ledger.get_many(exp.ids("correctness") + exp.ids("audit") + exp.ids("quality"))
    if checks:
        put(
            "correctness.json",
            [{"id": r.id, "tool": r.tool, "state": r.state.value, "result": r.result} for r in checks],
        )

    for profile in ledger.get_many(exp.ids("profile")):
        folder = out / "profiles" / "framework" / profile.id
        folder.mkdir(parents=True, exist_ok=True)
        put(f"profiles/framework/{profile.id}/summary.json", profile.result)
        for artifact in profile.artifacts:
            copy(artifact, folder / clean(artifact.name))  # a trace's file name carries its host
    for layer in ("framework", "system", "compute"):
        (out / "profiles" / layer).mkdir(parents=True, exist_ok=True)

    text("decisions.md", f"# {exp.id}\n\n" + render_experiment(exp))
    if share is not None:
        done.map_path = share_map_path(ledger, exp.id, out)
        done.map_path.parent.mkdir(parents=True, exist_ok=True)
        document = {"experiment": exp.id, "export": str(out.resolve()), "placeholders": share.mapping}
        done.map_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return done


def _records(ledger: Ledger, exp: Experiment) -> list[EvidenceRecord]:
    """Every record an export of ``exp`` reads (the comparison's windows included)."""
    records = ledger.get_many(list(dict.fromkeys(link.evidence_id for link in exp.links)))
    for comp in [r for r in records if r.tool == "compare_benchmarks"]:
        records += ledger.get_many(
            str_list(comp.inputs.get("baseline")) + str_list(comp.inputs.get("candidate"))
        )
    return records


def restore_export(ledger: Ledger, exp_id: str, out: Path) -> list[Path]:
    """Put the real values back into the text files of ``exp_id``'s sanitised export in ``out``, from its
    map; returns the files rewritten.

    Raises:
        FileNotFoundError: no map for that export (it was not sanitised, or was made elsewhere).
    """
    document = json.loads(share_map_path(ledger, exp_id, out).read_text(encoding="utf-8"))
    mapping: dict[str, str] = document["placeholders"]
    rewritten: list[Path] = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        if _is_text(path.name):
            _rewrite(path, lambda line: restore_text(line, mapping))
            rewritten.append(path)
        restored = restore_text(path.name, mapping)
        if restored != path.name:
            path = path.rename(path.with_name(restored))
    return rewritten
