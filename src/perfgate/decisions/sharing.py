"""What an export for sharing leaves out: host names, user names, the home folder, the workspace's place,
other absolute paths and dataset locations, each replaced by a stable placeholder.

The ledger keeps these on purpose (a comparison needs to know two runs shared a host, a window names the
data it read), so they are taken out only on the way out: `Sanitizer.text` and `Sanitizer.tree` rewrite
what `perfgate export` writes, and `Sanitizer.mapping` (placeholder -> real value) is saved under the
workspace's state folder, never in the exported folder, so `restore_text` can put the real values back.

Placeholders: ``<workspace>`` and ``<home>`` for those two folders; ``<redacted:KIND:TAG>`` for a host
(``host``), a user name (``user``), a dataset location (``dataset``) and the folder of any other absolute
path (``path``; the file's own name stays: ``<redacted:path:1a2b3c4d>/python3``). TAG is
`perfgate.security.envredactor.placeholder`'s keyed digest of the value, so one value gets one placeholder in every
export of the workspace, and nobody without the map (or the trust root's key) can test guesses against it.
"""

from __future__ import annotations

import getpass
import re
import socket
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from perfgate.benchmarking.workload.argv import is_number
from perfgate.benchmarking.workload.vocabulary import vocabulary_name
from perfgate.evidence import EvidenceRecord
from perfgate.security.envredactor import placeholder

__all__ = ["HOME", "SHARED_USERS", "WORKSPACE", "Sanitizer", "restore_text"]

WORKSPACE = "<workspace>"
HOME = "<home>"

_HOST_KEYS = frozenset(
    {"hostname", "host_name", "hostName", "nodename", "node_name", "slurm_node", "master_addr"}
)
"""Keys whose string value names a host, wherever they appear in a record (a rank's node facts, say)."""
_HOST_VARIABLES = frozenset(
    {
        "HOSTNAME",
        "MASTER_ADDR",
        "SLURMD_NODENAME",
        "SLURM_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_NODELIST",
        "SLURM_SUBMIT_HOST",
        "SLURM_LAUNCH_NODE_IPADDR",
    }
)
_USER_VARIABLES = frozenset({"USER", "LOGNAME", "USERNAME", "SLURM_JOB_USER"})
_ENV_KEYS = frozenset({"env", "environment_changes", "comm_env"})
_ARGV_KEYS = frozenset({"command", "argv"})
# A setting that names where data is read from: Megatron's --data-path/--train-data-path, torchtitan's
# dataset_path, Hugging Face's --train_file, a DATA_DIR variable (the vocabulary's `dataset` entry too).
_DATA_NAME = re.compile(
    r"^(?:(?:train|valid|validation|val|eval|test)_)?(?:data|dataset|datasets|corpus)"
    r"(?:_(?:path|paths|dir|root|file|files|prefix|url|location|cache_path))?$"
    r"|^(?:train|valid|validation|val|eval|test)_files?$"
)
_DATA_VARIABLE = re.compile(r"(?:^|_)(?:DATA|DATASET|DATASETS)(?:_|$)")
_NOT_IDENTIFYING = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "0.0.0.0", "::1"})
SHARED_USERS = frozenset({"root", "user", "ubuntu", "admin", "nobody"})
"""Account names every machine has: they say nothing of who ran the job, and as words they are everywhere
("root cause", a JSON key ``root``). Their home folder is still replaced (``<home>``)."""
_SHORTEST = 2
"""Host and user names shorter than this are left alone: a one-letter name would rewrite every word."""
# An absolute path of two or more parts that does not continue a word, a URL or a placeholder.
_ABSOLUTE = re.compile(r"(?<![\w.\-/:~<>])(?:/[\w.+@%=,\-]+){2,}/?")


def _is_location(value: str) -> bool:
    return "/" in value or "\\" in value


