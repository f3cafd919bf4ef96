"""`perfgate skill install DIR` writes an agent skill folder and never clobbers a different one silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.skills.catalog import REFERENCES, SKILL_FILE, skill_files
from perfgate.skills.install import SkillConflictError, install_skill

OTHER_SKILL = "---\nname: other-skill\ndescription: someone else's skill\n---\n\n# Other\n"


def _assert_is_the_packaged_skill(target: Path) -> None:
    for rel, src in skill_files().items():
        assert (target / rel).read_bytes() == src.read_bytes(), rel


def test_install_writes_skill_md_and_every_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "skills" / "perfgate"
    assert main(["skill", "install", str(target)]) == 0
    _assert_is_the_packaged_skill(target)
    assert sorted(p.name for p in (target / "references").iterdir()) == sorted(
        f"{ref.name}.md" for ref in REFERENCES
    )
    out = capsys.readouterr().out
    assert f"wrote {target / SKILL_FILE}" in out
    assert "installed" in out


def test_installing_twice_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_skill(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.md")}
    assert main(["skill", "install", str(tmp_path)]) == 0
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.md")} == before
    assert "already up to date" in capsys.readouterr().out


def test_a_different_skill_is_refused_without_force_and_left_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / SKILL_FILE).write_text(OTHER_SKILL)
    assert main(["skill", "install", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "other-skill" in err
    assert "--force" in err
    assert (tmp_path / SKILL_FILE).read_text() == OTHER_SKILL
    assert not (tmp_path / "references").exists(), "a refused install must write nothing"


def test_force_replaces_a_different_skill_but_keeps_its_unrelated_files(tmp_path: Path) -> None:
    (tmp_path / SKILL_FILE).write_text(OTHER_SKILL)
    (tmp_path / "references").mkdir()
    theirs = tmp_path / "references" / "their-notes.md"
    theirs.write_text("# notes\n")
    assert main(["skill", "install", "--force", str(tmp_path)]) == 0
    _assert_is_the_packaged_skill(tmp_path)
    assert theirs.read_text() == "# notes\n", "files of another skill are not ours to delete"


def test_a_locally_edited_reference_is_a_conflict(tmp_path: Path) -> None:
    install_skill(tmp_path)
    edited = tmp_path / REFERENCES[0].relative_path
    edited.write_text("my own notes\n")
    with pytest.raises(SkillConflictError) as info:
        install_skill(tmp_path)
    assert info.value.conflicts == [REFERENCES[0].relative_path]
    assert info.value.other_skill is None
    assert edited.read_text() == "my own notes\n"
    result = install_skill(tmp_path, force=True)
    assert result.written == [REFERENCES[0].relative_path]
    _assert_is_the_packaged_skill(tmp_path)


def test_force_over_an_older_perfgate_skill_removes_its_stale_references(tmp_path: Path) -> None:
    install_skill(tmp_path)
    (tmp_path / SKILL_FILE).write_text("---\nname: perfgate\ndescription: an older version\n---\n")
    stale = tmp_path / "references" / "retired-topic.md"
    stale.write_text("# gone in this version\n")
    result = install_skill(tmp_path, force=True)
    assert result.written == [SKILL_FILE]
    assert result.removed == ["references/retired-topic.md"]
    assert not stale.exists()
    _assert_is_the_packaged_skill(tmp_path)


def test_a_file_in_place_of_the_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    assert main(["skill", "install", str(target)]) == 1
    assert "not a directory" in capsys.readouterr().err
