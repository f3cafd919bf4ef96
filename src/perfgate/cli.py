"""The ``perfgate`` command line.

Heavy imports (the MCP SDK, uvicorn) happen inside the subcommands, so ``perfgate --help`` is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

if TYPE_CHECKING:
    from perfgate.evidence import Ledger
    from perfgate.security.trustroot import TrustRoot

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _workspace_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace",
        type=Path,
        default=Path(os.environ.get("PERFGATE_WORKSPACE", ".")),
        help="directory the server serves; evidence lives in WORKSPACE/.perfgate (default: cwd, or $PERFGATE_WORKSPACE)",
    )
    trust = parser.add_argument_group(
        "trust root (operator settings; the agent must not be able to write it)"
    )
    trust.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="keys, approvals, ledger anchors ($PERFGATE_STATE_DIR, default $XDG_STATE_HOME/perfgate)",
    )
    trust.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="operator configuration ($PERFGATE_CONFIG_DIR, default $XDG_CONFIG_HOME/perfgate)",
    )
    trust.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="the execution policy file ($PERFGATE_POLICY, default CONFIG_DIR/policy.toml)",
    )


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {raw!r}")
    return value


def _positive_int(raw: str) -> int:
    if not raw.isdigit() or int(raw) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {raw!r}")
    return int(raw)


def _trust(args: argparse.Namespace) -> TrustRoot:
    from perfgate.security.trustroot import TrustRoot

    return TrustRoot.locate(state_dir=args.state_dir, config_dir=args.config_dir, policy=args.policy)


def _fail(what: str, next_step: str) -> None:
    """The CLI's error shape: one line saying what is wrong, one saying what to do next."""
    print(f"perfgate: {what}", file=sys.stderr)
    print(f"next: {next_step}", file=sys.stderr)


def _cmd_serve(args: argparse.Namespace) -> int:
    workspace: Path = args.workspace
    if not workspace.is_dir():
        _fail(
            f"workspace {workspace} is not a directory", "create it, or pass --workspace DIR of your project"
        )
        return 2
    from perfgate.helpers.deadline import ParseLimits

    try:
        limits = ParseLimits.from_env()
    except ValueError as exc:
        _fail(str(exc), "set it to a positive number, or unset it for the default")
        return 2
    if args.parse_deadline_s is not None:
        limits = dataclasses.replace(limits, deadline_s=args.parse_deadline_s)
    if args.max_trace_events is not None:
        limits = dataclasses.replace(limits, max_trace_events=args.max_trace_events)
    # Start-up creates ~140k long-lived objects (the SDK, the tool models, their schemas) and almost no
    # garbage: cyclic collections would only rescan them (~45 ms of a cold start). Collect nothing until
    # the server is built, then freeze those objects out of every later collection.
    collecting = gc.isenabled()
    gc.disable()
    try:
        from perfgate.server import build_server
        from perfgate.serving.config import ServerConfig

        config = ServerConfig.create(
            workspace, read_only=args.read_only, read_roots=args.read_root, trust=_trust(args), limits=limits
        )
        server = build_server(config)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    from perfgate.security.scrubber import install_log_filter

    install_log_filter()  # the server's own log never carries a secret
    if args.transport == "stdio":
        from perfgate.transports.stdio import ClientGone, run_stdio

        try:
            run_stdio(server)
        except ClientGone as exc:
            _fail(str(exc), "reconnect from the agent host; the evidence recorded so far is kept")
            return 1
        return 0
    from perfgate.transports.http import TokenError, allowed_hosts, http_token, serve_http

    try:
        token, source = http_token(os.environ.get("PERFGATE_TOKEN"), args.token_file, config.trust.state_dir)
    except TokenError as exc:
        _fail(str(exc), "chmod 600 the token file, or set PERFGATE_TOKEN in the server's environment")
        return 2
    url_host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"perfgate: serving http://{url_host}:{args.port}/mcp; every request needs the bearer token in "
        f"{source}. Host config (JSON server list):\n"
        + json.dumps(
            {
                "mcpServers": {
                    "perfgate": {
                        "type": "http",
                        "url": f"http://{url_host}:{args.port}/mcp",
                        "headers": {"Authorization": "Bearer <the token>"},
                    }
                }
            },
            indent=2,
        ),
        file=sys.stderr,
    )
    serve_http(
        server,
        host=args.host,
        port=args.port,
        token=token,
        hosts=allowed_hosts(args.host, args.port, args.allow_host),
        origins=args.allow_origin,
    )
    return 0


