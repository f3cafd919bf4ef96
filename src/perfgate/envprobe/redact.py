"""Redaction of secrets and sanitisation of host identity in everything collect_env records.

Two different jobs, applied in this order to every string of a result and to every text artifact:

1. **Secrets** (never recoverable from the record): values of environment variables whose names look
   secret (token, key, secret, password, passwd, credential, cookie, auth, ...), credentials embedded in
   URLs (``scheme://user:pass@host``), values following secret-looking command-line flags, and strings
   shaped like well-known access tokens or private keys.
2. **Host identity** (kept meaningful, not identifying): the user's home directory becomes ``~``, other
   ``/home/<name>`` directories become ``/home/<user>``, and the host name becomes ``<hostname>``.

A value is scrubbed wherever it appears (a token pasted into a git diff, a command line or a tool's
output), not only next to its variable's name. Values shorter than `MIN_SECRET_CHARS` are replaced only
where the variable itself is reported, since replacing a 2-character string everywhere would mangle
unrelated text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

__all__ = [
    "HOSTNAME",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "Redactor",
    "is_secret_name",
    "redact_env_values",
    "secret_values",
]

REDACTED = "<redacted>"
HOSTNAME = "<hostname>"
MIN_SECRET_CHARS = 4

# Name segments (split on "_", "-", ".") that mark a variable or flag as secret. Whole segments, so
# TOKENIZERS_PARALLELISM or MONKEY_PATCH stay readable while HF_TOKEN and WANDB_API_KEY do not.
_SECRET_SEGMENTS = frozenset(
    {
        "TOKEN",
        "KEY",
        "KEYS",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWORDS",
        "PASSWD",
        "PASS",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "COOKIE",
        "COOKIES",
        "AUTH",
        "AUTHORIZATION",
        "AUTHTOKEN",
        "PAT",
        "SESSION",
        "SIGNATURE",
        "SAS",
        "PRIVATE",
        "BEARER",
        "APIKEY",
        "PASSPHRASE",
        "DSN",
    }
)
# Substrings that mark a secret even inside a longer segment (GITHUBTOKEN, DBPASSWORD, MYSECRETVALUE).
_SECRET_SUBSTRINGS = ("PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "COOKIE", "APIKEY", "ACCESSKEY", "TOKEN")
# ...but not these, which contain TOKEN without being one (TOKENS: counts, as in --tokens-per-step).
_NOT_SECRET_SEGMENTS = frozenset({"TOKENIZERS", "TOKENIZER", "TOKENIZATION", "TOKENIZE", "TOKENS"})

# Both patterns match from the start of a run of name characters (``pre``: the digits and dots a name
# cannot start with), with possessive names: the same matches as a plain ``name*`` would find, in one pass
# (a plain one retries from every letter of a long run: quadratic, 0.25 ms for 100 letters).
_URL_CREDENTIALS = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<pre>[0-9+.\-]*+)(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*+://)(?P<cred>[^/\s@'\"]+)@"
)
_TOKEN_SHAPES = re.compile(
    r"""
    (?<![A-Za-z0-9])
    (?:
      gh[pousr]_[A-Za-z0-9]{20,}                      # GitHub tokens
    | github_pat_[A-Za-z0-9_]{20,}
    | glpat-[A-Za-z0-9_\-]{20,}                       # GitLab
    | hf_[A-Za-z0-9]{20,}                             # Hugging Face
    | sk-[A-Za-z0-9_\-]{20,}                          # OpenAI-style keys
    | xox[abprs]-[A-Za-z0-9\-]{10,}                   # Slack
    | (?:AKIA|ASIA)[0-9A-Z]{16}                       # AWS access key ids
    | AIza[0-9A-Za-z_\-]{30,}                         # Google API keys
    | eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}   # JWTs
    )
    """,
    re.VERBOSE,
)
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=\-]{12,}")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)
# key=value or key: value pairs whose key looks secret, inside free text (configs in diffs, tool output).
_INLINE_ASSIGNMENT = re.compile(
    r"""(?<![A-Za-z0-9_.\-])(?P<pre>[0-9.\-]*+)(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*+)(?P<sep>\s*[:=]\s*)"""
    r"""(?P<quote>["']?)(?P<value>[^\s"',;]+)"""
)
_OTHER_HOMES = re.compile(r"(?P<root>/home/|/Users/)(?P<name>[^/\s'\":]+)")


def _segments(name: str) -> list[str]:
    return [s for s in re.split(r"[_\-.\s]+", name.upper()) if s]


def redact_env_values(env: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` with the value of every secret-named variable replaced by ``<redacted>``.

    For what the ledger keeps of a command's environment changes: the approval digest still binds the
    real values, and the human approving sees them, but the stored record never holds a credential.
    """
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """Whether a variable or flag called ``name`` should never have its value shown.

    >>> is_secret_name("HF_TOKEN"), is_secret_name("TOKENIZERS_PARALLELISM")
    (True, False)
    """
    segments = _segments(name.lstrip("-"))
    for segment in segments:
        if segment in _NOT_SECRET_SEGMENTS:
            continue
        if segment in _SECRET_SEGMENTS or any(sub in segment for sub in _SECRET_SUBSTRINGS):
            return True
    return False


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


@functools.lru_cache(maxsize=256)
def _secret_pattern(values: frozenset[str]) -> re.Pattern[str] | None:
    # Longest first, so a secret containing another secret is replaced whole.
    ordered = sorted(values, key=len, reverse=True)
    return re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None


class Redactor:
    """Scrubs one collection's secrets and host identity from strings, argv lists and JSON trees.

    Args:
        env: the environment the observed process had (its secret-looking values are scrubbed
            everywhere they appear).
        values: further values to scrub everywhere (as `secret_values` finds them in an environment).
        homes: home directories to show as ``~``.
        hostnames: host names to show as ``<hostname>`` (short names, FQDNs).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        homes: Iterable[str] = (),
        hostnames: Iterable[str] = (),
        values: Iterable[str] = (),
    ) -> None:
        found: set[str] = set(values)
        found.update(secret_values(env))
        self._secrets = _secret_pattern(frozenset(found))
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
        """Remove secrets only (no host sanitisation)."""
        if self._secrets is not None:
            text = self._secrets.sub(lambda m: self._count(REDACTED), text)
        text = _PRIVATE_KEY.sub(lambda m: self._count(REDACTED), text)
        text = _URL_CREDENTIALS.sub(
            lambda m: m.group("pre") + m.group("scheme") + self._count(REDACTED) + "@", text
        )
        text = _TOKEN_SHAPES.sub(lambda m: self._count(REDACTED), text)
        text = _BEARER.sub(lambda m: m.group(1) + " " + self._count(REDACTED), text)

        def assignment(m: re.Match[str]) -> str:
            if not is_secret_name(m.group("key")) or m.group("value") == REDACTED:
                return m.group(0)
            return m.group("pre") + m.group("key") + m.group("sep") + m.group("quote") + self._count(REDACTED)

        return _INLINE_ASSIGNMENT.sub(assignment, text)

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
        if is_secret_name(name):
            return self._count(REDACTED)
        return self.text(value)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {name: self.env_value(name, value) for name, value in env.items()}

    def argv(self, argv: Sequence[str]) -> list[str]:
        """A command line: values of secret-looking flags (``--token X``, ``--api-key=X``) go too."""
        out: list[str] = []
        hide_next = False
        for token in argv:
            if hide_next:
                out.append(self._count(REDACTED))
                hide_next = False
                continue
            if token.startswith("-"):
                flag, eq, _ = token.partition("=")
                if is_secret_name(flag):
                    if eq:
                        out.append(flag + "=" + self._count(REDACTED))
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
