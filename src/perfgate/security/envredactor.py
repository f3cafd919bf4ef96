"""Redaction of secrets and sanitisation of host identity: the `Redactor` collect_env applies to what it
records, and the pieces the one redaction layer (`perfgate.security.scrubber`) builds on.

Two different jobs, applied in this order to every string of a result and to every text artifact:

1. **Secrets** (never recoverable from the record): values of environment variables whose names look
   secret (token, key, secret, password, passwd, credential, cookie, auth, ...), credentials embedded in
   URLs (``scheme://user:pass@host``), values following secret-looking command-line flags, and whatever
   the one scanner (`perfgate.security.secretscan`) finds: known credential formats and high-entropy tokens. Each
   becomes a placeholder ``<redacted:KIND:TAG>`` whose tag is stable for the same secret (`placeholder`).
2. **Host identity** (kept meaningful, not identifying): the user's home directory becomes ``~``, other
   ``/home/<name>`` directories become ``/home/<user>``, and the host name becomes ``<hostname>``.

A value is scrubbed wherever it appears (a token pasted into a git diff, a command line or a tool's
output), not only next to its variable's name. Values shorter than `MIN_SECRET_CHARS` are replaced only
where the variable itself is reported, since replacing a 2-character string everywhere would mangle
unrelated text.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from perfgate.security.secretscan import find_secrets, is_secret_name, value_secrets

__all__ = [
    "HOSTNAME",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "Redactor",
    "is_redacted",
    "is_secret_name",
    "placeholder",
    "redact_env_values",
    "request_secrets",
    "secret_values",
]

REDACTED = "<redacted>"
"""What every placeholder starts as (``<redacted:KIND:TAG>``, see `placeholder`)."""
HOSTNAME = "<hostname>"
MIN_SECRET_CHARS = 4

# ``scheme://credentials@``: the credentials of a URL-valued variable are secrets wherever they appear.
# ``pre``: the digits and dots a scheme cannot start with (possessive: one pass, no retries).
_URL_CREDENTIALS = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<pre>[0-9+.\-]*+)(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*+://)(?P<cred>[^/\s@'\"]+)@"
)
_PLACEHOLDER = re.compile(r"<redacted(?::[a-z0-9\-]++:[0-9a-f]{8})?>")
_OTHER_HOMES = re.compile(r"(?P<root>/home/|/Users/)(?P<name>[^/\s'\":]+)")
_TAG_CHARS = 8
_TAG_KEYS: dict[tuple[str | None, ...], bytes] = {}
# What `TrustRoot.locate` reads to find the state folder: the key is located again only when these change.
_TRUST_VARIABLES = ("PERFGATE_STATE_DIR", "XDG_STATE_HOME", "HOME")


def _tag_key() -> bytes:
    """The key of placeholder tags: derived from the trust root's signing key (located as `TrustRoot.locate`
    does), so tags are stable across processes and restarts; a per-process key where there is none."""
    where = tuple(os.environ.get(name) for name in _TRUST_VARIABLES)
    key = _TAG_KEYS.get(where)
    if key is None:
        from perfgate.security.trustroot import TrustRoot, TrustRootError

        try:
            secret = TrustRoot.locate().ensure_key().secret
        except (TrustRootError, OSError, KeyError, ValueError):
            secret = secrets.token_bytes(32)
        key = _TAG_KEYS[where] = hmac.new(secret, b"perfgate-redaction-tag", hashlib.sha256).digest()
    return key


def placeholder(kind: str, value: str) -> str:
    """What stands for the secret ``value``: ``<redacted:KIND:TAG>``.

    TAG is the first 8 hex digits of an HMAC of the value under the trust root's key: equal secrets get
    equal placeholders (two runs with the same token still compare equal), and nobody without that key can
    test guesses of a short password against it.
    """
    tag = hmac.new(_tag_key(), value.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
    return f"<redacted:{kind}:{tag[:_TAG_CHARS]}>"


def is_redacted(text: str) -> bool:
    """Whether ``text`` is exactly one placeholder."""
    return _PLACEHOLDER.fullmatch(text) is not None


def redact_env_values(env: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` without secrets: a secret-named variable's whole value, and in every other value what
    `value_secrets` finds (a token under an ordinary name, in a PYTHONPATH-like list).

    For what the ledger keeps of a command's environment changes: the approval digest still binds the
    real values, but the stored record never holds a credential.
    """
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not isinstance(value, str):
            out[name] = value
        elif is_secret_name(name) and value and not is_redacted(value):
            out[name] = placeholder("named", value)
        else:
            out[name] = _replace_values(value, dict((s, k) for k, s in value_secrets(value)))
    return out


