"""Sample-id audits: did every rank and worker see the data it should, each epoch?

Read observed records (`read_observed`), optionally the expected ids (`read_expected` or
`IdRange`), then `audit_records` under an `AuditPolicy`; `audit_path` does all three.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perfgate.audit.audit import audit_records
from perfgate.audit.errors import AuditInputError
from perfgate.audit.expected import EXPECTED_SUFFIXES, ExpectedIds, IdRange, read_expected
from perfgate.audit.ids import IdValue, SampleIds, StringPool
from perfgate.audit.read import OBSERVED_SUFFIXES, read_observed
from perfgate.audit.read_parquet import parquet_available
from perfgate.audit.records import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, ObservedRecords
from perfgate.audit.report import (
    AuditPolicy,
    AuditReport,
    DuplicateExample,
    EpochExamples,
    EpochReport,
    Finding,
    IdTypes,
    OwnerCount,
    RankCount,
    Severity,
)

__all__ = [
    "EXPECTED_SUFFIXES",
    "OBSERVED_SUFFIXES",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "AuditInputError",
    "AuditPolicy",
    "AuditReport",
    "DuplicateExample",
    "EpochExamples",
    "EpochReport",
    "ExpectedIds",
    "Finding",
    "IdRange",
    "IdTypes",
    "IdValue",
    "ObservedRecords",
    "OwnerCount",
    "RankCount",
    "SampleIds",
    "Severity",
    "StringPool",
    "audit_path",
    "audit_records",
    "parquet_available",
    "read_expected",
    "read_observed",
]


def audit_path(
    observed: Path,
    policy: AuditPolicy,
    expected: Path | None = None,
    expected_range: tuple[int, int] | None = None,
    confine: Callable[[Path], Path] | None = None,
    progress: Callable[[int, int, Path], None] | None = None,
) -> AuditReport:
    """Read and audit in one call; `expected` and `expected_range` are mutually exclusive.

    Raises:
        AuditInputError: unreadable inputs, or both expected forms given.
    """
    if expected is not None and expected_range is not None:
        raise AuditInputError("give either expected (a file) or expected_range, not both")
    records = read_observed(
        observed, example_cap=max(20, policy.example_limit), confine=confine, progress=progress
    )
    want: ExpectedIds | None = None
    if expected is not None:
        want = read_expected(expected, records.pool)
    elif expected_range is not None:
        want = IdRange(*expected_range)
    return audit_records(records, want, policy)
