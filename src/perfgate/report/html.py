"""Self-contained HTML pages per experiment (plots embedded as data URIs) and an index.

Nothing on a page refers outside it: no scripts, fonts, stylesheets or images from elsewhere, so a
page opens offline and can be attached to a review as one file.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from perfgate.decisions.experiments import Experiment, load_experiments
from perfgate.decisions.gates.environment import window_fingerprint
from perfgate.decisions.gates.registry import evaluate_keep
from perfgate.evidence import EvidenceRecord, Ledger
from perfgate.evidence.access import str_list
from perfgate.evidence.artifacts import ArtifactChanged, read_artifact
from perfgate.helpers.statefs import make_dirs, write_file

__all__ = ["render_experiment_page", "render_index", "write_report"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#1d1d1f;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;width:100%;margin:.5rem 0}th,td{border:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f7}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f5f5f7;padding:.6rem;overflow-x:auto;white-space:pre-wrap}
.passed,.keep{color:#0a7d2c;font-weight:600}.failed,.revert{color:#b3261e;font-weight:600}.not_applicable{color:#777}.unavailable{color:#8a5a00;font-style:italic}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:12px}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:.6rem;background:#eee;font-size:12px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _scalars(result: dict[str, Any], limit: int = 14) -> str:
    rows = [
        f"<tr><th>{_e(k)}</th><td>{_e(v if not isinstance(v, float) else f'{v:.6g}')}</td></tr>"
        for k, v in result.items()
        if k not in {"evidence_id", "state"} and isinstance(v, (int, float, str, bool)) and len(str(v)) < 200
    ][:limit]
    return f"<table>{''.join(rows)}</table>" if rows else ""


def _figures(ledger: Ledger, record: EvidenceRecord) -> str:
    parts: list[str] = []
    for artifact in record.artifacts:
        if not artifact.name.endswith(".png"):
            continue
        try:
            data = read_artifact(ledger.workspace, artifact)
        except ArtifactChanged as exc:
            parts.append(
                f'<p class="failed">{_e(record.tool)} {_e(record.id)}: {_e(exc)}; not shown '
                "(<code>perfgate ledger verify</code> lists every change)</p>"
            )
            continue
        uri = "data:image/png;base64," + base64.b64encode(data).decode()
        parts.append(
            f'<figure><img class="plot" alt="{_e(artifact.name)}" src="{uri}">'
            f"<figcaption>{_e(record.tool)} {_e(record.id)}: {_e(artifact.name)}</figcaption></figure>"
        )
    return "".join(parts)


def _env_diff(ledger: Ledger, baseline: list[EvidenceRecord], candidate: list[EvidenceRecord]) -> str:
    if not baseline or not candidate:
        return "<p>No baseline and candidate windows to compare.</p>"
    a = window_fingerprint(baseline[0], ledger.get) or {}
    b = window_fingerprint(candidate[0], ledger.get) or {}
    if not a and not b:
        return "<p>The windows carry no environment fingerprint.</p>"
    rows: list[str] = []
    for key in sorted(set(a) | set(b)):
        same = json.dumps(a.get(key), sort_keys=True) == json.dumps(b.get(key), sort_keys=True)
        mark = "" if same else ' class="failed"'
        rows.append(f"<tr{mark}><th>{_e(key)}</th><td>{_e(a.get(key))}</td><td>{_e(b.get(key))}</td></tr>")
    return "<table><tr><th>field</th><th>baseline</th><th>candidate</th></tr>" + "".join(rows) + "</table>"


def render_experiment_page(ledger: Ledger, exp: Experiment) -> str:
    """One experiment: decision, gates, evidence with plots, commands, environment diff."""
    decision = exp.decision
    verdict = decision.decision if decision else "open"
    gates = decision.gates if decision else [g.model_dump() for g in evaluate_keep(exp, ledger)]
    comparisons = ledger.get_many(exp.ids("comparison"))
    comp = comparisons[-1] if comparisons else None
    baseline = ledger.get_many(exp.ids("baseline") or (str_list(comp.inputs.get("baseline")) if comp else []))
    candidate = ledger.get_many(
        exp.ids("candidate") or (str_list(comp.inputs.get("candidate")) if comp else [])
    )

    body = [
        f'<p><a href="index.html">all experiments</a></p><h1>{_e(exp.id)} <span class="{_e(verdict)}">{_e(verdict.upper())}</span></h1>',
        "<table>",
        f"<tr><th>hypothesis</th><td>{_e(exp.hypothesis)}</td></tr>",
        f"<tr><th>classification</th><td>{_e(exp.classification)}</td></tr>",
        f"<tr><th>changed variable</th><td>{_e(exp.changed_variable)}</td></tr>",
    ]
    if decision:
        body.append(f"<tr><th>rationale</th><td>{_e(decision.rationale)}</td></tr>")
        if decision.rollback:
            body.append(f"<tr><th>rollback</th><td><code>{_e(decision.rollback)}</code></td></tr>")
        if decision.label:
            body.append(f"<tr><th>label</th><td>{_e(decision.label)}</td></tr>")
    body.append(f"<tr><th>refused keep attempts</th><td>{len(exp.attempts)}</td></tr></table>")

    body.append("<h2>Gates</h2><table><tr><th>gate</th><th>status</th><th>reason</th><th>evidence</th></tr>")
    for gate in gates:
        status = str(gate.get("status"))
        ids = ", ".join(str_list(gate.get("evidence_ids")))
        body.append(
            f'<tr><td>{_e(gate.get("name"))}</td><td class="{_e(status)}">{_e(status)}</td>'
            f"<td>{_e(gate.get('reason'))}</td><td><code>{_e(ids)}</code></td></tr>"
        )
    body.append("</table>")

    body.append("<h2>Evidence</h2>")
    seen: set[str] = set()
    ordered = [(link.role, link.evidence_id) for link in exp.links]
    ordered += [("baseline window", r.id) for r in baseline] + [("candidate window", r.id) for r in candidate]
    for role, evidence_id in ordered:
        if evidence_id in seen:
            continue
        seen.add(evidence_id)
        record = ledger.get(evidence_id)
        if record is None:
            body.append(f'<p class="failed">{_e(evidence_id)} is missing from the ledger</p>')
            continue
        flag = ' <span class="badge">profiled</span>' if record.profiled else ""
        body.append(
            f"<h3>{_e(role)}: {_e(record.tool)} <code>{_e(record.id)}</code> "
            f'<span class="{_e(record.state.value)}">{_e(record.state.value)}</span>{flag}</h3>'
        )
        body.append(_scalars(record.result))
        body.append(_figures(ledger, record))

    commands = [
        f"{w.id}: {' '.join(w.command or str_list(w.inputs.get('command')))}" for w in baseline + candidate
    ]
    body.append("<h2>Commands</h2><pre>" + _e("\n".join(commands) or "no windows") + "</pre>")
    body.append("<h2>Environment: baseline vs candidate</h2>" + _env_diff(ledger, baseline, candidate))
    return _page(f"perfgate {exp.id}", "\n".join(body))


def render_index(experiments: list[Experiment]) -> str:
    rows = [
        f'<tr><td><a href="{_e(e.id)}.html">{_e(e.id)}</a></td><td>{_e(e.classification)}</td>'
        f'<td>{_e(e.changed_variable)}</td><td class="{_e(e.decision.decision if e.decision else "open")}">'
        f"{_e(e.decision.decision if e.decision else 'open')}</td><td>{_e(e.hypothesis)}</td></tr>"
        for e in experiments
    ]
    body = (
        "<h1>perfgate experiments</h1><table><tr><th>experiment</th><th>classification</th>"
        "<th>changed variable</th><th>decision</th><th>hypothesis</th></tr>" + "".join(rows) + "</table>"
    )
    return _page("perfgate experiments", body)


def write_report(ledger: Ledger, which: str, out: Path) -> list[Path]:
    """Write ``<id>.html`` for one experiment (or every one for ``all``) plus ``index.html``.

    ``out`` is a resolved path, written following no link (`perfgate.helpers.statefs`): the default,
    ``.perfgate/report``, is the agent's to replace with a link, which must not make the operator's
    ``perfgate report`` write elsewhere.

    Raises:
        KeyError: ``which`` names no experiment.
        perfgate.helpers.safeopen.UnsafeFileError: ``out`` or a folder above it is a link.
    """
    experiments = load_experiments(ledger)
    if which != "all" and which not in experiments:
        raise KeyError(which)
    make_dirs(out)
    chosen = list(experiments.values()) if which == "all" else [experiments[which]]
    written: list[Path] = []
    for exp in chosen:
        path = out / f"{exp.id}.html"
        write_file(path, render_experiment_page(ledger, exp).encode())
        written.append(path)
    index = out / "index.html"
    write_file(index, render_index(list(experiments.values())).encode())
    written.append(index)
    return written