def _replace_values(text: str, found: Mapping[str, str]) -> str:
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, placeholder(found[secret], secret))
    return text


@functools.lru_cache(maxsize=4096)
def _variable_secrets(name: str, value: str) -> tuple[str, ...]:
    """The values to scrub because of one variable (memoized: the server's environment recurs in every
    scrubber)."""
    values: list[str] = []
    if is_secret_name(name) and len(value) >= MIN_SECRET_CHARS:
        values.append(value)
    # A password inside a URL-valued variable (DATABASE_URL=postgres://u:p@h) is a secret too.
    for match in _URL_CREDENTIALS.finditer(value):
        cred = match.group("cred")
        values.append(cred)
        values.extend(p for p in cred.split(":") if len(p) >= MIN_SECRET_CHARS)
    return tuple(values)


def secret_values(env: Mapping[str, str]) -> frozenset[str]:
    """The values `Redactor` scrubs because of ``env``: secret-named variables' values, URL credentials."""
    values: set[str] = set()
    for name, value in env.items():
        values.update(_variable_secrets(name, value))
    return frozenset(values)


def request_secrets(env: Mapping[str, str], argv: Sequence[str]) -> dict[str, str]:
    """Secret -> kind for what a request supplies: secret-named env values, values of secret-named flags
    (``--token X``, ``--api-key=X``), URL credentials, and what `value_secrets` finds in every env value
    and every argv token (after any flag, positional or ``--key=VALUE``)."""
    found: dict[str, str] = {}
    for value in secret_values(env):
        found[value] = "named"
    tokens = list(argv)
    for i, token in enumerate(tokens):
        if token.startswith("-"):
            flag, eq, value = token.partition("=")
            if is_secret_name(flag):
                value = value if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
                if len(value) >= MIN_SECRET_CHARS:
                    found[value] = "named"
    for value in [*env.values(), *tokens]:
        for kind, secret in value_secrets(value):
            found.setdefault(secret, kind)
    return found


@functools.lru_cache(maxsize=256)
def _secret_pattern(values: frozenset[str]) -> re.Pattern[str] | None:
    # Longest first, so a secret containing another secret is replaced whole.
    ordered = sorted(values, key=len, reverse=True)
    return re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None


def _outside_placeholders(text: str, scrub: Callable[[str], str]) -> str:
    """``scrub`` applied to the text between placeholders (a placeholder is never scrubbed again)."""
    if "<redacted" not in text:
        return scrub(text)
    parts: list[str] = []
    last = 0
    for m in _PLACEHOLDER.finditer(text):
        parts += [scrub(text[last : m.start()]), m.group()]
        last = m.end()
    parts.append(scrub(text[last:]))
    return "".join(parts)


