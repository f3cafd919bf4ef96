"""Sample-id audits: did every rank and worker see the data it should, each epoch?

Read observed records (`read_observed`), optionally the expected ids (`read_expected` or
`IdRange`), then `audit_records` under an `AuditPolicy`; `audit_path` does all three.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from perfgate.audit.errors import AuditInputError
from perfgate.audit.formats import EXPECTED_SUFFIXES, OBSERVED_SUFFIXES
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
from perfgate.helpers.lazy import lazy_exports

if TYPE_CHECKING:
    from perfgate.audit.audit import audit_records
    from perfgate.audit.expected import ExpectedIds, IdRange, read_expected
    from perfgate.audit.ids import IdValue, SampleIds, StringPool
    from perfgate.audit.read import read_observed
    from perfgate.audit.read_parquet import parquet_available
    from perfgate.audit.records import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, ObservedRecords

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


# The readers and the audit itself (numpy, msgspec) load on first use; the report models and the
# suffix lists above are all the audit_samples tool schema needs, so the server starts without them.
_LAZY: dict[str, str] = {
    "audit_records": "perfgate.audit.audit",
    "ExpectedIds": "perfgate.audit.expected",
    "IdRange": "perfgate.audit.expected",
    "read_expected": "perfgate.audit.expected",
    "IdValue": "perfgate.audit.ids",
    "SampleIds": "perfgate.audit.ids",
    "StringPool": "perfgate.audit.ids",
    "read_observed": "perfgate.audit.read",
    "parquet_available": "perfgate.audit.read_parquet",
    "OPTIONAL_COLUMNS": "perfgate.audit.records",
    "REQUIRED_COLUMNS": "perfgate.audit.records",
    "ObservedRecords": "perfgate.audit.records",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


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
    from perfgate.audit.audit import audit_records
    from perfgate.audit.expected import IdRange, read_expected
    from perfgate.audit.read import read_observed
    from perfgate.helpers.deadline import checkpoint

    if expected is not None and expected_range is not None:
        raise AuditInputError("give either expected (a file) or expected_range, not both")
    records = read_observed(
        observed, example_cap=max(20, policy.example_limit), confine=confine, progress=progress
    )
    want: ExpectedIds | None = None
    if expected is not None:
        checkpoint()
        want = read_expected(expected, records.pool)
    elif expected_range is not None:
        want = IdRange(*expected_range)
    return audit_records(records, want, policy)
