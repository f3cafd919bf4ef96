"""The anchor: after every append, the ledger's head (sequence and hash, MACed) is written to the trust
root, outside the workspace, so `verify` can tell a removed tail or a rollback to an older copy.

The anchor is two fixed-size slots rewritten in place, alternately (the slot being replaced is never the
newest; of its bytes, only those up to the end of the new text are written when the rest, spaces, is there
already): a kill -9 loses nothing, since the page cache survives the process, and a power cut can at worst
leave the anchor one append behind the ledger, which `verify` accepts (it only ever flags a ledger
*shorter* than its anchor). The file stays open between appends, written through that descriptor only
while its path still names the very file opened (`perfgate.evidence._held`). Each append still reads both
slots under the anchor's lock, but parses them and checks their MACs only when their bytes differ from
what this `Anchor` last read or wrote (another writer's slot is always checked afresh).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from perfgate.evidence._database import Connection
from perfgate.evidence._held import CLOEXEC, NOFOLLOW, HeldFile, any_file, this_pid
from perfgate.security.trustroot import SigningKey, TrustRoot, TrustRootError, write_private

__all__ = ["Anchor"]

_ANCHOR_MAC = "perfgate-ledger-anchor"
_RETIRED_MAC = "perfgate-ledger-retired"
_ANCHOR_FILE = "anchor.slots"
_RETIRED_FILE = "retired.json"
_LEGACY_ANCHOR_FILE = "anchor.json"
_ANCHOR_SLOT = 8192  # bytes per slot; an anchor is ~300 bytes plus ~80 per replaced database
_COMPACT = json.JSONEncoder(separators=(",", ":"))
_encode_ascii = cast("Callable[[str], str]", json.encoder.encode_basestring_ascii)  # type: ignore[attr-defined]


def _anchor_text(anchor: dict[str, Any]) -> bytes:
    """``_COMPACT.encode(anchor).encode()`` for an anchor as `Anchor._advance` makes it (its ids,
    hash and MAC strings, its sequence an int): written field by field, the replaced list encoded."""
    replaced = anchor["replaced"]
    return (
        f'{{"ledger_id":{_encode_ascii(anchor["ledger_id"])},"workspace":{_encode_ascii(anchor["workspace"])}'
        f',"seq":{int.__repr__(anchor["seq"])},"hash":{_encode_ascii(anchor["hash"])}'
        f',"key_id":{_encode_ascii(anchor["key_id"])},"mac":{_encode_ascii(anchor["mac"])}'
        f',"replaced":{_COMPACT.encode(replaced) if replaced else "[]"}}}'
    ).encode()


def _changed_end(old: bytes, new: bytes, start: int) -> int:
    """How much of ``new`` (a slot: ``start`` bytes of text, spaces, a newline) must be written over ``old``
    (what the slot holds now, read under the anchor's lock) for the slot to hold ``new``: the text alone
    when everything after it is already there (the slot held a text no longer than this one, as when the
    anchor only moves forward), else all of it."""
    return start if len(old) == len(new) and old[start:] == new[start:] else len(new)


def _slot_seq(slot: dict[str, Any]) -> int:
    seq = slot.get("seq")
    return seq if isinstance(seq, int) else -1


class Anchor:
    """The anchor of one workspace's ledger in the trust root: read, checked and moved forward.

    ``db`` is the ledger's connection: its id names the database the anchor is for, and its lock
    serializes this process's threads (an flock on the anchor's lock file serializes processes).
    """

    def __init__(self, trust: TrustRoot, workspace: Path, db: Connection) -> None:
        self.trust = trust
        self.workspace = workspace
        self._db = db
        self._file: Path | None = None
        self._lock_fd: int | None = None
        self._lock_pid = 0
        self._out = HeldFile()
        # (the two anchor slots' bytes, key, ledger id) -> their parsed values and the one in force
        self._memo: tuple[tuple[bytes, bytes, bytes, str], list[dict[str, Any] | None], int | None] | None = (
            None
        )

    @property
    def ledger_id(self) -> str:
        """The id of the database the ledger reads and writes now."""
        return self._db.ledger_id

    @property
    def path(self) -> Path:
        """The anchor file, in the trust root's folder for this workspace."""
        if self._file is None:
            self._file = self.trust.workspace_dir(self.workspace, create=False) / _ANCHOR_FILE
        return self._file

    def _message(self, seq: int, hash_: str, ledger_id: str | None = None) -> str:
        """What an anchor's MAC covers: this workspace, the ledger's id, the head's sequence and hash."""
        return f"{self.workspace}:{ledger_id or self.ledger_id}:{seq}:{hash_}"

    def mac_verifies(
        self, key: SigningKey, seq: int, hash_: str, mac: str | None, ledger_id: str | None = None
    ) -> bool:
        """Whether ``mac`` is ``key``'s MAC of an anchor of this ledger (or ``ledger_id``) at ``seq`` with
        head ``hash_``."""
        return key.check(_ANCHOR_MAC, self._message(seq, hash_, ledger_id), mac)

    def copies(self, key: SigningKey, ledger_id: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
        """The anchors in force at other workspace paths of this ledger (or ``ledger_id``), each with its
        path: where the workspace was before a move, or another live copy. Only anchors whose MAC verifies
        for that path and that ledger id count."""
        wanted = ledger_id or self.ledger_id
        own = self.trust.workspace_dir(self.workspace, create=False)
        try:
            folders = sorted((self.trust.state_dir / "workspaces").iterdir())
        except OSError:
            return []
        found: list[tuple[Path, dict[str, Any]]] = []
        for folder in folders:
            try:
                where = Path((folder / "workspace").read_text().strip())
            except OSError:
                continue
            other = Anchor(self.trust, where, self._db)
            if folder == own or other.path.parent != folder:
                continue
            try:
                anchor = other.read(key)
            except TrustRootError:
                continue
            seq, hash_ = (anchor or {}).get("seq"), (anchor or {}).get("hash")
            if (
                anchor is not None
                and anchor.get("ledger_id") == wanted
                and isinstance(seq, int)
                and isinstance(hash_, str)
                and other.mac_verifies(key, seq, hash_, cast("str | None", anchor.get("mac")), wanted)
            ):
                found.append((where, anchor))
        return found

    def retired(self, key: SigningKey) -> dict[str, dict[str, Any]]:
        """Ledger id -> the operator's retirement of it in this workspace (``records``, ``retired_at``,
        ``by``), for the entries whose MAC verifies."""
        data = self.trust.read_json(self.path.with_name(_RETIRED_FILE))
        entries = cast("list[Any]", data) if isinstance(data, list) else []
        out: dict[str, dict[str, Any]] = {}
        for entry in entries:
            if isinstance(entry, dict):
                item = cast("dict[str, Any]", entry)
                if key.check(_RETIRED_MAC, self._retired_message(item), item.get("mac")):
                    out[str(item["ledger_id"])] = item
        return out

    def _retired_message(self, entry: dict[str, Any]) -> str:
        return f"{self.workspace}:{entry.get('ledger_id')}:{entry.get('records')}:{entry.get('retired_at')}"

    def lost(self, key: SigningKey) -> list[dict[str, Any]]:
        """The ledgers this workspace's anchor remembers that are gone from it and not retired yet: the
        anchored ledger when the database here is another one, and those it replaced before (a ledger
        anchored at another path now, moved there, is not lost). Each: ``ledger_id``, ``seq``."""
        anchor = self.read(key)
        if anchor is None:
            return []
        remembered = cast("list[dict[str, Any]]", list(anchor.get("replaced") or []))
        if anchor.get("ledger_id") != self.ledger_id:
            remembered.append({"ledger_id": anchor.get("ledger_id"), "seq": anchor.get("seq")})
        retired = self.retired(key)
        out: list[dict[str, Any]] = []
        for old in remembered:
            lid = old.get("ledger_id")
            if lid == self.ledger_id or lid in retired or any(o["ledger_id"] == lid for o in out):
                continue
            if not isinstance(lid, str) or any(
                _slot_seq(copy) >= _slot_seq(old) for _, copy in self.copies(key, lid)
            ):
                continue
            out.append(old)
        return out

    def retire(self, key: SigningKey, by: str) -> list[dict[str, Any]]:
        """Record in the trust root that the ledgers `lost` here are gone for good (the operator's word,
        ``by`` whom), so `verify` reports them instead of failing; returns the entries written.

        An anchor of a retired ledger is removed (the next append starts a new one); the anchor of the
        ledger here stays. Needs write access to the trust root.

        Raises:
            TrustRootError: the trust root cannot be written.
        """
        import fcntl

        with self._db.lock:
            fd = self._lock_file()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                lost = self.lost(key)
                if not lost:
                    return []
                at = datetime.now(timezone.utc).isoformat(timespec="seconds")
                path = self.path.with_name(_RETIRED_FILE)
                data = self.trust.read_json(path)
                entries = cast("list[Any]", data) if isinstance(data, list) else []
                written: list[dict[str, Any]] = []
                for old in lost:
                    entry: dict[str, Any] = {
                        "ledger_id": old["ledger_id"],
                        "records": old.get("seq"),
                        "retired_at": at,
                        "by": by,
                    }
                    entry["mac"] = key.mac(_RETIRED_MAC, self._retired_message(entry))
                    written.append(entry)
                try:
                    write_private(path, json.dumps(entries + written, indent=1).encode())
                    anchor = self.read(key)
                    if anchor is not None and anchor.get("ledger_id") != self.ledger_id:
                        self.path.unlink(missing_ok=True)
                        self.path.with_name(_LEGACY_ANCHOR_FILE).unlink(missing_ok=True)
                        self._memo = None
                except OSError as exc:
                    raise TrustRootError(f"cannot write the trust root {self.path.parent}: {exc}") from exc
                return written
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _raw_slots(self) -> list[bytes]:
        """The anchor file's two slots as bytes (empty when the file or the slot is absent)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [b"", b""]
        except OSError as exc:
            if isinstance(exc, PermissionError):
                raise TrustRootError(f"cannot read {self.path}: permission denied") from exc
            raise
        return [data[:_ANCHOR_SLOT], data[_ANCHOR_SLOT : 2 * _ANCHOR_SLOT]]

    @staticmethod
    def _parse_slot(raw: bytes) -> dict[str, Any] | None:
        try:
            value = json.loads(raw) if raw else None
        except ValueError:
            value = None
        return cast("dict[str, Any]", value) if isinstance(value, dict) else None

    def _slots(self) -> list[dict[str, Any] | None]:
        """The anchor file's two slots, each parsed (None: empty, torn or not an anchor)."""
        return [self._parse_slot(raw) for raw in self._raw_slots()]

    def _known_slots(
        self, key: SigningKey, raws: tuple[bytes, bytes]
    ) -> tuple[list[dict[str, Any] | None], int | None]:
        """`_slots` and `_best_slot` for the append path, remembered by the slots' exact bytes.

        Parsing both 8 KiB slots and checking their MACs is most of what an anchor update costs, and the
        slots almost always hold what this process wrote itself. The memo is keyed by content (the raw
        bytes read now, the key and the ledger id), so a slot written by another process, edited or torn
        is parsed and checked afresh. Its parsed values are read, never handed out.
        """
        memo_key = (*raws, key.secret, self.ledger_id)
        known = self._memo
        if known is not None and known[0] == memo_key:
            return known[1], known[2]
        slots = [self._parse_slot(raw) for raw in raws]
        best = self._best_slot(slots, key)
        self._memo = (memo_key, slots, best)
        return slots, best

    def _best_slot(self, slots: list[dict[str, Any] | None], key: SigningKey | None) -> int | None:
        """Index of the anchor in force: the newest whose MAC verifies (with a key), else the newest."""

        def rank(i: int) -> tuple[bool, int]:
            slot = slots[i]
            assert slot is not None
            return (self._slot_good(slot, key), _slot_seq(slot))

        present = [i for i in range(2) if slots[i] is not None]
        return max(present, key=rank) if present else None

    def _slot_good(self, slot: dict[str, Any], key: SigningKey | None) -> bool:
        """Whether an anchor slot is this ledger's and its MAC verifies under ``key``."""
        seq, hash_ = slot.get("seq"), slot.get("hash")
        return (
            key is not None
            and isinstance(seq, int)
            and isinstance(hash_, str)
            and slot.get("ledger_id") == self.ledger_id
            and self.mac_verifies(key, seq, hash_, cast("str | None", slot.get("mac")))
        )

    def read(self, key: SigningKey | None = None) -> dict[str, Any] | None:
        """The anchor in force (from an older perfgate's ``anchor.json`` when no slot is written yet)."""
        slots = self._slots()
        best = self._best_slot(slots, key)
        if best is not None:
            return slots[best]
        data = self.trust.read_json(self.path.with_name(_LEGACY_ANCHOR_FILE))
        return cast("dict[str, Any]", data) if isinstance(data, dict) else None

    def _lock_file(self) -> int:
        """This process's descriptor on the anchor's lock file (an flock serializes processes)."""
        pid = this_pid()
        if self._lock_fd is None or self._lock_pid != pid:
            folder = self.trust.workspace_dir(self.workspace)
            self._lock_fd = os.open(folder / "anchor.lock", os.O_RDWR | os.O_CREAT | CLOEXEC, 0o600)
            self._lock_pid = pid
        return self._lock_fd

    def write(self, key: SigningKey, seq: int, hash_: str) -> None:
        """Move the anchor forward to ``seq`` (never backwards: concurrent writers race here).

        The new anchor goes into the slot that does not hold the anchor in force, so a write torn by a
        power cut leaves the previous one readable. Not fsynced (see the module docstring).
        """
        import fcntl

        with self._db.lock:
            fd = self._lock_file()
            pid = self._lock_pid
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held = self._out.get(self.path, pid, any_file)
                if held is not None:
                    out = held[0]
                else:
                    try:
                        out = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW | CLOEXEC, 0o600)
                    except PermissionError as exc:
                        raise TrustRootError(f"cannot write {self.path}: permission denied") from exc
                    self._out.hold(out, pid)
                self._advance(out, key, seq, hash_)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _advance(self, out: int, key: SigningKey, seq: int, hash_: str) -> None:
        """`write` on the anchor file open as ``out``, under its lock."""
        data = b""
        while len(data) < 2 * _ANCHOR_SLOT and (
            chunk := os.pread(out, 2 * _ANCHOR_SLOT - len(data), len(data))
        ):
            data += chunk
        raws = (data[:_ANCHOR_SLOT], data[_ANCHOR_SLOT : 2 * _ANCHOR_SLOT])
        slots, best = self._known_slots(key, raws)
        current = slots[best] if best is not None else self.read(key)
        replaced: list[Any] = []
        if current is not None:
            replaced = list(cast("list[Any]", current.get("replaced") or []))
            if current.get("ledger_id") == self.ledger_id:
                if isinstance(current.get("seq"), int) and current["seq"] >= seq:
                    return
            else:  # the database was deleted or swapped: remember it, so verify keeps saying so
                replaced.append({"ledger_id": current.get("ledger_id"), "seq": current.get("seq")})
        anchor: dict[str, Any] = {
            "ledger_id": self.ledger_id,
            "workspace": str(self.workspace),
            "seq": seq,
            "hash": hash_,
            "key_id": key.key_id,
            "mac": key.mac(_ANCHOR_MAC, self._message(seq, hash_)),
            "replaced": replaced,
        }
        text = _anchor_text(anchor)
        while len(text) >= _ANCHOR_SLOT and anchor["replaced"]:  # keep the newest replacements
            anchor["replaced"] = anchor["replaced"][1:]
            text = _anchor_text(anchor)
        target = 1 - best if best is not None else 0
        raw = text.ljust(_ANCHOR_SLOT - 1) + b"\n"
        os.pwrite(out, raw[: _changed_end(raws[target], raw, len(text))], target * _ANCHOR_SLOT)
        # What the slots hold now, as the next append will read them unless another process writes: the
        # one just written, newest and MACed by this key, is in force.
        if best is not None:
            written = (raw, raws[1]) if target == 0 else (raws[0], raw)
            new_slots = list(slots)
            new_slots[target] = anchor
            self._memo = ((*written, key.secret, self.ledger_id), new_slots, target)
        else:
            self._memo = None

    def close(self, pid: int) -> None:
        """Close the anchor's descriptors this process (``pid``) opened."""
        if self._lock_fd is not None and self._lock_pid == pid:
            os.close(self._lock_fd)
        self._lock_fd = None
        self._out.close(pid)
