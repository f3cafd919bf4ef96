"""The trust root: perfgate's keys, approvals, ledger anchors and operator policy, outside the workspace.

The agent perfgate serves can write its workspace (that is its job), so nothing that decides what may run
or what counts as evidence lives there. The trust root is two per-user directories:

- state (``$PERFGATE_STATE_DIR``, else ``$XDG_STATE_HOME/perfgate``, else ``~/.local/state/perfgate``):
  ``keys/`` (the signing key: records and approvals carry an HMAC under it), and per workspace
  ``workspaces/<id>/`` with the approvals database, the ledger anchor, the list of running commands and
  the records, logs and traces of the runs going on; ``harness/<digest>/`` (the harness entry and a copy of
  perfgate the runs import) and ``pycache/`` (the runs' compiled bytecode);
- config (``$PERFGATE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/perfgate``, else ``~/.config/perfgate``):
  ``policy.toml``, the operator's execution policy (``$PERFGATE_POLICY`` or ``--policy`` names another
  file).

Only the operator sets these, in the agent host's server configuration (``env`` or ``args`` of the
server entry); no tool input can. Directories are created ``0700`` and files ``0600``. The defence holds
when the agent cannot write (or read) the trust root: a separate OS user, or a host sandbox that
confines the agent's writes to the workspace (see the threat model in docs/approvals.md).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KEY_BYTES",
    "CorruptKeyError",
    "SigningKey",
    "TrustRoot",
    "TrustRootError",
    "create_private",
    "write_private",
]

KEY_BYTES = 32
_KEY_FILE = "current"


class TrustRootError(RuntimeError):
    """The trust root cannot be read or written (wrong owner, permissions, or a missing key)."""


class CorruptKeyError(TrustRootError):
    """The signing key file exists but holds no key: nothing it signed can be verified until it is replaced."""


def _xdg(env: Mapping[str, str], var: str, fallback: str) -> Path:
    value = env.get(var, "")
    if value and Path(value).is_absolute():
        return Path(value)
    return Path.home() / fallback


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _written_aside(path: Path, data: bytes) -> Path:
    """A private (0600) temporary file beside ``path`` holding ``data`` in full, fsynced: what
    `write_private` and `create_private` then put in place."""
    _private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically with mode 0600 (replacing any previous file)."""
    tmp = _written_aside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def create_private(path: Path, data: bytes) -> bool:
    """Create ``path`` (mode 0600) holding ``data`` unless it exists; True when this call created it.

    The data is written in full to a private temporary file, fsynced and then linked into place, so a
    reader never sees the file empty or partial, and of several processes racing to create it exactly one
    does: the others keep (and should read back) the winner's file.
    """
    tmp = _written_aside(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return True


@dataclass(frozen=True)
class SigningKey:
    """An HMAC-SHA256 key and its public id (the first 16 hex digits of its sha256)."""

    secret: bytes

    @functools.cached_property
    def key_id(self) -> str:
        return hashlib.sha256(b"perfgate-key-id:" + self.secret).hexdigest()[:16]

    @functools.cached_property
    def _keyed(self) -> hmac.HMAC:
        """HMAC-SHA256 with the key already absorbed: each MAC starts from a copy (the key's two blocks
        and the digest look-up are done once per key, not per MAC)."""
        return hmac.new(self.secret, digestmod=hashlib.sha256)

    def mac(self, purpose: str, message: str) -> str:
        """HMAC (hex) of ``message`` for one ``purpose`` (a MAC for one use never verifies for another)."""
        h = self._keyed.copy()
        h.update(f"{purpose}\x00{message}".encode())
        return h.hexdigest()

    def check(self, purpose: str, message: str, mac: str | None) -> bool:
        return mac is not None and hmac.compare_digest(self.mac(purpose, message), mac)


@dataclass(frozen=True)
class TrustRoot:
    """Where perfgate keeps what the agent must not be able to change."""

    state_dir: Path
    config_dir: Path
    policy_file: Path

    @classmethod
    def locate(
        cls,
        *,
        state_dir: Path | None = None,
        config_dir: Path | None = None,
        policy: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> TrustRoot:
        """The trust root from explicit paths (command-line flags), else the environment, else XDG."""
        env = os.environ if env is None else env
        state = state_dir or (
            Path(env["PERFGATE_STATE_DIR"])
            if env.get("PERFGATE_STATE_DIR")
            else _xdg(env, "XDG_STATE_HOME", ".local/state") / "perfgate"
        )
        config = config_dir or (
            Path(env["PERFGATE_CONFIG_DIR"])
            if env.get("PERFGATE_CONFIG_DIR")
            else _xdg(env, "XDG_CONFIG_HOME", ".config") / "perfgate"
        )
        policy_file = policy or (Path(env["PERFGATE_POLICY"]) if env.get("PERFGATE_POLICY") else None)
        state, config = state.expanduser().absolute(), config.expanduser().absolute()
        return cls(
            state, config, (policy_file.expanduser().absolute() if policy_file else config / "policy.toml")
        )

    # ------------------------------------------------------------------ keys

    @property
    def key_dir(self) -> Path:
        return self.state_dir / "keys"

    @property
    def key_path(self) -> Path:
        """The file holding the current signing key."""
        return self.key_dir / _KEY_FILE

    def key(self) -> SigningKey | None:
        """The current signing key, or None when there is none (never created, or lost)."""
        path = self.key_path
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TrustRootError(
                f"cannot read the signing key in {self.key_dir}: {exc.strerror or exc}"
            ) from exc
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) != KEY_BYTES:  # never sign with a short (or empty) key
            raise CorruptKeyError(
                f"the signing key {path} is corrupt (not {KEY_BYTES} bytes in hex). Records it signed can no "
                "longer be verified: move the file aside and the next append creates a new key"
            )
        return SigningKey(secret)

    def retired_key_ids(self) -> set[str]:
        """Ids of keys this trust root once had (so 'signed by a lost key' can be told from 'forged')."""
        try:
            text = (self.key_dir / "history").read_text()
        except OSError:
            return set()
        return {line.strip() for line in text.splitlines() if line.strip()}

    def ensure_key(self) -> SigningKey:
        """The current key, created now when there is none (a first start, or after a key loss).

        The key file is made by `create_private`: a process racing this one sees either no key or the whole
        key, and exactly one of them creates it.

        Raises:
            TrustRootError: the trust root is not writable by this user.
        """
        key = self.key()
        if key is not None:
            return key
        fresh = SigningKey(secrets.token_bytes(KEY_BYTES))
        try:
            created = create_private(self.key_path, (fresh.secret.hex() + "\n").encode())
            if created:
                with (self.key_dir / "history").open("a") as f:
                    f.write(fresh.key_id + "\n")
        except OSError as exc:
            raise TrustRootError(
                f"cannot create the signing key in {self.key_dir}: {exc.strerror or exc}. The trust root must "
                "belong to the operator (set PERFGATE_STATE_DIR or --state-dir to a directory you own)"
            ) from exc
        if created:
            return fresh
        key = self.key()  # another process's key got there first
        assert key is not None
        return key

    @property
    def pycache_dir(self) -> Path:
        """Where the interpreters of perfgate's runs read and write compiled bytecode
        (``PYTHONPYCACHEPREFIX``): never a ``__pycache__`` folder the agent can write."""
        return self.state_dir / "pycache"

    # ------------------------------------------------------------------ per-workspace state

    @staticmethod
    def workspace_id(workspace: Path) -> str:
        return hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:16]

    def workspace_dir(self, workspace: Path, *, create: bool = True) -> Path:
        """``state/workspaces/<id>``: approvals, the ledger anchor and the run list of one workspace."""
        path = self.state_dir / "workspaces" / self.workspace_id(workspace)
        if create:
            try:
                _private_dir(path)
                marker = path / "workspace"
                if not marker.exists():
                    marker.write_text(str(workspace.resolve()) + "\n")
            except OSError as exc:
                raise TrustRootError(
                    f"cannot write the trust root {self.state_dir}: {exc.strerror or exc}. It must belong to "
                    "the operator (set PERFGATE_STATE_DIR or --state-dir to a directory you own)"
                ) from exc
        return path

    @contextlib.contextmanager
    def locked(self, path: Path) -> Generator[None]:
        """An exclusive advisory lock on ``path`` (created 0600) for read-modify-write of small files."""
        from perfgate.helpers.filelock import held

        _private_dir(path.parent)
        with held(path):
            yield

    def read_json(self, path: Path) -> object | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise TrustRootError(f"cannot read {path}: permission denied") from exc
            raise
        except ValueError:
            return None

    def describe(self) -> str:
        return f"state {self.state_dir}, config {self.config_dir}, policy {self.policy_file}"
