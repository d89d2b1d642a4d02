"""The persistence layer: atomic files, the npz+JSON record, and the client store."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.store.files import (
    RecordError,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    expect_counts,
    read_record,
    write_record,
)
from fedinit.store.state_dir import KEEP_VERSIONS, StateDir
from server_app.checkpoint import CHECKPOINT_FILE, load_checkpoint

REPO = Path(__file__).resolve().parent.parent


def model() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 2)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32)]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b, strict=True))


def leftovers(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


# ---------------------------------------------------------------- atomic files
def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and leftovers(tmp_path) == []


def test_failure_between_write_and_replace_keeps_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"old" * 1000)

    def fail(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr("fedinit.store.files.os.replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_bytes(path, b"new" * 1000)
    assert path.read_bytes() == b"old" * 1000 and leftovers(tmp_path) == []


def test_failure_mid_write_keeps_the_old_file_or_none(tmp_path: Path) -> None:
    def half_then_fail(f: io.BufferedWriter) -> None:
        f.write(b"half")
        raise RuntimeError("killed mid-write")

    path = tmp_path / "f.bin"
    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_fail)
    assert not path.exists()  # no file rather than a torn one
    atomic_write_bytes(path, b"old")
    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_process_killed_between_write_and_replace(tmp_path: Path) -> None:
    """A real crash: the process dies after fsync, before the rename. The target is the old
    file; the temp file stays behind (hidden) and does not stop the next write."""
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"old")
    code = ("import os, sys\nfrom pathlib import Path\nimport fedinit.store.files as sf\n"
            "sf.os.replace = lambda *a: os._exit(9)\n"
            "sf.atomic_write_bytes(Path(sys.argv[1]), b'new' * 100000)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, check=False,
                          capture_output=True, timeout=120)
    assert done.returncode == 9, done.stderr
    assert path.read_bytes() == b"old"
    (tmp,) = leftovers(tmp_path)
    assert tmp.read_bytes() == b"new" * 100000  # complete, but never seen under the name
    atomic_write_bytes(path, b"newer")
    assert path.read_bytes() == b"newer"


def test_mode_is_set_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "cache.npz"
    atomic_write(path, lambda f: f.write(b"x"), mode=0o644)
    assert path.stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------- the record
def test_record_round_trip_keeps_groups_order_dtypes_and_meta(tmp_path: Path) -> None:
    w = model()
    arrays = {"w": w, "s/m": [a.astype(np.float64) for a in w], "int": [np.arange(3)]}
    meta = {"round": 3, "config": {"beta": 0.1}, "rows": [{"round": 1, "x": None}]}
    write_record(tmp_path / "r.npz", arrays, meta)
    groups, got = read_record(tmp_path / "r.npz")
    assert list(groups) == list(arrays) and got == meta
    for name in arrays:
        assert same(groups[name], arrays[name])
    assert leftovers(tmp_path) == []


def test_record_layout_is_the_checkpoint_and_state_layout(tmp_path: Path) -> None:
    """Files written before the store (keys <group>/<i> and a JSON 'meta') still load."""
    w = model()
    old = {"w/0": w[0], "w/1": w[1], "s/m/0": w[0], "s/m/1": w[1]}
    meta = {"format": 1, "round": 5, "config": {"seed": 0}, "num-weights": 2, "state": {"m": 2}}
    old["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with (tmp_path / CHECKPOINT_FILE).open("wb") as f:
        np.savez(f, **old)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.server_round == 5 and same(ckpt.weights, w) and same(ckpt.strategy_state["m"], w)

    state = {"w_prev/0": w[0], "w_prev/1": w[1]}
    smeta = {"experiment": "run", "partition-id": 3, "round": 2, "entries": {"w_prev": 2}}
    state["meta"] = np.frombuffer(json.dumps(smeta).encode(), dtype=np.uint8)
    (tmp_path / "run").mkdir()
    with (tmp_path / "run" / "client-3-r000002.npz").open("wb") as f:
        np.savez(f, **state)
    saved = StateDir(tmp_path, "run", 3).load_before(3)
    assert saved is not None and saved[0] == 2 and same(saved[1][W_PREV], w)
    # and what the store writes has exactly the old entry names
    StateDir(tmp_path, "run", 3).save(4, {W_PREV: w})
    with np.load(tmp_path / "run" / "client-3" / "r000004.npz") as z:
        assert z.files == ["w_prev/0", "w_prev/1", "meta"]


def test_files_of_the_flat_layout_move_into_the_clients_directory(tmp_path: Path) -> None:
    """A run written before each client had a directory (every client's versions side by side
    in the experiment's directory) resumes from its files; each client moves only its own."""
    w = model()
    (tmp_path / "run").mkdir()
    for cid in (3, 4):
        for r in (2, 5):
            write_record(tmp_path / "run" / f"client-{cid}-r{r:06d}.npz",
                         {W_PREV: [a + cid + r for a in w]},
                         {"experiment": "run", "partition-id": cid, "round": r,
                          "entries": {W_PREV: 2}})
    disk = StateDir(tmp_path, "run", 3)
    saved = disk.load_before(6)
    assert saved is not None and saved[0] == 5 and same(saved[1][W_PREV], [a + 8 for a in w])
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "client-3", "client-4-r000002.npz", "client-4-r000005.npz"]
    assert sorted(p.name for p in disk.client_dir.iterdir()) == ["r000002.npz", "r000005.npz"]
    disk.save(6, {W_PREV: w})  # versions kept across both layouts: rounds 5 and 6
    assert sorted(p.name for p in disk.client_dir.iterdir()) == ["r000005.npz", "r000006.npz"]
    other = StateDir(tmp_path, "run", 4).load_before(5)
    assert other is not None and other[0] == 2 and same(other[1][W_PREV], [a + 6 for a in w])
    assert not list((tmp_path / "run").glob("client-*-r*.npz"))


