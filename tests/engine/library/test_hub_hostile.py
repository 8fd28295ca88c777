"""A hostile hub behind HF_ENDPOINT (the loopback stand-in in hostile mode, the real
huggingface_hub client): whatever it announces, a pull creates nothing outside the cache root,
publishes nothing it did not verify, reads no more than was announced, and says what went wrong
in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.library.fetch import ChecksumMismatch
from engine.library.hub import AccessDenied, LibraryError, NetworkUnreachable, repo_folder
from engine.library.installed import partial_download, resolve_model
from engine.library.pull import JSON_MAX_BYTES, plan_pull, pull
from tests.fixtures.hub_standin import hub, safetensors_bytes  # noqa: F401 (hub: the fixture)

ROOT = Path(__file__).resolve().parents[3]
BIG = "model.safetensors"
REPO = "acme/hostile"


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "hf" / "hub"


def _repo(hub, mib=2):
    files = {
        "config.json": b'{"model_type": "llava"}',
        "chat_template.jinja": b"{{ messages }}",
        BIG: safetensors_bytes(mib << 20),
    }
    return hub.add_repo(REPO, files)


def listing(root: Path) -> set[str]:
    """Every path under `root` (links not followed), relative."""
    out = set()
    for folder, dirs, files in os.walk(root):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(folder, n), root))
    return out


class Around:
    """The filesystem around the cache (tmp_path: the cache, its parents' siblings, where a
    `../` would land) listed before and after; `outside()` is what appeared outside the cache."""

    def __init__(self, root: Path, cache: Path):
        self.root, self.cache = root, os.path.relpath(cache, root)
        self.before = listing(root)

    def outside(self) -> set[str]:
        return {
            p
            for p in listing(self.root) - self.before
            if p != self.cache and not p.startswith(self.cache + os.sep) and not self.cache.startswith(p + os.sep)
        }  # the cache's own parents, made for it


def unpublished(cache: Path, repo_id: str = REPO) -> bool:
    repo_dir = repo_folder(repo_id, cache)
    return (
        not (repo_dir / "snapshots").exists()
        and not (repo_dir / "refs").exists()
        and resolve_model(repo_id, cache) is None
    )


# ---------------------------------------------------------------- values that climb out of the cache


@pytest.mark.parametrize(
    "lie, value",
    [
        ("commit", "../../../../out/evil_snapshot"),
        ("commit", "0" * 39 + "/"),
        ("sha256", "../../../../out/evil_blob"),
        ("sha256", "ab" * 31 + "zz"),
        ("blob_id", "/etc/passwd"),
        ("blob_id", "../../../../out/evil"),
        ("names", "..\\..\\config.json"),
        ("names", "C:config.json"),
        ("names", "../../../../out/config.json"),
    ],
)
def test_a_value_that_leaves_the_cache_is_refused_before_anything_is_written(hub, cache, tmp_path, lie, value):
    repo = _repo(hub)
    target = BIG if lie == "sha256" else "config.json"
    if lie == "commit":
        hub.lies.commit = value
    else:
        getattr(hub.lies, lie)[target] = value
    around = Around(tmp_path, cache)
    with pytest.raises(LibraryError) as exc:
        pull(plan_pull(REPO))
    message = str(exc.value)
    assert "\n" not in message and repr(value) in message and "refus" in message, message
    assert around.outside() == set()
    assert not repo_folder(REPO, cache).exists()  # refused while planning: nothing at all was written
    assert repo.files[BIG].name not in hub.sent


def test_an_etag_that_climbs_out_is_never_a_path(hub, cache, tmp_path):
    """huggingface_hub names a small file's blob after the ETag the server sends; Parley names
    it after the blob id the listing gave (checked), and checks the bytes against it."""
    _repo(hub)
    hub.lies.etag["config.json"] = "../../../../out/etag_blob"
    hub.lies.etag[BIG] = "../../../../out/etag_big"
    around = Around(tmp_path, cache)
    snap = pull(plan_pull(REPO))
    assert around.outside() == set()
    assert (snap / "config.json").read_bytes() == b'{"model_type": "llava"}'


def test_a_revision_that_climbs_out_is_refused(hub, cache, tmp_path):
    _repo(hub)
    around = Around(tmp_path, cache)
    with pytest.raises(LibraryError, match="refus"):
        plan_pull(REPO, revision="../../x")
    assert around.outside() == set() and hub.requests == []  # refused before asking
    res = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "models", "pull", REPO, "--revision", "../../x"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "revision" in res.stderr, res.stderr
    assert around.outside() == set()


# ---------------------------------------------------------------- nothing unverified is published


def test_a_small_file_of_the_wrong_size_publishes_nothing(hub, cache, tmp_path):
    _repo(hub)
    hub.lies.size["chat_template.jinja"] = len(b"{{ messages }}") + 10  # listed longer than it is
    around = Around(tmp_path, cache)
    with pytest.raises(LibraryError) as exc:
        pull(plan_pull(REPO))
    assert "chat_template.jinja" in str(exc.value) and "shorter" in str(exc.value)
    assert around.outside() == set() and unpublished(cache)
    hub.lies.size["chat_template.jinja"] = 3  # listed shorter than it is
    with pytest.raises(LibraryError) as exc:
        pull(plan_pull(REPO))
    assert "chat_template.jinja" in str(exc.value) and "more than" in str(exc.value)
    assert unpublished(cache)
    # the model cannot be used by name: one line that says the download is incomplete and how to finish it
    res = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "ask", "--model", REPO, "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
        cwd=tmp_path,
    )
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "incomplete" in res.stderr and f"models pull {REPO}" in res.stderr
    assert partial_download(REPO, cache) is not None


def test_a_small_file_with_one_flipped_byte_is_caught_by_its_git_blob_id(hub, cache):
    _repo(hub)
    hub.faults.corrupt_at["config.json"] = 5  # same size, one byte different
    with pytest.raises(ChecksumMismatch, match="config.json.*git SHA-1"):
        pull(plan_pull(REPO))
    assert unpublished(cache)
    blobs = repo_folder(REPO, cache) / "blobs"
    assert not any(blobs.glob(hub.repos[REPO].files["config.json"].blob_id + "*"))
    hub.faults.corrupt_at.clear()
    assert (pull(plan_pull(REPO)) / "config.json").read_bytes() == b'{"model_type": "llava"}'


# ---------------------------------------------------------------- bodies bounded by what was announced


@pytest.mark.parametrize("name", [BIG, "chat_template.jinja"])
def test_an_endless_body_stops_at_the_announced_size(hub, cache, tmp_path, name):
    repo = _repo(hub)
    size = len(repo.files[name].data)
    hub.lies.endless.add(name)
    around = Around(tmp_path, cache)
    with pytest.raises(LibraryError) as exc:
        pull(plan_pull(REPO))
    assert name in str(exc.value) and "more than" in str(exc.value)
    assert hub.sent[name] < size + (16 << 20)  # what the socket buffers took, not 200 MB
    assert around.outside() == set() and unpublished(cache)
    assert not [p for p in (repo_folder(REPO, cache) / "blobs").iterdir() if p.stat().st_size > size]


def test_a_huge_config_json_is_refused_by_name_without_reading_it_all(hub):
    _repo(hub)
    hub.lies.endless.add("config.json")
    with pytest.raises(LibraryError) as exc:
        plan_pull(REPO)
    assert "config.json" in str(exc.value) and "larger than" in str(exc.value)
    assert hub.sent["config.json"] < JSON_MAX_BYTES + (16 << 20)


# ---------------------------------------------------------------- what went wrong, said right


def test_a_short_body_on_a_small_file_says_the_server_cut_it(hub, cache):
    _repo(hub)
    hub.faults.short.add("chat_template.jinja")
    with pytest.raises(LibraryError) as exc:
        pull(plan_pull(REPO))
    assert not isinstance(exc.value, NetworkUnreachable)
    assert "chat_template.jinja" in str(exc.value) and "cut" in str(exc.value), str(exc.value)
    assert unpublished(cache)


def test_a_403_on_a_small_file_says_access_denied(hub):
    _repo(hub)
    hub.faults.forbidden.add("chat_template.jinja")
    with pytest.raises(AccessDenied, match="HTTP 403"):
        pull(plan_pull(REPO))


def test_two_pulls_at_once_fetch_the_big_file_once(hub, cache):
    repo = _repo(hub, mib=6)
    size = len(repo.files[BIG].data)
    go = threading.Event()
    hub.faults.hold_at[BIG] = (size // 2, go)  # the first pull pauses mid-file, holding the file's lock
    second_waits = threading.Event()
    results: dict = {}

    def first():
        results["first"] = pull(plan_pull(REPO))

    def second():
        results["second"] = pull(plan_pull(REPO), lambda p: p.file == BIG and second_waits.set())

    t1 = threading.Thread(target=first)
    t1.start()
    assert hub.holding.wait(30)  # the first pull is inside the big file, holding its lock
    t2 = threading.Thread(target=second)
    t2.start()
    assert second_waits.wait(30)  # the second pull has reached the big file (and its lock)
    go.set()
    t1.join(60)
    t2.join(60)
    assert results["first"] == results["second"]
    assert hub.sent[BIG] == size  # once


def test_a_password_in_the_hub_endpoint_is_never_shown(hub, monkeypatch):
    from tests.helpers.remote_servers import free_port

    monkeypatch.setenv("HF_ENDPOINT", f"http://alice:s3cret-pw@127.0.0.1:{free_port()}")
    with pytest.raises(NetworkUnreachable) as exc:
        plan_pull(REPO)
    assert "s3cret-pw" not in str(exc.value) and "127.0.0.1" in str(exc.value)


def test_a_link_another_pull_made_first_is_kept(tmp_path, monkeypatch):
    """Two pulls of one repo link the same snapshot file: the one that finds the link made between
    its check and its own symlink keeps it (seen in the two-pulls test above: it copied the blob
    onto itself and failed the pull)."""
    from engine.library import pull as pull_module

    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"weights")
    snapshot = tmp_path / "snapshots" / "c0"
    real_symlink = os.symlink

    def other_pull_first(target, pointer):
        real_symlink(target, pointer)  # the other pull, between this one's check and its symlink
        real_symlink(target, pointer)

    monkeypatch.setattr(pull_module.os, "symlink", other_pull_first)
    pull_module._link(snapshot, "model.safetensors", blob)
    assert (snapshot / "model.safetensors").is_symlink()
    assert (snapshot / "model.safetensors").read_bytes() == b"weights"