def _existing_ledger(args: argparse.Namespace) -> Ledger | None:
    """The workspace's ledger, or None (with a message) when it has none: reading never creates one."""
    from perfgate.evidence import STATE_DIR_NAME, Ledger
    from perfgate.security.trustroot import CorruptKeyError

    workspace: Path = args.workspace
    if not (workspace / STATE_DIR_NAME / "ledger.db").exists():
        _fail(
            f"no ledger in {workspace / STATE_DIR_NAME}",
            "pass --workspace DIR of a project that perfgate served (its tools create the ledger)",
        )
        return None
    ledger = Ledger(workspace, _trust(args))
    if not ledger.verifiable and isinstance(ledger.key_error, CorruptKeyError):
        print(f"perfgate: error: {ledger.key_error}; everything shown is unverified", file=sys.stderr)
    elif not ledger.verifiable:
        print(
            f"perfgate: warning: the signing key in {ledger.trust.key_dir} is not readable here, so no record "
            "can be verified: everything shown is unverified (run as the operator)",
            file=sys.stderr,
        )
    else:
        problems = ledger.problems()
        if problems and args.command != "ledger":
            print(
                f"perfgate: warning: {len(problems)} record(s) fail verification and are left out; "
                "`perfgate ledger verify` says which",
                file=sys.stderr,
            )
    return ledger


def _cmd_ledger_retire(args: argparse.Namespace, tty_path: str = "/dev/tty") -> int:
    """`perfgate ledger retire`: the operator, at a terminal, acknowledges that the workspace's lost
    ledgers are gone. An agent has neither: no terminal, and the trust root is not its to write."""
    from perfgate.evidence import Ledger
    from perfgate.execution.approve_cli import EXIT_NO_TTY
    from perfgate.security.trustroot import TrustRootError

    workspace: Path = args.workspace.resolve()
    if not workspace.is_dir():
        _fail(f"workspace {workspace} is not a directory", "pass --workspace DIR of the project")
        return 2
    ledger = Ledger(workspace, _trust(args))
    lost = ledger.lost()
    if not lost:
        print(f"nothing to retire: the trust root remembers no lost ledger for {workspace}")
        return 0
    listed = "\n".join(f"  ledger {old['ledger_id']}: {old.get('seq')} records" for old in lost)
    if not sys.stdin.isatty():
        _fail(
            "refusing to retire a ledger without a terminal (stdin is not a TTY): its evidence is gone for good",
            f"the operator runs `perfgate ledger retire --workspace {workspace}` in a terminal",
        )
        return EXIT_NO_TTY
    try:
        with open(tty_path, encoding="utf-8") as tty_in, open(tty_path, "w", encoding="utf-8") as tty_out:
            tty_out.write(
                f"The trust root anchored these ledgers in {workspace}; they were deleted or replaced:\n"
                f"{listed}\nRetire them (their evidence is gone for good, later keeps no longer ask for it)? "
                'Type "retire" to confirm: '
            )
            tty_out.flush()
            answer = tty_in.readline().strip().lower()
    except OSError as exc:
        _fail(f"refusing to retire: no controlling terminal ({exc})", "run it in a terminal")
        return EXIT_NO_TTY
    if answer != "retire":
        print("nothing retired")
        return 1
    import getpass

    try:
        done = ledger.retire_lost(f"{getpass.getuser()} on {os.ttyname(0)}")
    except TrustRootError as exc:
        _fail(str(exc), "run it as the operator who owns the trust root (--state-dir, $PERFGATE_STATE_DIR)")
        return 2
    for entry in done:
        print(f"retired ledger {entry['ledger_id']} ({entry['records']} records) at {entry['retired_at']}")
    return 0