class Sanitizer:
    """Replaces one export's identifying values (collected by `for_export`, or given) with placeholders,
    remembering each replacement for `mapping`.

    Args:
        workspace: the served folder (shown as ``<workspace>``).
        home: the user's home folder (shown as ``<home>``).
        hosts, users, datasets: values replaced wherever they appear (host and user names as whole names).
    """

    def __init__(
        self,
        workspace: Path,
        home: str,
        *,
        hosts: Collection[str] = (),
        users: Collection[str] = (),
        datasets: Collection[str] = (),
    ) -> None:
        self.mapping: dict[str, str] = {}
        hostnames = {v for v in hosts if len(v) >= _SHORTEST and v not in _NOT_IDENTIFYING}
        usernames = {v for v in users if len(v) >= _SHORTEST and v not in SHARED_USERS}
        names = hostnames | usernames
        literal: dict[str, str] = {}
        located = {d.rstrip("/") for d in datasets if d.rstrip("/")}  # '/data/x/' names '/data/x/train' too
        for kind, values in (("dataset", located), ("host", hosts), ("user", users)):
            for value in values:
                if (value in names or (kind == "dataset" and value)) and value not in literal:
                    literal[value] = placeholder(kind, value)
        for folder, name in (
            (str(workspace), WORKSPACE),
            (str(workspace.resolve()), WORKSPACE),
            (home, HOME),
        ):
            folder = folder.rstrip("/")
            if folder.count("/") >= 1 and folder not in literal:
                literal[folder] = name
        self._literal = literal

        # Longest first, so a workspace inside the home folder is named as the workspace; a host name only
        # as a whole name ('vm' in 'vm_4242.pt.trace.json', not in 'llvm' or 'vm-2'), a user name only as a
        # whole word, a folder or dataset only where it ends (not '/data/train' inside '/data/train2');
        # then any other absolute path.
        def alternative(value: str) -> str:
            if value in hostnames:
                return r"(?<![A-Za-z0-9\-])" + re.escape(value) + r"(?![A-Za-z0-9\-])"
            if value in usernames:
                return r"(?<![\w\-])" + re.escape(value) + r"(?![\w\-])"
            return r"(?<![\w.\-])" + re.escape(value) + r"(?![\w.\-])"

        alternatives = [alternative(v) for v in sorted(literal, key=len, reverse=True)]
        self._pattern = re.compile("|".join([*alternatives, _ABSOLUTE.pattern]))

    @classmethod
    def for_export(cls, workspace: Path, records: Iterable[EvidenceRecord]) -> Sanitizer:
        """A sanitizer for an export of ``records`` from ``workspace``: this host's names and user, and the
        hosts, users and dataset locations the records name."""
        hosts = {socket.gethostname()}  # not getfqdn(): a reverse DNS lookup can stall on a cluster node
        users = {getpass.getuser()}
        datasets: set[str] = set()
        for record in records:
            _collect(record.inputs, hosts, users, datasets)
            _collect(record.result, hosts, users, datasets)
            _collect({"command": record.command or []}, hosts, users, datasets)
        hosts |= {h.split(".", 1)[0] for h in hosts if not _is_ip(h)}
        hosts -= _NOT_IDENTIFYING
        return cls(workspace, str(Path.home()), hosts=hosts, users=users, datasets=datasets)

    def _replace(self, match: re.Match[str]) -> str:
        found = match.group()
        name = self._literal.get(found)
        if name is None:  # another absolute path: its folder goes, its own name stays
            folder, _, leaf = found.rstrip("/").rpartition("/")
            name = placeholder("path", folder)
            self.mapping[name] = folder
            return f"{name}/{leaf}" + ("/" if found.endswith("/") else "")
        self.mapping[name] = found
        return name

    def text(self, text: str) -> str:
        """``text`` with every identifying value replaced."""
        return self._pattern.sub(self._replace, text)

    def tree(self, value: Any) -> Any:
        """A JSON-like tree with every string (keys included) passed through `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            items = cast("Mapping[Any, Any]", value)
            return {self.text(k) if isinstance(k, str) else k: self.tree(v) for k, v in items.items()}
        if isinstance(value, (list, tuple)):
            return [self.tree(v) for v in cast("Iterable[Any]", value)]
        return value


def restore_text(text: str, mapping: Mapping[str, str]) -> str:
    """``text`` with each placeholder of ``mapping`` (placeholder -> real value) put back."""
    if not mapping:
        return text
    pattern = re.compile("|".join(re.escape(p) for p in sorted(mapping, key=len, reverse=True)))
    return pattern.sub(lambda m: mapping[m.group()], text)


def _is_ip(host: str) -> bool:
    return re.fullmatch(r"[\d.]+|[\da-fA-F:]+", host) is not None


def _collect(value: Any, hosts: set[str], users: set[str], datasets: set[str], key: str = "") -> None:
    """Walk one record part, adding what names a host, a user or a dataset location."""
    if isinstance(value, Mapping):
        items = cast("Mapping[Any, Any]", value)
        for k, v in items.items():
            name = str(k)
            if isinstance(v, str):
                if name in _HOST_KEYS or name in _HOST_VARIABLES:
                    hosts.add(v)
                elif name in _USER_VARIABLES:
                    users.add(v)
                elif _is_location(v) and (
                    _is_dataset_key(name) or (key in _ENV_KEYS and _DATA_VARIABLE.search(name))
                ):
                    datasets.add(v)
            if name in _ARGV_KEYS and isinstance(v, list):
                datasets.update(_argv_datasets([str(t) for t in cast("list[Any]", v)]))
            _collect(v, hosts, users, datasets, name)
    elif isinstance(value, list):
        for v in cast("list[Any]", value):
            _collect(v, hosts, users, datasets, key)


def _is_dataset_key(name: str) -> bool:
    spelled = name.strip().lower().replace("-", "_").rsplit(".", 1)[-1]
    return vocabulary_name(spelled) == "dataset" or _DATA_NAME.match(spelled) is not None


def _argv_datasets(tokens: list[str]) -> list[str]:
    """The values of a command line's data options (every value up to the next option: Megatron's
    ``--data-path 0.3 /a 0.7 /b`` names two), where they name a location."""
    out: list[str] = []
    reading = False
    for token in tokens:
        if token.startswith("-") and not is_number(token):
            flag, eq, value = token.partition("=")
            reading = _is_dataset_key(flag.lstrip("-")) and not eq
            if eq and _is_dataset_key(flag.lstrip("-")) and _is_location(value):
                out.append(value)
        elif reading and _is_location(token):
            out.append(token)
    return out