def test_listing_a_clients_versions_reads_only_its_own_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of a participation must not grow with the federation: once the experiment's
    directory has been looked at for files of the flat layout, only the client's is listed."""
    import os
    for cid in range(50):
        StateDir(tmp_path, "run", cid).save(1, {W_PREV: model()})
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: listed.append(str(p)) or real(p))
    disk = StateDir(tmp_path, "run", 7)
    disk.save(2, {W_PREV: model()})
    assert disk.load_before(3) is not None
    assert set(listed) == {str(disk.client_dir)}, listed


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage", "empty", "no-meta",
                                    "bad-meta", "bad-key", "gap"])
def test_unusable_record_is_one_line_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "r.npz"
    write_record(path, {"w": model()}, {"round": 1})
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage in ("truncated", "garbage", "empty"):
        path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x00" * 300,
                          "empty": b""}[damage])
    else:
        entries = {"w/0": np.zeros(2), "meta": np.frombuffer(b"{}", dtype=np.uint8)}
        if damage == "no-meta":
            del entries["meta"]
        elif damage == "bad-meta":
            entries["meta"] = np.frombuffer(b"\xff{", dtype=np.uint8)
        elif damage == "bad-key":
            entries["weights"] = np.zeros(2)
        else:
            entries["w/2"] = np.zeros(2)
        with path.open("wb") as f:
            np.savez(f, **entries)
    with pytest.raises(RecordError) as err:
        read_record(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_expect_counts_notices_a_missing_group(tmp_path: Path) -> None:
    path = tmp_path / "r.npz"
    write_record(path, {"w": model(), "empty": []}, {"n": {"w": 2, "empty": 0, "gone": 1}})
    groups, meta = read_record(path)
    expect_counts(path, groups, {"w": 2, "empty": 0})
    with pytest.raises(RecordError, match="gone has 0 arrays, meta says 1"):
        expect_counts(path, groups, meta["n"])


# ---------------------------------------------------------------- versions on disk
def test_state_dir_keeps_the_newest_versions(tmp_path: Path) -> None:
    disk = StateDir(tmp_path, "run", 0)
    for r in (1, 2, 5, 7):
        disk.save(r, {W_PREV: [a + r for a in model()]})
    assert len(list(disk.client_dir.glob("*.npz"))) == KEEP_VERSIONS
    saved = disk.load_before(7)
    assert saved is not None and saved[0] == 5 and same(saved[1][W_PREV],
                                                        [a + 5 for a in model()])
    assert disk.load_before(5) is None  # rounds 1 and 2 are gone


@pytest.mark.parametrize("kind", ["truncated", "other-client", "wrong-shape", "nan"])
def test_damaged_newest_version_falls_back_to_the_one_before(tmp_path: Path,
                                                             kind: str) -> None:
    w = model()
    disk = StateDir(tmp_path, "run", 1)
    disk.save(1, {W_PREV: w})
    if kind == "other-client":
        StateDir(tmp_path, "run", 2).save(2, {W_PREV: w})
        (disk.dir / "client-2" / "r000002.npz").rename(disk.version_path(2))
    else:
        bad = {"wrong-shape": w[:1], "nan": [np.full_like(a, np.nan) for a in w]}.get(kind, w)
        disk.save(2, {W_PREV: bad})
    newest = disk.version_path(2)
    if kind == "truncated":
        newest.write_bytes(newest.read_bytes()[:100])

    store = ClientStore(RecordDict(), disk)
    assert store.restore("run", 3, w) is True  # the state-fallback signal
    assert store.tag() == ("run", 1) and same(store.get(W_PREV) or [], w)
    assert not newest.exists() and newest.with_name(newest.name + ".damaged").exists()
    # the damaged file no longer counts: the next save keeps round 1 and round 3
    store.save("run", 3)
    assert sorted(p.name for p in disk.client_dir.glob("r*.npz")) == [
        "r000001.npz", "r000003.npz"]


def test_every_version_damaged_falls_back_to_w0(tmp_path: Path) -> None:
    disk = StateDir(tmp_path, "run", 0)
    disk.save(1, {W_PREV: model()})
    disk.version_path(1).write_bytes(b"garbage")
    store = ClientStore(RecordDict(), disk)
    store.put(W_PREV, model())
    assert store.restore("run", 2, model()) is True
    assert store.entries() == {} and store.tag() is None


# ---------------------------------------------------------------- memory, disk, both
def test_memory_only_keeps_state_in_the_record_dict_and_writes_nothing(tmp_path: Path) -> None:
    memory = RecordDict()
    first = ClientStore(memory)
    first.put(W_PREV, model())
    first.save("run", 1)
    later = ClientStore(memory)
    assert later.restore("run", 2, model()) is False
    assert later.tag() == ("run", 1) and same(later.get(W_PREV) or [], model())
    assert list(tmp_path.iterdir()) == []


def test_disk_only_holds_nothing_between_participations(tmp_path: Path) -> None:
    disk = StateDir(tmp_path, "run", 4)
    first = ClientStore(None, disk)
    first.put(W_PREV, model())
    first.put("c", [a * 2 for a in model()])
    first.save("run", 1)
    later = ClientStore(None, StateDir(tmp_path, "run", 4))
    assert later.get(W_PREV) is None and later.tag() is None  # nothing until restored
    assert later.restore("run", 2, model()) is False
    assert same(later.get(W_PREV) or [], model())
    assert same(later.get("c") or [], [a * 2 for a in model()])
    assert later.tag() == ("run", 1)


def test_memory_and_disk_prefer_memory_and_survive_its_loss(tmp_path: Path) -> None:
    w = model()
    memory, disk = RecordDict(), StateDir(tmp_path, "run", 0)
    store = ClientStore(memory, disk)
    store.put(W_PREV, w)
    store.save("run", 1)
    store.put(W_PREV, [a + 1 for a in w])
    store.save("run", 2)

    for path in disk.client_dir.glob("*.npz"):  # memory is the right version: disk is not read
        path.rename(path.with_suffix(".hidden"))
    again = ClientStore(memory, disk)
    assert again.restore("run", 3, w) is False and again.tag() == ("run", 2)
    for path in disk.client_dir.glob("*.hidden"):
        path.rename(path.with_suffix(".npz"))

    restarted = ClientStore(RecordDict(), disk)  # node restarted: memory lost
    assert restarted.restore("run", 3, w) is False
    assert same(restarted.get(W_PREV) or [], [a + 1 for a in w])
    redone = ClientStore(memory, disk)  # round 2 redone after a server crash
    assert redone.restore("run", 2, w) is False
    assert redone.tag() == ("run", 1) and same(redone.get(W_PREV) or [], w)
    other = ClientStore(memory, StateDir(tmp_path, "other", 0))  # a new experiment
    assert other.restore("other", 1, w) is False and other.entries() == {}


def test_neither_memory_nor_disk_keeps_state_for_one_participation() -> None:
    store = ClientStore()
    store.put(W_PREV, model())
    store.save("run", 1)
    assert ClientStore().get(W_PREV) is None