def _cmd_ledger(args: argparse.Namespace) -> int:
    if args.ledger_command == "retire":
        return _cmd_ledger_retire(args)
    ledger = _existing_ledger(args)
    if ledger is None:
        return 2
    if args.ledger_command == "verify":
        report = ledger.verify()
        for err in report.errors:
            print(f"ERROR {err}")
        if report.next_step:
            print(f"next: {report.next_step}")
        for warn in report.warnings:
            print(f"warning {warn}")
        if report.format_migrated_from is not None:
            print(f"upgraded: written in ledger format {report.format_migrated_from}, migrated on opening")
        signed = (
            f", {report.signed_records} signed by key {report.key_id}"
            if report.key_id
            else ", none verifiable"
        )
        print(f"{'ok' if report.ok else 'FAILED'}: {report.records} records checked{signed}")
        return 0 if report.ok else 1
    problems = ledger.problems() if ledger.verifiable else {}
    if args.id:
        record = ledger.get(args.id, trusted_only=False)
        if record is None:
            _fail(f"no evidence {args.id!r}", "`perfgate ledger show` lists the ids this ledger holds")
            return 2
        if args.id in problems:
            print(
                f"perfgate: warning: {args.id} is not trusted evidence: {problems[args.id]}", file=sys.stderr
            )
        print(json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True))
        return 0
    for record in ledger.records(tool=args.tool, limit=args.limit, trusted_only=False):
        flag = " profiled" if record.profiled else ""
        flag += " UNTRUSTED" if record.id in problems else ""
        print(
            f"{record.seq:>5}  {record.id}  {record.tool:<22} {record.state.value:<11} {record.created_at}{flag}"
        )
    return 0


def _cmd_schemas(args: argparse.Namespace) -> int:
    from perfgate.generated import check_schemas, write_schemas

    if args.check:
        drift = check_schemas()
        for line in drift:
            print(line)
        if drift:
            print("schemas drifted: run `perfgate schemas` and commit the result", file=sys.stderr)
            return 1
        print("schemas match")
        return 0
    for path in write_schemas():
        print(path)
    return 0


def _cmd_approve(args: argparse.Namespace) -> int:
    from perfgate.execution.approve_cli import approve

    return approve(
        args.workspace, args.id, deny=args.deny, runs=args.runs, vary=tuple(args.vary), trust=_trust(args)
    )


def _cmd_approvals(args: argparse.Namespace) -> int:
    from perfgate.execution.approve_cli import list_approvals

    return list_approvals(args.workspace, include_closed=args.all, as_json=args.json, trust=_trust(args))


