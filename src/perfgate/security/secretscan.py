"""The one secret scanner: where a text holds a credential, and of what kind.

Everything perfgate stores or shows passes through `perfgate.security.scrubber`, which asks this module what to
remove. Two entry points:

- `find_secrets(text)`: spans of free text (logs, diffs, records, messages) holding a secret;
- `value_secrets(value)`: the secrets inside one value a request supplies (an env value of any name, an
  argv token after any flag or positional), read more strictly since a value is one unit.

What counts, in free text:

- known formats: AWS access key ids (``AKIA...``) and secret keys (40 base64 characters, random-looking),
  GitHub (``ghp_``, ``github_pat_``, ...), GitLab (``glpat-``, ...), Slack (``xox?-``, webhook URLs),
  OpenAI / Anthropic-style ``sk-`` keys, Hugging Face ``hf_``, Google ``AIza``, Stripe, npm and PyPI
  tokens, JWTs, PEM private-key blocks, ``Bearer``/``Basic`` credentials, the password of
  ``scheme://user:password@host`` URLs, and the value of ``password=...``-style assignments whose name
  looks secret (`is_secret_name`);
- high-entropy tokens (`random_like`): a run of base64/url-safe characters (``A-Z a-z 0-9 + / _ -``) of at
  least `MIN_TOKEN_CHARS`, with both letter cases, at most half digits, at least 70% of the distinct
  characters a random base62 string of its length is expected to have, a letter-class/digit change
  between at least 30% of its neighbouring characters, and at most half of it in word-like runs (``abc``,
  ``Abc``, whole ``_``/``-`` parts like ``HEAD`` or ``86``). Random 20-64 character base62/url-safe tokens
  pass about 94% of the time; identifiers, CamelCase names, model names (``Meta-Llama-3-8B-Instruct``),
  paths (checked per ``/`` segment), C++ mangled names (``_Z...``) and perfgate's ids do not.

What is left alone on purpose: single-case runs, hex above all. sha256 digests and git commits are what
perfgate's records are made of (evidence, code states, approvals), so a hex run in free text is never a
secret by shape; a hex credential is found by its name (``*_KEY=``, ``--api-key``) or, inside a value a
request supplies, by `value_secrets`, which also takes hex runs of 32+ characters and single-case
letter-and-digit tokens of 16+ (outside paths and file names), and mixed-case tokens from 16 characters.

Why not Yelp's detect-secrets (1.5.0, the obvious candidate): it scans lines and reports the secret's
value, not where it is; its entropy plugins only look inside quoted strings, so an env value or an argv
token (never quoted) is not seen, and an unquoted AWS secret key is not reported at all; its settings are
process-global state, and it brings requests and PyYAML. These rules are a few regular expressions and one
counting pass per candidate.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "MIN_TOKEN_CHARS",
    "MIN_VALUE_TOKEN_CHARS",
    "Finding",
    "find_secrets",
    "is_secret_name",
    "random_like",
    "value_secrets",
]

MIN_TOKEN_CHARS = 20
"""Shortest run of token characters that free text can hold as a high-entropy secret."""
MIN_VALUE_TOKEN_CHARS = 16
"""Shortest token a request-supplied value (env value, argv token) can hold as a secret by shape."""
_MIN_HEX_VALUE_CHARS = 32


class Finding(NamedTuple):
    """A secret at ``text[start:end]``; ``kind`` names the rule that found it (``aws-secret-key``, ...)."""

    kind: str
    start: int
    end: int


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
# ...nor TOKEN followed by one of these: a mixture-of-experts setting about the tokens routed to experts
# (--moe-token-dispatcher-type flex, moe_token_drop_policy), whose value must stay comparable.
_MOE_TOKEN_SETTINGS = frozenset({"DISPATCHER", "DISPATCH", "DROP", "DROPPING"})


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key called ``name`` should never have its value shown.

    >>> is_secret_name("HF_TOKEN"), is_secret_name("TOKENIZERS_PARALLELISM")
    (True, False)
    """
    segments = re.split(r"[_\-.\s]+", name.lstrip("-").upper())
    for i, segment in enumerate(segments):
        if not segment or segment in _NOT_SECRET_SEGMENTS:
            continue
        if segment == "TOKEN" and i + 1 < len(segments) and segments[i + 1] in _MOE_TOKEN_SETTINGS:
            continue
        if segment in _SECRET_SEGMENTS or any(sub in segment for sub in _SECRET_SUBSTRINGS):
            return True
    return False


