"""The platform layer (engine/platform/files.py) on real files: atomic writes, positional I/O and its
fallbacks, durability calls per OS, the folder lock across processes, and names that survive
spaces, non-ASCII characters and case-insensitive filesystems.

Runs as it is here and under PARLEY_SIMULATE_PLATFORM=windows|macos (tests/helpers/platform_sim.py);
the checks that name an OS's path assert what that run must have used.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.history.history import History
from engine.kvstore import KVStore, KVStoreError
from engine.kvstore.blob import blob_path
from engine.platform import files as platform_io
from tests.helpers import platform_sim
from tests.helpers.kv_helpers import NS, assert_prefix, cache_of, make_kv, tokens

REPO = str(Path(__file__).resolve().parents[3])
SIMULATED = os.environ.get(platform_sim.ENV) or None
ODD_NAME = "Dätä ordner 文件 ✓"  # spaces, accents, CJK, a symbol


def test_the_layer_uses_what_the_platform_has():
    caps = platform_io.capabilities()
    if SIMULATED == "windows":
        assert caps == {
            "system": "win32",
            "pread": False,
            "pwrite": False,
            "preadv": False,
            "fdatasync": False,
            "full_fsync": False,
            "dir_fsync": False,
            "write_through_rename": False,
            "fcntl": False,
        }
    elif SIMULATED == "macos":
        assert caps["system"] == "darwin" and caps["full_fsync"] and not caps["fdatasync"]
        assert not caps["preadv"] and caps["pread"] and caps["dir_fsync"]
    elif sys.platform.startswith("linux"):
        assert caps["system"] == "linux" and caps["fdatasync"] and caps["preadv"] and caps["dir_fsync"]
        assert not caps["full_fsync"] and not caps["write_through_rename"]


def test_child_pythons_run_under_the_same_platform():
    """The SIGKILL crash tests' writers are child processes: they must take the same paths."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, engine.platform.files as p; print(json.dumps(p.capabilities()))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == platform_io.capabilities()


# ---------------------------------------------------------------- atomic writes


@pytest.mark.parametrize("kind", ["bytes", "file", "chunks"])
def test_atomic_write_replaces_the_file_whole_and_leaves_no_temp(tmp_path, kind):
    dest = tmp_path / "sub" / "picture.png"
    payload = os.urandom(3 << 20) + b"\r\n\n\r"  # several chunks; newlines must not be translated
    platform_io.atomic_write(dest, b"old")
    src = {
        "bytes": payload,
        "file": io.BytesIO(payload),
        "chunks": (payload[i : i + 100_000] for i in range(0, len(payload), 100_000)),
    }[kind]
    platform_io.atomic_write(dest, src)
    assert dest.read_bytes() == payload
    assert sorted(p.name for p in dest.parent.iterdir()) == ["picture.png"]


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path):
    dest = tmp_path / "a.bin"
    platform_io.atomic_write(dest, b"kept")

    def chunks():
        yield b"partial"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        platform_io.atomic_write(dest, chunks())
    assert dest.read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["a.bin"]


@pytest.mark.skipif(SIMULATED != "macos", reason="the F_FULLFSYNC path is macOS's")
def test_macos_blobs_and_their_directory_reach_the_platter(tmp_path):
    before = platform_sim.full_fsync_calls
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0) as s:
        kv = make_kv(40)
        assert s.spill("a", tokens(40), [], cache_of(kv)).ok
    # 2 blocks + 1 tail, each synced, then their directories, before the manifest row
    assert platform_sim.full_fsync_calls - before >= 4


def test_sqlite_commits_use_full_fsync_where_the_os_needs_it(tmp_path):
    # macOS: SQLite's plain fsync leaves commits in the drive's cache; the store's manifest and
    # the chat history both ask for F_FULLFSYNC there (and only there)
    from app.history.history_db import create_schema, open_database
    from engine.kvstore.manifest import Manifest

    want = 1 if SIMULATED == "macos" else 0
    manifest = Manifest(str(tmp_path / "manifest.sqlite"))
    history, _ = open_database(tmp_path / "history.sqlite", 1000, create_schema)
    try:
        for db in (manifest.db, history):
            assert db.execute("PRAGMA fullfsync").fetchone()[0] == want
            assert db.execute("PRAGMA checkpoint_fullfsync").fetchone()[0] == want
    finally:
        manifest.close()
        history.close()


# ---------------------------------------------------------------- positional I/O


def test_positional_io_reads_and_writes_at_offsets_and_keeps_the_position(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 64
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
    try:
        os.lseek(fd, 10, os.SEEK_SET)
        platform_io.pwrite_all(fd, b"\xff" * 5, 4000)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 10  # a sequential writer is not disturbed
        assert platform_io.pread(fd, 7, 3998) == data[3998:4000] + b"\xff" * 5
        assert platform_io.pread(fd, 100, len(data) - 3) == data[-3:]  # short only at the end
        a, b, c = bytearray(3), bytearray(5000), bytearray(100_000)
        got = platform_io.read_into(fd, [memoryview(a), memoryview(b), memoryview(c)], 1)
        assert got == len(data) - 1  # stops at end of file
        expect = bytearray(data)
        expect[4000:4005] = b"\xff" * 5
        assert bytes(a) + bytes(b) + bytes(c[: got - 5003]) == bytes(expect[1:])
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the folder lock


def test_the_store_lock_refuses_a_second_holder_and_dies_with_its_process(tmp_path):
    root = str(tmp_path / "kv")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from engine.kvstore import KVStore; "
            f"s = KVStore({root!r}, b'x', min_free_bytes=0); print('held', flush=True); sys.stdin.read()",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KVStoreError, match="in use by another process"):
            KVStore(root, b"x", min_free_bytes=0)
        holder.kill()  # SIGKILL on POSIX: no cleanup runs, the OS drops the lock
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    with KVStore(root, b"x", min_free_bytes=0) as s:
        assert s.sessions() == []


# ---------------------------------------------------------------- names and paths


def test_store_and_history_work_under_a_folder_with_spaces_and_non_ascii(tmp_path):
    data = tmp_path / ODD_NAME
    with KVStore(str(data / "kv store"), NS, block_tokens=16, min_free_bytes=0) as s:
        kv = make_kv(50)
        assert s.spill("conversation ü", tokens(50), [], cache_of(kv)).ok
    with KVStore(str(data / "kv store"), NS, block_tokens=16, min_free_bytes=0) as s:
        assert_prefix(s.restore("conversation ü", tokens(50)), kv, 50)
    picture = tmp_path / "Foto süß 1 — 写真.PNG"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(1000))
    h = History(data)
    ref = h.add_picture(picture)
    assert h.picture_path(ref).read_bytes() == picture.read_bytes()


def test_content_names_are_lowercase_so_case_insensitive_filesystems_keep_them_apart(tmp_path):
    """macOS and Windows fold case: two names may differ in content only, never in case."""
    keys = [os.urandom(32) for _ in range(200)]
    names = [os.path.relpath(blob_path("blobs", k), "blobs") for k in keys]
    assert all(n == n.lower() for n in names)
    assert len({n.casefold() for n in names}) == len(keys)
    h = History(tmp_path / "data")
    upper = tmp_path / "PHOTO.JPG"
    upper.write_bytes(b"\xff\xd8\xff" + os.urandom(500))
    same_bytes = tmp_path / "photo.jpg"
    same_bytes.write_bytes(upper.read_bytes())
    ref = h.add_picture(upper)
    assert ref == ref.lower() and h.add_picture(same_bytes) == ref
    stored = [p.name for p in h.pictures_dir.rglob("*") if p.is_file()]
    assert stored == [ref]