def _cmd_policy(args: argparse.Namespace) -> int:
    from perfgate.execution.binding import file_sha256
    from perfgate.execution.policy import PolicyError, load_policy, workspace_policy_files

    trust = _trust(args)
    workspace: Path = args.workspace.resolve()
    if args.policy_command == "pin":
        path: Path = args.file if args.file.is_absolute() else workspace / args.file
        if not path.is_file():
            print(f"perfgate: {path} is not a file", file=sys.stderr)
            return 2
        rel = path.resolve().relative_to(workspace) if workspace in path.resolve().parents else path.resolve()
        from perfgate.envprobe.provenance import code_state

        state = code_state(workspace)
        print(
            f"# add to {trust.policy_file}; code_state: {state.short()} (any other code state asks a human)"
        )
        print(
            f'[[execution.allow]]\nscript = "{rel}"\nsha256 = "{file_sha256(path)}"\ncode_state = "{state.digest}"'
        )
        return 0
    print(f"trust root: {trust.describe()}")
    for found in workspace_policy_files(workspace):
        print(
            f"IGNORED {found}: workspace files are never obeyed; move its [execution] table to {trust.policy_file}"
        )
    try:
        policy = load_policy(workspace, trust)
    except PolicyError as exc:
        print(f"perfgate: {exc}", file=sys.stderr)
        return 1
    print(f"policy: {policy.describe_source()}; max_timeout_s {policy.max_timeout_s:g}")
    for rule in policy.allow:
        print(f"allow: {rule.label()}")
    if not policy.allow:
        print("allow: nothing (every command asks a human)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from perfgate.decisions.experiments import load_experiment
    from perfgate.decisions.export import export_experiment, restore_export, share_map_path
    from perfgate.evidence.artifacts import ArtifactChanged

    ledger = _existing_ledger(args)
    if ledger is None:
        return 2
    exp = load_experiment(ledger, args.experiment)
    if exp is None:
        _fail(
            f"no experiment {args.experiment!r} in {args.workspace}",
            "`perfgate ledger show --tool record_decision` lists the experiments",
        )
        return 2
    if args.restore:
        try:
            restored = restore_export(ledger, exp.id, args.out)
        except FileNotFoundError:
            _fail(
                f"no map of a sanitised export of {exp.id} into {args.out} ({share_map_path(ledger, exp.id, args.out)})",
                "restore runs in the workspace that made the export, on the folder it wrote",
            )
            return 2
        for path in restored:
            print(path)
        return 0
    try:
        done = export_experiment(ledger, exp, args.out, sanitize=not args.no_sanitize)
    except ArtifactChanged as exc:
        _fail(
            f"export of {exp.id} stopped: {exc}",
            "`perfgate ledger verify` lists what changed; record that evidence again before exporting",
        )
        return 1
    for path in done.written:
        print(path)
    if done.map_path is not None:
        print(
            f"sanitised: host and user names, home, workspace, absolute paths and dataset locations are "
            f"placeholders; the map back is {done.map_path} (not in the export; "
            f"`perfgate export {exp.id} {args.out} --restore` puts the real values back)",
            file=sys.stderr,
        )
    for path in done.unsanitised:
        print(f"not sanitised (binary): {path}: check it before sharing", file=sys.stderr)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from perfgate.helpers.safeopen import UnsafeFileError
    from perfgate.report.html import write_report

    ledger = _existing_ledger(args)
    if ledger is None:
        return 2
    # The operator's --out is taken where it leads; the default is in the agent-writable .perfgate/, where
    # a link is refused (write_report follows none).
    out: Path = args.out.resolve() if args.out else ledger.state_dir / "report"
    try:
        written = write_report(ledger, args.experiment, out)
    except KeyError:
        _fail(
            f"no experiment {args.experiment!r}", "`perfgate report all` writes every experiment and an index"
        )
        return 2
    except UnsafeFileError as exc:
        _fail(exc.strerror or str(exc), "remove the link, or pass --out to write the report elsewhere")
        return 2
    for path in written:
        print(path)
    return 0


def _cmd_skill_install(args: argparse.Namespace) -> int:
    from perfgate.skills.install import SkillConflictError, install_skill

    try:
        result = install_skill(Path(args.dir).expanduser(), force=args.force)
    except (SkillConflictError, OSError) as exc:
        if isinstance(exc, SkillConflictError):
            _fail(str(exc).splitlines()[0], "pick another folder, or pass --force to overwrite those files")
        else:
            _fail(
                str(exc).splitlines()[0] or type(exc).__name__,
                "remove or rename that path, then install again",
            )
        return 1
    for line in result.lines():
        print(line)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import importlib.util

    from perfgate.demo import DemoError, run_demo

    if importlib.util.find_spec("torch") is None:
        print("perfgate demo: torch is not installed in this interpreter", file=sys.stderr)
        print(f"next: {sys.executable} -m pip install torch, then run `perfgate demo` again", file=sys.stderr)
        return 2
    try:
        result = run_demo(args.workspace)
    except DemoError as exc:
        print(f"perfgate demo: {str(exc).splitlines()[0]}", file=sys.stderr)
        where = f" --workspace {exc.workspace}" if exc.workspace is not None else ""
        print(
            f"next: read the full answer and the evidence with `perfgate ledger show{where}`", file=sys.stderr
        )
        return 1
    speed = f"speedup {result.speedup:.2f}x" if result.speedup is not None else "no speedup measured"
    print(
        f"demo: {result.decision} ({speed}, verdict {result.verdict}); experiment {result.experiment_id} "
        f"in {result.workspace}"
    )
    if result.decision != "keep":
        print("the comparison could not tell the change from this machine's noise: recorded as inconclusive")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a two-line error: what is wrong, then the help to read (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\nnext: {self.prog} --help\n")


def _cmd_selftest(args: argparse.Namespace) -> int:
    from perfgate.selftest import SelftestError, run_selftest

    try:
        result = run_selftest(args.device, quick=args.quick, workspace=args.workspace)
    except SelftestError as exc:
        print(f"perfgate selftest: {exc}", file=sys.stderr)
        return 2
    print()
    print(result.report)
    print(f"ledger record: perfgate ledger show {result.record_id} --workspace {result.workspace}")
    return result.exit_code


def _build_parser() -> argparse.ArgumentParser:
    from perfgate import __version__

    parser = _Parser(prog="perfgate", description="MCP tool server for training speedups with evidence")
    parser.add_argument("--version", action="version", version=f"perfgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    _workspace_arg(serve)
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    serve.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="file (mode 0600) holding the bearer token every HTTP request needs; default $PERFGATE_TOKEN, "
        "else one generated into STATE_DIR/http-token",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="extra Host header value accepted over HTTP (repeatable; the bind address always is)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="Origin header value accepted over HTTP (repeatable; none by default: browsers are refused)",
    )
    serve.add_argument(
        "--read-only", action="store_true", help="do not register tools that run commands or write decisions"
    )
    serve.add_argument(
        "--read-root",
        type=Path,
        action="append",
        default=[],
        help="extra directory tools may read inputs from (repeatable); writes stay in the workspace",
    )
    serve.add_argument(
        "--parse-deadline-s",
        type=_positive_float,
        default=None,
        help="longest one call may spend parsing its input files (traces, sample records); default "
        "$PERFGATE_PARSE_DEADLINE_S, else 600",
    )
    serve.add_argument(
        "--max-trace-events",
        type=_positive_int,
        default=None,
        help="most events read from one trace file; default $PERFGATE_MAX_TRACE_EVENTS, else 100000000",
    )
    serve.set_defaults(handler=_cmd_serve)

    ledger = sub.add_parser("ledger", help="inspect and verify the evidence ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True)
    verify = ledger_sub.add_parser("verify", help="check the hash chain and artifacts; exit 1 on any edit")
    _workspace_arg(verify)
    retire = ledger_sub.add_parser(
        "retire",
        help="operator: acknowledge that a deleted or replaced ledger is gone, so keeps can pass again "
        "(interactive: needs a terminal and write access to the trust root)",
    )
    _workspace_arg(retire)
    show = ledger_sub.add_parser("show", help="list records, or print one record in full")
    _workspace_arg(show)
    show.add_argument("id", nargs="?", help="evidence id to print in full")
    show.add_argument("--tool", help="only this tool's records")
    show.add_argument("--limit", type=int, default=None, help="only the newest N records")
    ledger.set_defaults(handler=_cmd_ledger)

    schemas = sub.add_parser(
        "schemas", help="write JSON Schemas and the tools/list snapshot into the package"
    )
    schemas.add_argument("--check", action="store_true", help="fail when the checked-in schemas drifted")
    schemas.set_defaults(handler=_cmd_schemas)

    approve = sub.add_parser(
        "approve", help="approve a command an agent asked to run (interactive: needs a terminal)"
    )
    _workspace_arg(approve)
    approve.add_argument("id", help="the pending approval id the agent reported (ap-...)")
    approve.add_argument("--deny", action="store_true", help="refuse it instead (needs no terminal)")
    approve.add_argument(
        "--runs", type=int, default=None, help="calls the grant covers (default: the policy's grant_runs, 8)"
    )
    approve.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag whose value may differ between those calls, e.g. --vary=--lr (repeatable)",
    )
    approve.set_defaults(handler=_cmd_approve)

    approvals = sub.add_parser("approvals", help="list pending and granted command approvals")
    _workspace_arg(approvals)
    approvals.add_argument("--all", action="store_true", help="include denied and expired ones")
    approvals.add_argument("--json", action="store_true", help="print JSON")
    approvals.set_defaults(handler=_cmd_approvals)

    policy = sub.add_parser("policy", help="show the operator's execution policy, or print a pinned rule")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    policy_show = policy_sub.add_parser(
        "show", help="where the policy is, its rules, ignored workspace files"
    )
    _workspace_arg(policy_show)
    policy_pin = policy_sub.add_parser("pin", help="print an allowlist rule pinning FILE's sha256")
    _workspace_arg(policy_pin)
    policy_pin.add_argument("file", type=Path, help="the script (relative to the workspace)")
    policy.set_defaults(handler=_cmd_policy)

    export = sub.add_parser("export", help="write an experiment as a run directory (environment.json, ...)")
    _workspace_arg(export)
    export.add_argument("experiment", help="experiment id (exp-...)")
    export.add_argument("out", type=Path, help="directory to create")
    export.add_argument(
        "--no-sanitize",
        action="store_true",
        help="keep host and user names, home and absolute paths and dataset locations as recorded (by "
        "default they become placeholders, with the map back kept under .perfgate/exports/)",
    )
    export.add_argument(
        "--restore",
        action="store_true",
        help="put the real values back into a sanitised export in OUT, from its map",
    )
    export.set_defaults(handler=_cmd_export)

    report = sub.add_parser(
        "report", help="self-contained HTML pages per experiment, with plots, and an index"
    )
    _workspace_arg(report)
    report.add_argument("experiment", nargs="?", default="all", help="experiment id, or 'all' (default)")
    report.add_argument("--out", type=Path, default=None, help="output directory (default .perfgate/report)")
    report.set_defaults(handler=_cmd_report)

    demo = sub.add_parser("demo", help="run the whole loop on a bundled tiny CPU training job (needs torch)")
    demo.add_argument("--workspace", type=Path, default=None, help="where to run (default: a new temp dir)")
    demo.set_defaults(handler=_cmd_demo)

    selftest = sub.add_parser(
        "selftest",
        help="check that perfgate measures this machine's accelerator correctly (real tools, real device)",
    )
    selftest.add_argument(
        "--device",
        choices=["auto", "cuda", "rocm", "musa", "cpu"],
        default="auto",
        help="device to test (default: the first accelerator this interpreter's torch sees, else cpu)",
    )
    selftest.add_argument(
        "--quick", action="store_true", help="smaller workloads (on the CPU: about 30 s of CPU time)"
    )
    selftest.add_argument(
        "--workspace", type=Path, default=None, help="where to run (default: a new temp dir)"
    )
    selftest.set_defaults(handler=_cmd_selftest)

    skill = sub.add_parser("skill", help="the bundled agent skill (SKILL.md and references)")
    skill_sub = skill.add_subparsers(dest="skill_command", required=True)
    skill_install = skill_sub.add_parser(
        "install", help="write the skill into DIR as an agent skill folder (e.g. ~/.claude/skills/perfgate)"
    )
    skill_install.add_argument("dir", type=Path, help="the skill folder to create or update")
    skill_install.add_argument(
        "--force", action="store_true", help="overwrite files that differ (another skill, or local edits)"
    )
    skill_install.set_defaults(handler=_cmd_skill_install)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perfgate`` console script.

    No command ends in a traceback: an unexpected error (an exception group included) is reported as
    one line saying what went wrong and one saying what to do; ``PERFGATE_DEBUG=1`` adds the traceback.
    """
    args = _build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"perfgate {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  # the point: no traceback; ExceptionGroup is an Exception too
        return _report_unexpected(args.command, exc)


def _leaf(exc: BaseException) -> BaseException:
    """The first exception an exception group holds (groups nest), or ``exc`` itself."""
    for _ in range(100):
        inner: object = getattr(exc, "exceptions", None)
        if not isinstance(inner, tuple) or not inner:
            break
        first: object = cast("tuple[object, ...]", inner)[0]
        if not isinstance(first, BaseException):
            break
        exc = first
    return exc


def _report_unexpected(command: str, exc: BaseException) -> int:
    leaf = _leaf(exc)
    text = str(leaf).strip().splitlines()
    what = f"{type(leaf).__name__}: {text[0]}" if text else type(leaf).__name__
    print(f"perfgate {command}: failed: {what}", file=sys.stderr)
    if os.environ.get("PERFGATE_DEBUG"):
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    else:
        print(
            f"next: fix what the line above names and run it again; PERFGATE_DEBUG=1 perfgate {command} ... "
            "shows where it happened",
            file=sys.stderr,
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())
