"""The files the audit reads, by suffix (kept free of numpy: the audit_samples input schema lists them)."""

from __future__ import annotations

__all__ = ["EXPECTED_SUFFIXES", "OBSERVED_SUFFIXES"]

OBSERVED_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".csv", ".csv.gz", ".parquet", ".npz")
"""Observed-record files: JSON Lines and CSV (optionally gzipped), Parquet, NPZ."""

EXPECTED_SUFFIXES = (".json", ".jsonl", ".ndjson", ".txt", ".csv", ".npy", ".npz", ".parquet")
"""Files of expected ids."""
