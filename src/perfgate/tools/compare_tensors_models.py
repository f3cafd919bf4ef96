"""compare_tensors' output models: per-tensor results, the files compared and their producers, the
tolerance applied per dtype."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from perfgate.evidence import EvidenceState
from perfgate.security.digests import DIGEST_PATTERN

__all__ = [
    "MAX_LISTED",
    "CompareTensorsOutput",
    "DtypeTolerance",
    "FileProducer",
    "InputFile",
    "Role",
    "TensorResult",
]

MAX_LISTED = 200
"""Most tensors (and missing/extra keys) listed in the result; the artifact holds all of them."""

Role = Literal["reference", "candidate"]


class TensorResult(BaseModel):
    key: str
    status: Literal["match", "value_mismatch", "shape_mismatch", "dtype_mismatch"]
    shape_reference: list[int]
    shape_candidate: list[int]
    dtype_reference: str
    dtype_candidate: str
    compared_as: Literal["exact", "tolerance"] | None = Field(
        description="'exact' for integer/bool pairs, 'tolerance' otherwise, null when values were not compared."
    )
    atol: float
    rtol: float
    elements: int | None = Field(description="Element pairs compared; null when shapes differ.")
    mismatched: int | None = Field(
        description="Elements outside tolerance; every NaN/Inf position counts unless allow_nonfinite."
    )
    mismatched_fraction: float | None
    max_abs_error: float | None = Field(
        description="Largest |candidate - reference| over elements finite on both sides."
    )
    max_abs_error_index: list[int] | None = Field(description="Multi-dimensional index of max_abs_error.")
    max_rel_error: float | None = Field(
        description="Largest |candidate - reference| / |reference| over finite pairs with a non-zero reference."
    )
    max_abs_error_mismatched: float | None = Field(
        description="Largest absolute error among finite mismatched elements (what assert_close reports)."
    )
    max_rel_error_mismatched: float | None
    mean_abs_error: float | None
    cosine: float | None = Field(
        description="Cosine similarity over finite pairs; null if either is all zeros."
    )
    nonfinite_reference: int | None = Field(description="NaN and Inf elements in the reference.")
    nonfinite_candidate: int | None = Field(description="NaN and Inf elements in the candidate.")
    reference_key: str | None = Field(
        default=None, description="The key stored in the reference, when key_map changed it; else null."
    )
    candidate_key: str | None = Field(
        default=None, description="The key stored in the candidate, when key_map changed it; else null."
    )


class InputFile(BaseModel):
    role: Role
    path: str = Field(description="Path relative to the workspace (absolute when under a read root).")
    digest: str = Field(
        description="BLAKE3 of the bytes compared, with the algorithm's name: 'blake3:<hex>'.",
        pattern=DIGEST_PATTERN,
    )
    other_digests: list[str] = Field(
        default_factory=list[str],
        description="The same bytes under an older algorithm ('sha256:<hex>'), taken only when a run record "
        "written before BLAKE3 names a dump at this path.",
    )
    size_bytes: int


class FileProducer(BaseModel):
    role: Role
    path: str
    digest: str = Field(
        description="The digest that binds the file to its producer ('<algorithm>:<hex>', the algorithm the "
        "producer's record used); the file's BLAKE3 when unbound.",
        pattern=DIGEST_PATTERN,
    )
    evidence_id: str | None = Field(
        description="The benchmark window record whose launched run dumped exactly these bytes at this path "
        "(perfgate.harness.dump_tensors); null: unbound (no launched run is known to have produced it, e.g. a "
        "copied or edited file), and an unbound file cannot support a keep."
    )
    launch: int | None = Field(description="Which launch of that record wrote it.")
    code: dict[str, Any] | None = Field(
        description="The producing run's code state (git commit, dirty-diff digest), as its record holds it."
    )


class DtypeTolerance(BaseModel):
    dtype: str = Field(description="Reference dtype of the tensors compared with a tolerance.")
    tensors: int
    atol: float = Field(description="The loosest atol applied to them (overrides included).")
    rtol: float = Field(description="The loosest rtol applied to them.")
    equivalence_atol: float | None = Field(
        description="The shipped ceiling for an equivalent change at this dtype (null: none, only bit-exact)."
    )
    equivalence_rtol: float | None
    within_ceiling: bool = Field(
        description="False: a keep on this check cannot be an equivalent speedup (a training change at most)."
    )


class CompareTensorsOutput(BaseModel):
    evidence_id: str
    state: EvidenceState = Field(description="passed when status is match, failed otherwise.")
    status: Literal["match", "mismatch", "incomparable"] = Field(
        description="mismatch: some values exceed tolerance; incomparable: keys, shapes or dtypes differ; "
        "match: every common key agrees and the key sets are equal."
    )
    summary: str
    tensors: list[TensorResult] = Field(
        description=f"Per-key results, problems first; at most {MAX_LISTED} (all are in the comparison.json "
        "artifact)."
    )
    tensors_total: int
    missing_keys: list[str] = Field(description="Reference keys absent from the candidate (first ones).")
    missing_keys_total: int
    extra_keys: list[str] = Field(description="Candidate keys absent from the reference (first ones).")
    extra_keys_total: int
    keys_mapped: int = Field(
        description="Names key_map changed on either side (each with its originals in comparison.json)."
    )
    elements_compared: int
    bytes_compared: int
    files: list[InputFile] = Field(description="Every file read, with its digest (BLAKE3).")
    producers: list[FileProducer] = Field(
        default_factory=list[FileProducer],
        description="Per file read: the launched run that produced it, or unbound (evidence_id null).",
    )
    tolerance_by_dtype: list[DtypeTolerance] = Field(
        default_factory=list[DtypeTolerance],
        description="Per reference dtype compared with a tolerance: the loosest tolerance applied, and the "
        "shipped equivalence ceiling (torch.testing.assert_close defaults x the reordered-reduction allowance).",
    )
    notes: list[str]