class Redactor:
    """Scrubs one collection's secrets and host identity from strings, argv lists and JSON trees.

    Args:
        env: the environment the observed process had (its secret-looking values are scrubbed
            everywhere they appear).
        values: further values to scrub everywhere (as `secret_values` finds them in an environment), or
            a mapping of them to the kind their placeholder names (as `request_secrets` gives).
        homes: home directories to show as ``~``.
        hostnames: host names to show as ``<hostname>`` (short names, FQDNs).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        homes: Iterable[str] = (),
        hostnames: Iterable[str] = (),
        values: Iterable[str] | Mapping[str, str] = (),
    ) -> None:
        kinds = {v: "named" for v in secret_values(env)}
        if isinstance(values, Mapping):
            kinds.update(cast("Mapping[str, str]", values))
        else:
            kinds.update({v: "named" for v in values})
        self._kinds = kinds
        self._secrets = _secret_pattern(frozenset(kinds))
        self._homes = sorted({h.rstrip("/") for h in homes if h and h.rstrip("/")}, key=len, reverse=True)
        self._hostnames = sorted({h for h in hostnames if len(h) >= 3}, key=len, reverse=True)
        self.redactions = 0

    def fresh(self) -> Redactor:
        """A redactor with the same secrets, homes and host names, its count at zero (its lists are
        shared: they are replaced, never changed in place)."""
        other = object.__new__(Redactor)
        other.__dict__.update(self.__dict__)
        other.redactions = 0
        return other

    @property
    def secrets_pattern(self) -> str | None:
        """The pattern matching this redactor's secret values (None: it holds none)."""
        return self._secrets.pattern if self._secrets is not None else None

    def add_hostname(self, hostname: str) -> None:
        if len(hostname) >= 3 and hostname not in self._hostnames:
            self._hostnames = sorted([*self._hostnames, hostname], key=len, reverse=True)

    def add_home(self, home: str) -> None:
        home = home.rstrip("/")
        if home and home not in self._homes:
            self._homes = sorted([*self._homes, home], key=len, reverse=True)

    def _count(self, replacement: str) -> str:
        self.redactions += 1
        return replacement

    def secrets(self, text: str) -> str:
        """Remove secrets only (no host sanitisation): this redactor's values, then what the scanner finds."""
        if self._secrets is not None:
            pattern = self._secrets

            def literal(m: re.Match[str]) -> str:
                return self._count(placeholder(self._kinds.get(m.group(), "named"), m.group()))

            text = _outside_placeholders(text, lambda part: pattern.sub(literal, part))
        return _outside_placeholders(text, self._scanned)

    def _scanned(self, text: str) -> str:
        findings = find_secrets(text)
        if not findings:
            return text
        parts: list[str] = []
        last = 0
        for f in findings:
            parts += [text[last : f.start], self._count(placeholder(f.kind, text[f.start : f.end]))]
            last = f.end
        parts.append(text[last:])
        return "".join(parts)

    def host(self, text: str) -> str:
        """Replace home directories with ``~`` and host names with ``<hostname>``."""
        for home in self._homes:
            text = re.sub(r"(?<![\w.\-])" + re.escape(home) + r"(?![\w.\-])", "~", text)
        text = _OTHER_HOMES.sub(lambda m: m.group("root") + "<user>", text)
        for name in self._hostnames:
            text = re.sub(r"(?<![\w\-])" + re.escape(name) + r"(?![\w\-])", HOSTNAME, text)
        return text

    def text(self, text: str) -> str:
        """Secrets, then host identity."""
        return self.host(self.secrets(text))

    def env_value(self, name: str, value: str) -> str:
        """A reported variable: the whole value when the name looks secret, else scrubbed text."""
        if is_secret_name(name) and not is_redacted(value):
            return self._count(placeholder("named", value))
        return self.text(value)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {name: self.env_value(name, value) for name, value in env.items()}

    def argv(self, argv: Sequence[str]) -> list[str]:
        """A command line: values of secret-looking flags (``--token X``, ``--api-key=X``) go too."""
        out: list[str] = []
        hide_next = False
        for token in argv:
            if hide_next:
                out.append(token if is_redacted(token) else self._count(placeholder("named", token)))
                hide_next = False
                continue
            if token.startswith("-"):
                flag, eq, value = token.partition("=")
                if is_secret_name(flag):
                    if eq:
                        out.append(
                            flag
                            + "="
                            + (value if is_redacted(value) else self._count(placeholder("named", value)))
                        )
                    else:
                        out.append(token)
                        hide_next = True
                    continue
            out.append(self.text(token))
        return out

    def tree(self, value: Any) -> Any:
        """A JSON-like tree with every string (keys included) passed through `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            items = cast("Mapping[Any, Any]", value)
            return {self.text(k) if isinstance(k, str) else k: self.tree(v) for k, v in items.items()}
        if isinstance(value, (list, tuple)):
            seq = cast("Sequence[Any]", value)
            return [self.tree(v) for v in seq]
        return value
