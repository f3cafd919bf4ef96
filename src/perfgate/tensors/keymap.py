"""Map tensor names before pairing, so checkpoints that name the same tensors differently compare.

A compiled module's state dict prefixes every name with ``_orig_mod.`` (``torch.compile(model)``) or
puts it mid-path (``layers.0._orig_mod.weight`` when a submodule was compiled); DDP adds ``module.``,
FSDP1 and activation-checkpoint wrappers add ``_fsdp_wrapped_module.`` and
``_checkpoint_wrapped_module.``; a converted checkpoint renames tensors outright. The mapping is applied
to both sides alike, in this order: leading prefixes stripped (repeatedly), whole path segments dropped,
exact renames. It never edits a file: the comparison pairs the mapped names and reports the originals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from perfgate.security.quoting import file_text
from perfgate.tensors._errors import TensorInputError

__all__ = ["KeyMapping"]


@dataclass(frozen=True)
class KeyMapping:
    """How names are rewritten before pairing.

    ``strip_prefixes``: leading strings removed while one matches (``module._orig_mod.x`` -> ``x``).
    ``drop_segments``: dotted path segments removed wherever they occur (``_orig_mod`` turns
    ``layers.0._orig_mod.weight`` into ``layers.0.weight``).
    ``rename``: exact ``(from, to)`` pairs applied after the two steps above.
    """

    strip_prefixes: tuple[str, ...] = ()
    drop_segments: tuple[str, ...] = ()
    rename: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if any(not p for p in self.strip_prefixes):
            raise TensorInputError("strip_prefixes: an empty prefix strips nothing; remove it")
        for segment in self.drop_segments:
            if not segment or "." in segment:
                raise TensorInputError(
                    f"drop_segments: {segment!r} must be one path segment without dots, e.g. '_orig_mod'"
                )
        sources = [src for src, _ in self.rename]
        if len(set(sources)) != len(sources):
            raise TensorInputError("rename: a name is renamed twice; give each source name once")
        if any(not src or not dst for src, dst in self.rename):
            raise TensorInputError("rename: names must not be empty")

    @property
    def empty(self) -> bool:
        return not (self.strip_prefixes or self.drop_segments or self.rename)

    def name(self, key: str) -> str:
        """The mapped name of ``key``."""
        changed = True
        while changed:
            changed = False
            for prefix in self.strip_prefixes:
                if key.startswith(prefix) and len(key) > len(prefix):
                    key = key[len(prefix) :]
                    changed = True
        if self.drop_segments:
            drop = set(self.drop_segments)
            parts = [p for p in key.split(".") if p not in drop]
            key = ".".join(parts) if parts else key
        return dict(self.rename).get(key, key)

    def apply(self, keys: Iterable[str], side: str) -> dict[str, str]:
        """Mapped name -> original key for one side's keys.

        Raises:
            TensorInputError: two of the side's keys map to the same name.
        """
        mapped: dict[str, str] = {}
        for key in keys:
            new = self.name(key)
            if new in mapped:
                raise TensorInputError(
                    f"{side}: key mapping sends both {file_text(mapped[new])} and {file_text(key)} to {file_text(new)}; "
                    "narrow "
                    "strip_prefixes/drop_segments or rename one of them"
                )
            mapped[new] = key
        return mapped

    def check_renames_used(self, *sides: Iterable[str]) -> None:
        """Refuse a rename whose source name no side has after stripping (usually a typo).

        Raises:
            TensorInputError: naming the unused sources.
        """
        if not self.rename:
            return
        unmapped = KeyMapping(self.strip_prefixes, self.drop_segments)
        seen = {unmapped.name(k) for keys in sides for k in keys}
        unused = [src for src, _ in self.rename if src not in seen]
        if unused:
            raise TensorInputError(
                f"rename: no tensor is called {', '.join(map(file_text, unused[:5]))} on either side (after "
                "prefix stripping and segment dropping); check the names in the missing/extra keys of a "
                "comparison without the rename"
            )