# Known formats: one alternation, a named group per kind (group names use "_" where kinds use "-").
_FORMATS = re.compile(
    r"""
    (?<![A-Za-z0-9])
    (?:
      (?P<aws_access_key_id>(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)[0-9A-Z]{16})(?![0-9A-Z])
    | (?P<github_token>gh[pousr]_[A-Za-z0-9]{20,}+|github_pat_[A-Za-z0-9_]{20,}+)
    | (?P<gitlab_token>gl(?:pat|dt|rt|ptt|cbt|ft|soat|imt)-[A-Za-z0-9_\-]{20,}+)
    | (?P<slack_token>xox[abposre]-[A-Za-z0-9\-]{10,}+)
    | (?P<slack_webhook>https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]{20,}+)
    | (?P<anthropic_key>sk-ant-[A-Za-z0-9_\-]{20,}+)
    | (?P<openai_key>sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}+)
    | (?P<stripe_key>(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}+)
    | (?P<huggingface_token>hf_[A-Za-z0-9]{20,}+)
    | (?P<google_api_key>AIza[0-9A-Za-z_\-]{30,}+)
    | (?P<npm_token>npm_[A-Za-z0-9]{30,}+)
    | (?P<pypi_token>pypi-[A-Za-z0-9_\-]{50,}+)
    | (?P<jwt>eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+)
    )
    """,
    re.VERBOSE,
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
    re.DOTALL,
)
# ``scheme://user:password@``: the password goes (a user alone is usually a name; a token used as the user
# is caught by its shape). ``pre``: the digits and dots a scheme cannot start with (one pass, no retries).
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.\-])[0-9+.\-]*+[A-Za-z][A-Za-z0-9+.\-]*+://[^/\s@:'\"]*+:(?P<value>[^/\s@'\"]++)@"
)
_BEARER = re.compile(r"(?i)\b(?:bearer|basic|token)\s+(?P<value>[A-Za-z0-9._~+/=\-]{12,}+)")
# key=value, key: value, "key": "value" whose key looks secret (configs in diffs, tool output).
_ASSIGNMENT = re.compile(
    r"""(?<![A-Za-z0-9_.\-])[0-9.\-]*+(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*+)["']?\s*[:=]\s*["']?"""
    r"""(?P<value>[^\s"',;<>]++)"""
)
_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{20,}+")
_CANDIDATE_SHORT = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{16,}+")
_BASE64_40 = re.compile(r"[A-Za-z0-9+/]{40}")
_HEX_OR_DIGITS = re.compile(r"[0-9a-f_\-]++|[0-9A-F_\-]++")
_WORD = re.compile(r"[a-z]{3,}+|[A-Z][a-z]{2,}+")
_PARTS = re.compile(r"[_\-]+")
_WORD_PART = re.compile(r"[A-Z]++[0-9]*+|[0-9]++")
_EXPECTED_DISTINCT = 0.7
_MIN_CLASS_CHANGES = 0.3
_MAX_WORD_SHARE = 0.5
_MAX_DIGIT_SHARE = 0.5


def _classes(text: str) -> list[int]:
    return [0 if c.islower() else 1 if c.isupper() else 2 for c in text if c.isalnum()]


def _changes(classes: list[int]) -> float:
    """Share of neighbouring characters whose class (lower, upper, digit) differs."""
    if len(classes) < 2:
        return 0.0
    return sum(1 for a, b in itertools.pairwise(classes) if a != b) / (len(classes) - 1)


def _distinct_enough(token: str, alphabet: int) -> bool:
    expected = alphabet * (1 - (1 - 1 / alphabet) ** len(token))
    return len(set(token)) >= _EXPECTED_DISTINCT * expected


def random_like(token: str, min_chars: int = MIN_TOKEN_CHARS) -> bool:
    """Whether one run of token characters reads as random (the high-entropy rule in the module docstring)."""
    token = token.rstrip("=")
    if len(token) < min_chars or token.startswith("_Z") or _HEX_OR_DIGITS.fullmatch(token):
        return False
    classes = _classes(token)
    if len(classes) < 0.8 * min_chars or 0 not in classes or 1 not in classes:
        return False
    if classes.count(2) > _MAX_DIGIT_SHARE * len(classes):
        return False
    if not _distinct_enough(token, 62) or _changes(classes) < _MIN_CLASS_CHANGES:
        return False
    words = sum(len(w) for w in _WORD.findall(token))
    words += sum(len(p) for p in _PARTS.split(token) if len(p) >= 2 and _WORD_PART.fullmatch(p))
    return words <= _MAX_WORD_SHARE * len(classes)


