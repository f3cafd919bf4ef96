"""One redaction layer for everything perfgate persists or returns.

Applied to ledger records (so reports and exports, which read the ledger, inherit it), tool results,
approvals, the logs of commands kept as artifacts, messages shown to the agent and the server's own log.
What goes:

- values of secret-looking argv flags: ``--token X``, ``--password=X``, ``--api-key X``, ... (and those
  values wherever else they appear);
- values of environment variables with secret-looking names (in the server's environment or set by a
  request), wherever they appear;
- what the one scanner (`perfgate.security.secretscan`) finds: in every string, known credential formats (AWS,
  GitHub, GitLab, Slack, ``sk-`` keys, Google, JWTs, private key blocks, URL passwords, ``password=...``
  assignments) and high-entropy tokens; in every env value of any name and every argv token (after any
  flag, or positional), the stricter value rules too; what a request's values hold goes wherever else it
  appears (a log that prints it, say).

Each secret becomes ``<redacted:KIND:TAG>`` (`perfgate.security.envredactor.placeholder`): the same secret gets
the same placeholder, so stored argv and env still compare equal between two runs given the same token.
Redaction is one-way: approvals and digests bind the real values before anything is redacted.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from perfgate.security.envredactor import (
    REDACTED,
    Redactor,
    is_redacted,
    is_secret_name,
    placeholder,
    request_secrets,
    secret_values,
)
from perfgate.security.secretscan import value_secrets

__all__ = [
    "REDACTED",
    "LogRedactionFilter",
    "Scrubber",
    "flag_secrets",
    "install_log_filter",
    "scrub_bytes",
    "scrub_file",
    "scrub_json",
    "scrub_stream",
]

# A secret-looking flag and its value inside free text (a command line in a log line or a message).
_FLAG_IN_TEXT = re.compile(
    r"""(?P<flag>(?<![\w-])--?[A-Za-z][\w-]*)(?P<sep>=|[ \t]+)(?P<quote>["']?)(?P<value>[^\s"',;]+)"""
)
# Exact types that hold no text (subclasses take the general path).
_LEAVES = frozenset({int, float, bool, type(None)})
_ARGV_KEYS = frozenset({"argv", "command", "cmd", "launch_command", "user_command"})
_ENV_KEYS = frozenset({"env", "environment_changes"})


def flag_secrets(argv: Sequence[str]) -> list[str]:
    """Values given to secret-looking flags in ``argv`` (``--token X``, ``--api-key=X``)."""
    found: list[str] = []
    tokens = list(argv)
    for i, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        flag, eq, value = token.partition("=")
        if not is_secret_name(flag):
            continue
        if eq and value:
            found.append(value)
        elif not eq and i + 1 < len(tokens):
            found.append(tokens[i + 1])
    return [v for v in found if len(v) >= 4]


# The secret values of the server's environment, found again only when the environment changed
# (decoding os.environ alone costs more than scrubbing a small record).
_env_secrets: tuple[dict[Any, Any] | None, frozenset[str]] = (None, frozenset())
_ENV_LOCK = threading.Lock()


def _server_secrets() -> frozenset[str]:
    """`secret_values` of ``os.environ``, cached while its bytes are unchanged."""
    global _env_secrets
    raw = cast("dict[Any, Any] | None", getattr(os.environ, "_data", None))
    if raw is None:  # no underlying mapping to compare: find them every time
        return secret_values(dict(os.environ))
    with _ENV_LOCK:
        snapshot, found = _env_secrets
        if snapshot != raw:
            snapshot = dict(raw)  # taken first: a change while decoding is seen on the next call
            found = secret_values(dict(os.environ))
            _env_secrets = (snapshot, found)
        return found


# Strings found free of secrets, per secret set: the scrubber's secret pattern -> texts. Scrubbing is a
# pure function of the two, so a string once found clean is clean again; the text kept is always clean
# (the key is the secret pattern, in memory only), short strings only, and the sets are emptied when
# they hold `_CLEAN_MAX_ENTRIES` texts in all. Keys, enum values and the fixed sentences of tool results
# recur in every record.
_CLEAN: dict[str | None, set[str]] = {}
_CLEAN_MAX_ENTRIES = 8192
_clean_entries = 0

# The redactor of the plain scrubber (no env, no further secrets), built once per set of server secrets.
_plain: tuple[frozenset[str], Redactor] | None = None

_MEMO_CHARS = 512
_MEMO_ENTRIES = 65536
"""Strings a `Scrubber` remembers the scrubbed form of (short ones, up to this many)."""


class Scrubber:
    """Removes secrets from strings, argv lists, env mappings and JSON trees.

    Args:
        env: environment whose secret-named values (and URL credentials) are scrubbed wherever they
            appear; the server's own environment is always included.
        secrets: further literal values to scrub (flag values from a request's argv, say), or a mapping of
            them to the kind their placeholder names (`request_secrets`).
    """

    def __init__(
        self, env: Mapping[str, str] | None = None, secrets: Iterable[str] | Mapping[str, str] = ()
    ) -> None:
        global _plain
        if env is None and secrets == ():  # the plain scrubber (most records): its redactor is reused
            values = _server_secrets()
            plain = _plain
            if plain is None or plain[0] is not values:
                plain = _plain = (values, Redactor({}, values=values))
            self._redactor = plain[1].fresh()
        else:
            kinds = {v: "named" for v in _server_secrets()}
            if isinstance(secrets, Mapping):
                kinds.update(cast("Mapping[str, str]", secrets))
            else:
                kinds.update({v: "named" for v in secrets})
            self._redactor = Redactor(dict(env or {}), values=kinds)
        # Which strings this scrubber leaves alone depends only on its secret values (the patterns are
        # fixed): the key under which `_CLEAN` remembers them.
        self._clean_key = self._redactor.secrets_pattern
        self._clean = _CLEAN.setdefault(self._clean_key, set())
        # A scrubber's secrets are fixed once built, so a string scrubs the same way every time; records
        # repeat short strings thousands of times (keys' parts, dtypes, statuses): each is scrubbed once.
        self._seen: dict[str, tuple[str, int]] = {}
        self.structured = False
        """Whether `tree` met an env mapping or an argv list (under their keys): their secrets are then to be
        scrubbed everywhere, by a scrubber built for them (`for_tree`)."""
        self.keys_changed = False
        """Whether `tree` met a mapping key that is not exactly a ``str`` (JSON turns it into one, so its
        sorted place in canonical JSON can move once it is read back)."""

    @classmethod
    def for_values(cls, env: Mapping[str, Any] | None = None, argv: Sequence[Any] | None = None) -> Scrubber:
        """A scrubber for what a request or a tool input carries: its env and argv (`request_secrets`)."""
        str_env = {str(k): str(v) for k, v in (env or {}).items()}
        return cls(str_env, request_secrets(str_env, [str(a) for a in argv or ()]))

    @classmethod
    def for_tree(cls, *trees: Any) -> Scrubber:
        """A scrubber for every env mapping and argv list found (under env/argv-like keys) in ``trees``."""
        env: dict[str, str] = {}
        argv: list[str] = []

        def walk(value: Any, key: str | None) -> None:
            kind: type = type(value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            if kind is str or kind in _LEAVES:  # most of a record: skip the abstract-class checks below
                return
            if kind is dict or isinstance(value, Mapping):
                items = cast("Mapping[Any, Any]", value)
                if key in _ENV_KEYS:
                    env.update({str(k): str(v) for k, v in items.items() if isinstance(v, str)})
                for k, v in items.items():
                    if type(v) is str or type(v) in _LEAVES:
                        continue
                    walk(v, k if isinstance(k, str) else None)
            elif isinstance(value, (list, tuple)):
                seq = cast("Sequence[Any]", value)
                if key in _ARGV_KEYS and all(isinstance(v, str) for v in seq):
                    argv.extend([*cast("Sequence[str]", seq), "--"])
                else:
                    for v in seq:
                        walk(v, None)

        for tree in trees:
            walk(tree, None)
        return cls(env, request_secrets(env, argv))

    @property
    def redactions(self) -> int:
        return self._redactor.redactions

    def text(self, text: str) -> str:
        if text in self._clean:  # found clean before under these secrets
            return text
        seen = self._seen.get(text)
        if seen is not None:
            self._redactor.redactions += seen[1]  # counted as if scrubbed again
            return seen[0]
        before = self._redactor.redactions
        scrubbed = self._text(text)
        if len(text) <= _MEMO_CHARS:
            count = self._redactor.redactions - before
            if len(self._seen) < _MEMO_ENTRIES:
                self._seen[text] = (scrubbed, count)
            if not count and scrubbed == text:
                self._remember_clean(text)
        return scrubbed

    def _remember_clean(self, text: str) -> None:
        global _clean_entries
        if _clean_entries >= _CLEAN_MAX_ENTRIES:
            _CLEAN.clear()
            _clean_entries = 0
        if _CLEAN.get(self._clean_key) is not self._clean:  # emptied since: start this key's set again
            self._clean = _CLEAN.setdefault(self._clean_key, set())
        self._clean.add(text)
        _clean_entries += 1

    def _text(self, text: str) -> str:
        text = self._redactor.secrets(text)

        def flag(m: re.Match[str]) -> str:
            if (
                not is_secret_name(m.group("flag"))
                or m.group("value").startswith(REDACTED[:-1])
                or m.group("value").startswith("-")
            ):
                return m.group(0)
            self._redactor.redactions += 1
            return (
                m.group("flag") + m.group("sep") + m.group("quote") + placeholder("named", m.group("value"))
            )

        return _FLAG_IN_TEXT.sub(flag, text)

    def value(self, value: str) -> str:
        """One value a request supplies (an env value, an argv token): `text`, then the stricter value
        rules (`perfgate.security.secretscan.value_secrets`)."""
        out = self.text(value)
        for kind, secret in value_secrets(value):
            if secret in out:
                self._redactor.redactions += 1
                out = out.replace(secret, placeholder(kind, secret))
        return out

    def argv(self, argv: Sequence[str]) -> list[str]:
        out: list[str] = []
        hide_next = False
        for token in argv:
            if hide_next:
                if not is_redacted(token):
                    self._redactor.redactions += 1
                    token = placeholder("named", token)
                out.append(token)
                hide_next = False
                continue
            if token.startswith("-"):
                flag, eq, value = token.partition("=")
                if is_secret_name(flag):
                    if eq:
                        hide = bool(value) and not is_redacted(value)
                        out.append(flag + "=" + (placeholder("named", value) if hide else value))
                        self._redactor.redactions += hide
                    else:
                        out.append(token)
                        hide_next = True
                    continue
            out.append(self.value(token))
        return out

    def env(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if any(type(k) is not str for k in env):
            self.keys_changed = True
        out: dict[str, Any] = {}
        for k, v in env.items():
            if is_secret_name(k) and v and not (type(v) is str and is_redacted(v)):
                self._redactor.redactions += 1
                out[k] = placeholder("named", str(v))
            else:
                out[k] = self.value(v) if type(v) is str else self.tree(v)
        return out

    def tree(self, value: Any, key: str | None = None) -> Any:
        """A JSON-like tree with secrets removed; lists under argv-like keys are read as argv."""
        kind: type = type(value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if kind is str:
            return self.text(value)
        if kind in _LEAVES:  # numbers, booleans and None: nothing to scrub, no abstract-class checks
            return value
        if isinstance(value, str):
            return self.text(value)
        if kind is dict or isinstance(value, Mapping):
            items = cast("Mapping[Any, Any]", value)
            if key in _ENV_KEYS:
                self.structured = True
                if all(isinstance(k, str) for k in items):
                    return self.env(cast("Mapping[str, Any]", items))
            text, tree, clean = self.text, self.tree, self._clean
            out: dict[Any, Any] = {}
            for k, v in items.items():  # strings found clean before are kept without a call
                if type(k) is str:
                    name = k
                else:
                    self.keys_changed = True
                    name = k if isinstance(k, str) else None
                kind: type = type(v)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
                out[(k if k in clean else text(k)) if name is not None else k] = (
                    (v if v in clean else text(v)) if kind is str else v if kind in _LEAVES else tree(v, name)
                )
            return out
        if isinstance(value, (list, tuple)):
            seq = cast("Sequence[Any]", value)
            if key in _ARGV_KEYS:
                self.structured = True
                if all(isinstance(v, str) for v in seq):
                    return self.argv(cast("Sequence[str]", seq))
            return [self.tree(v) for v in seq]
        return value


def scrub_bytes(data: bytes, scrub: Scrubber) -> bytes:
    """``data`` (a diff, a log) without secrets; bytes that are not UTF-8 pass through unchanged."""
    return scrub.text(data.decode("utf-8", errors="surrogateescape")).encode(
        "utf-8", errors="surrogateescape"
    )


def scrub_stream(source: BinaryIO, scrub: Scrubber, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """What is left to read of ``source`` (a log, a record), without secrets, in whole-line chunks: a secret
    is never cut in two (within a line of up to 16 chunks: a longer one is cut, to keep memory bounded).
    Bytes that are not UTF-8 pass through unchanged."""
    pending = b""
    while True:
        block = source.read(chunk_bytes)
        data = pending + block
        if not block:
            if data:
                yield scrub_bytes(data, scrub)
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < 16 * chunk_bytes:
                pending = data
                continue
            cut = len(data)
        yield scrub_bytes(data[:cut], scrub)
        pending = data[cut:]


def scrub_json(data: bytes, scrub: Scrubber) -> bytes:
    """A JSON document (what a run reports: a harness record) with every string in it, keys included,
    scrubbed; ``data`` itself when nothing was redacted.

    Each secret becomes its tagged placeholder, so two keys holding different secrets stay two keys and the
    same secret reads the same in every file and record.

    Raises:
        ValueError: not JSON, or nested past what can be walked.
    """
    import json

    before = scrub.redactions
    try:
        tree = json.loads(data)
        clean = scrub.tree(tree)
    except RecursionError as exc:
        raise ValueError("nested too deeply to scrub") from exc
    if scrub.redactions == before:
        return data
    return json.dumps(clean, separators=(",", ":"), allow_nan=True).encode("utf-8")


def scrub_file(path: Path, scrub: Scrubber, chunk_bytes: int = 1 << 20) -> int:
    """Rewrite a text log in place without secrets (streamed in whole-line chunks); returns redactions."""
    before = scrub.redactions
    tmp = path.with_name(f".{path.name}.scrub")
    with path.open("rb") as src, tmp.open("wb") as dst:
        for block in scrub_stream(src, scrub, chunk_bytes):
            dst.write(block)
    if scrub.redactions == before:
        tmp.unlink()
    else:
        os.replace(tmp, path)
    return scrub.redactions - before


class LogRedactionFilter(logging.Filter):
    """A logging filter that scrubs every record's message (the server's own log)."""

    def __init__(self) -> None:
        super().__init__()
        self._scrub = Scrubber()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a broken format string: leave it to the handler to report
            return True
        cleaned = self._scrub.text(message)
        if record.exc_info and record.exc_info[1] is not None:
            import traceback

            cleaned += "\n" + self._scrub.text("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
            record.exc_text = None
        record.msg, record.args = cleaned, None
        return True


def install_log_filter() -> None:
    """Scrub the root logger's handlers (and any added later through the root logger) of secrets."""
    root = logging.getLogger()
    flt = LogRedactionFilter()
    if not root.handlers:
        logging.basicConfig(level=logging.WARNING)
    for handler in root.handlers:
        handler.addFilter(flt)
    root.addFilter(flt)
