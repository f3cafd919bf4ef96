"""``perfgate skill install DIR``: copy the skill into an agent's skill folder.

The folder gets SKILL.md and references/*.md, byte for byte as packaged. Installing over the same
content is a no-op; installing over different content (another skill, or another perfgate version)
is refused unless forced, so a user's own edits are never lost silently.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.skills.catalog import SKILL_FILE, SKILL_NAME, skill_files

__all__ = ["InstallResult", "SkillConflictError", "install_skill"]


class SkillConflictError(Exception):
    """The target folder holds files that differ from the packaged skill."""

    def __init__(self, target: Path, conflicts: list[str], other_skill: str | None) -> None:
        self.target = target
        self.conflicts = conflicts
        self.other_skill = other_skill
        what = f"a different skill ({other_skill!r})" if other_skill else "different content"
        super().__init__(
            f"{target} already holds {what} in: {', '.join(conflicts)}; nothing was written\n"
            "Pick another folder, or pass --force to overwrite these files with perfgate's skill."
        )


@dataclass
class InstallResult:
    """What an install did, by path relative to the target folder."""

    target: Path
    written: list[str] = field(default_factory=list[str])
    unchanged: list[str] = field(default_factory=list[str])
    removed: list[str] = field(default_factory=list[str])

    def lines(self) -> list[str]:
        """A human-readable account, one line per file, then a summary."""
        out = [f"wrote {self.target / rel}" for rel in self.written]
        out += [f"removed stale {self.target / rel}" for rel in self.removed]
        verb = "installed" if self.written or self.removed else "already up to date"
        out.append(f"perfgate skill {verb} in {self.target} ({len(self.unchanged)} files unchanged)")
        return out


def _skill_name(skill_md: Path) -> str | None:
    """The ``name:`` of a SKILL.md's YAML front matter, if it has one."""
    try:
        lines = skill_md.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        if line.strip() == "---":
            return None
        key, sep, value = line.partition(":")
        if sep and key.strip() == "name":
            return value.strip().strip("'\"") or None
    return None


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def install_skill(target: Path, *, force: bool = False) -> InstallResult:
    """Write SKILL.md and references/*.md into ``target`` (created if missing).

    With ``force``, differing files are overwritten, and reference files left over from an earlier
    perfgate skill in the same folder are removed (they would otherwise sit there unlinked).

    Raises:
        SkillConflictError: without ``force``, when a file to write exists with different content.
        NotADirectoryError: ``target`` exists and is not a directory.
        IsADirectoryError: a path the skill needs for a file is a directory (with ``force``).
    """
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory")
    packaged = {rel: src.read_bytes() for rel, src in skill_files().items()}
    conflicts = [
        rel
        for rel, data in packaged.items()
        if (target / rel).exists() and (not (target / rel).is_file() or (target / rel).read_bytes() != data)
    ]
    existing_name = _skill_name(target / SKILL_FILE)
    if conflicts and not force:
        other = existing_name if existing_name not in (None, SKILL_NAME) else None
        raise SkillConflictError(target, conflicts, other)

    result = InstallResult(target=target)
    for rel, data in packaged.items():
        dest = target / rel
        if dest.is_file() and dest.read_bytes() == data:
            result.unchanged.append(rel)
            continue
        if dest.is_dir():
            raise IsADirectoryError(f"{dest} is a directory; remove it and install again")
        _write_atomically(dest, data)
        result.written.append(rel)

    if force and existing_name == SKILL_NAME:
        refs = target / "references"
        for stale in sorted(refs.glob("*.md")):
            rel = f"references/{stale.name}"
            if rel not in packaged and stale.is_file():
                stale.unlink()
                result.removed.append(rel)
    return result