def _token_findings(run: str, offset: int, min_chars: int) -> Iterator[Finding]:
    """High-entropy findings in one run of token characters: a base64 string whole (an AWS secret key is
    40 of them), else each ``/`` segment (a path keeps its ordinary segments)."""
    if "/" in run:
        whole = run.rstrip("=")
        base64_shaped = _BASE64_40.fullmatch(whole) is not None or (
            "+" in whole and not whole.startswith("/") and "//" not in whole
        )
        if base64_shaped and random_like(run, min_chars):
            kind = "aws-secret-key" if len(whole) == 40 else "high-entropy"
            yield Finding(kind, offset, offset + len(run))
            return
        start = 0
        for segment in run.split("/"):
            if random_like(segment, min_chars):
                yield Finding("high-entropy", offset + start, offset + start + len(segment))
            start += len(segment) + 1
    elif random_like(run, min_chars):
        yield Finding("high-entropy", offset, offset + len(run))


def _all_findings(text: str) -> Iterator[Finding]:
    for m in _FORMATS.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        yield Finding(kind.replace("_", "-"), m.start(), m.end())
    if "PRIVATE KEY" in text:
        for m in _PRIVATE_KEY.finditer(text):
            yield Finding("private-key", m.start(), m.end())
    if "://" in text:
        for m in _URL_PASSWORD.finditer(text):
            yield Finding("url-password", m.start("value"), m.end("value"))
    for m in _BEARER.finditer(text):
        yield Finding("bearer", m.start("value"), m.end("value"))
    for m in _ASSIGNMENT.finditer(text):
        if is_secret_name(m.group("key")) and not m.group("value").startswith("<redacted"):
            yield Finding("assignment", m.start("value"), m.end("value"))
    for m in _CANDIDATE.finditer(text):
        yield from _token_findings(m.group(), m.start(), MIN_TOKEN_CHARS)


def _disjoint(findings: Iterator[Finding]) -> list[Finding]:
    """Leftmost first, the longest where two start together; a finding inside an earlier one is dropped."""
    out: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.start, -f.end)):
        if out and f.start < out[-1].end:
            if f.end > out[-1].end:  # overlapping tails: one span covering both
                out[-1] = out[-1]._replace(end=f.end)
            continue
        out.append(f)
    return out


def find_secrets(text: str) -> list[Finding]:
    """The secrets in free text, in order and non-overlapping (rules: the module docstring)."""
    return _disjoint(_all_findings(text))


# The parts of a request-supplied value: separated by what joins list items and assignments.
_VALUE_PART = re.compile(r"[^\s:,;=@'\"]++")
_SINGLE_CASE_TOKEN = re.compile(r"[a-z0-9_\-]++|[A-Z0-9_\-]++")
_HEX_RUN = re.compile(r"[0-9a-f]{32,}+|[0-9A-F]{32,}+")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]++")


def _single_case_random(part: str) -> bool:
    """A single-case letters-and-digits token (base32, base36) that reads as random: a long unbroken run,
    letters and digits both well represented, changing class often."""
    longest = max((len(r) for r in _ALNUM_RUN.findall(part)), default=0)
    if longest < MIN_VALUE_TOKEN_CHARS:
        return False
    classes = _classes(part)
    digits = classes.count(2) / len(classes)
    return 0.2 <= digits <= 0.8 and _changes(classes) >= _MIN_CLASS_CHANGES and _distinct_enough(part, 36)


@functools.lru_cache(maxsize=4096)
def value_secrets(value: str) -> tuple[tuple[str, str], ...]:
    """``(kind, secret)`` for each secret in one value a request supplies (an env value, an argv token).

    Free-text rules first, then, per part (split on whitespace and ``: , ; = @``, so a PYTHONPATH-like list
    or a ``--key=VALUE`` is read part by part): mixed-case tokens from `MIN_VALUE_TOKEN_CHARS`, and, where the
    part is no path or file name (no ``/`` or ``.``), hex runs of 32+ and single-case random tokens.
    """
    found = [(f.kind, value[f.start : f.end]) for f in find_secrets(value)]
    taken = {secret for _, secret in found}
    for m in _VALUE_PART.finditer(value):
        part = m.group()
        if len(part) < MIN_VALUE_TOKEN_CHARS or any(part in s or s in part for s in taken):
            continue
        for run in _CANDIDATE_SHORT.finditer(part):
            for f in _token_findings(run.group(), 0, MIN_VALUE_TOKEN_CHARS):
                found.append((f.kind, run.group()[f.start : f.end]))
        if "/" in part or "." in part or any(part in s for _, s in found):
            continue
        if _HEX_RUN.fullmatch(part) and any(c.isdigit() for c in part) and not part.isdigit():
            found.append(("hex-token", part))
        elif _SINGLE_CASE_TOKEN.fullmatch(part) and _single_case_random(part):
            found.append(("high-entropy", part))
    return tuple(dict.fromkeys(found))
