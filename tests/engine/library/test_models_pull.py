"""Pulls through the real huggingface_hub client against the loopback hub stand-in."""

from __future__ import annotations

import os
import threading

import pytest

from engine.library import pull as pull_mod
from engine.library.fetch import PART_SUFFIX, Cancelled, ChecksumMismatch
from engine.library.hub import AccessDenied, NetworkUnreachable, NotFound, repo_folder
from engine.library.installed import delete_model, installed_models, resolve_model
from engine.library.pull import NoSpace, plan_pull, pull
from tests.fixtures.hub_standin import hub, safetensors_bytes  # noqa: F401 (hub: the fixture)

BIG = "model.safetensors"


def _big_repo(hub, repo_id="acme/big", mib=6, **kw):
    """A repo with a tiny model's small files and one large safetensors file (not loadable)."""
    weights = safetensors_bytes(mib << 20)
    files = {"config.json": b'{"model_type": "llava"}', "chat_template.jinja": b"{{ messages }}", BIG: weights}
    return hub.add_repo(repo_id, files, **kw), len(weights)


def test_full_pull_then_load_with_parleys_loader(hub, tiny_model, tmp_path):
    from engine.model.load import load_model

    repo = hub.add_folder("acme/tiny-smolvlm", tiny_model("smolvlm"))
    plan = plan_pull("acme/tiny-smolvlm")
    assert plan.problem is None and plan.commit == repo.commit
    seen = []
    snap = pull(plan, seen.append)
    repo_dir = repo_folder("acme/tiny-smolvlm")
    # the Hub's cache layout: LFS blob named by sha256, snapshot links, refs/main -> commit
    sha = repo.files[BIG].sha256
    assert (repo_dir / "blobs" / sha).stat().st_size == len(repo.files[BIG].data)
    assert (snap / BIG).is_symlink() and os.path.realpath(snap / BIG) == str(repo_dir / "blobs" / sha)
    assert (repo_dir / "refs" / "main").read_text() == repo.commit
    assert seen[-1].done_bytes == seen[-1].total_bytes == plan.total_bytes
    assert resolve_model("acme/tiny-smolvlm") == snap
    [listed] = installed_models()
    assert listed.repo_id == "acme/tiny-smolvlm" and listed.complete
    loaded = load_model(resolve_model("acme/tiny-smolvlm"), device="cpu")
    assert loaded.family.name == "smolvlm"  # its own family, not the Idefics3 one it derives from


def test_dropped_connection_resumes_with_range(hub):
    _repo, size = _big_repo(hub)
    hub.faults.drop_after[BIG] = size // 2
    snap = pull(plan_pull("acme/big"))
    assert (snap / BIG).stat().st_size == size
    resent = hub.sent[BIG] - size
    assert resent < size / 2
    ranges = [r for m, p, r in hub.requests if p.startswith("/lfs/") and r]
    assert ranges and ranges[0] == f"bytes={size // 2}-"


def test_corrupted_byte_is_never_published(hub):
    repo, size = _big_repo(hub)
    hub.faults.corrupt_at[BIG] = size // 3
    plan = plan_pull("acme/big")
    with pytest.raises(ChecksumMismatch, match="SHA-256"):
        pull(plan)
    blobs = repo_folder("acme/big") / "blobs"
    assert not (blobs / repo.files[BIG].sha256).exists()
    assert not (blobs / (repo.files[BIG].sha256 + PART_SUFFIX)).exists()
    assert not (repo_folder("acme/big") / "snapshots" / repo.commit / BIG).exists()
    assert resolve_model("acme/big") is None
    hub.faults.corrupt_at.clear()  # the good bytes arrive on the next pull
    assert (pull(plan_pull("acme/big")) / BIG).stat().st_size == size


def test_cancel_then_resume_keeps_the_partial_file(hub):
    repo, size = _big_repo(hub)
    cancel = threading.Event()

    def on_progress(p):
        if p.file == BIG and p.done_bytes > 1000:
            cancel.set()

    with pytest.raises(Cancelled):
        pull(plan_pull("acme/big"), on_progress, cancel)
    part = repo_folder("acme/big") / "blobs" / (repo.files[BIG].sha256 + PART_SUFFIX)
    kept = part.stat().st_size
    assert 0 < kept < size
    asked_before = len(hub.requests)
    resumed = []
    snap = pull(plan_pull("acme/big"), resumed.append)
    assert (snap / BIG).stat().st_size == size
    lfs_requests = [r for _m, p, r in hub.requests[asked_before:] if p.startswith("/lfs/")]
    assert lfs_requests == [f"bytes={kept}-"]  # only the missing tail was asked for
    assert resumed[-1].resumed_bytes >= kept


def test_server_ignoring_range_restarts_the_file_cleanly(hub):
    repo, size = _big_repo(hub)
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        pull(plan_pull("acme/big"), lambda p: p.file == BIG and cancel.set(), cancel)
    hub.faults.ignore_range.add(BIG)
    seen = []
    snap = pull(plan_pull("acme/big"), seen.append)
    assert (snap / BIG).read_bytes() == repo.files[BIG].data
    assert seen[-1].done_bytes == plan_pull("acme/big").total_bytes  # the thrown-away bytes were rolled back


def test_hf_client_restarts_from_zero(hub, tmp_path):
    """The measurement behind fetch.py: huggingface_hub 2.4 throws a failed file's bytes away."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    _repo, size = _big_repo(hub)
    hub.faults.drop_after[BIG] = size // 2
    cache = tmp_path / "hf-own"

    # make its in-process retry fail: drop, then 503 on every later request
    original = hub.count

    def count_then_fail(name, n):
        original(name, n)
        if hub.sent.get(name, 0) >= size // 2:
            hub.faults.unavailable.add(name)

    hub.count = count_then_fail
    with pytest.raises((HfHubHTTPError, OSError)):
        hf_hub_download("acme/big", BIG, cache_dir=cache, endpoint=hub.url)
    hub.count = original
    hub.faults.unavailable.clear()
    before = hub.sent[BIG]
    hf_hub_download("acme/big", BIG, cache_dir=cache, endpoint=hub.url)
    assert hub.sent[BIG] - before == size  # the whole file again, from byte 0
    assert not list(cache.rglob("*.incomplete"))


def test_gated_repo_needs_a_token(hub):
    _big_repo(hub, "acme/gated", mib=1, gated_token="hf_good")
    with pytest.raises(AccessDenied) as no_token:
        pull(plan_pull("acme/gated"))
    assert "HTTP 401" in str(no_token.value) and f"{hub.url}/acme/gated" in str(no_token.value)
    with pytest.raises(AccessDenied, match="HTTP 403"):
        pull(plan_pull("acme/gated", token="hf_wrong"))
    assert pull(plan_pull("acme/gated", token="hf_good")).is_dir()


def test_missing_repo_is_404_with_its_url(hub):
    with pytest.raises(NotFound) as exc:
        plan_pull("acme/nothing-here")
    assert str(exc.value) == f"HTTP 404: acme/nothing-here not found at {hub.url}/acme/nothing-here"


def test_not_enough_space_stops_before_any_byte(hub, monkeypatch):
    _repo, size = _big_repo(hub)
    monkeypatch.setattr(pull_mod, "free_bytes", lambda _folder: 10 << 20)
    with pytest.raises(NoSpace) as exc:
        pull(plan_pull("acme/big"))
    assert "needs 0.01 GB more" in str(exc.value) and "0.01 GB free" in str(exc.value)
    assert BIG not in hub.sent


def test_real_small_disk_refuses_a_model_that_cannot_fit(hub, small_disk, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(small_disk.root / "hub"))
    _big_repo(hub, mib=12)  # 12 MiB onto an 8 MiB tmpfs
    with pytest.raises(NoSpace, match="GB free"):
        pull(plan_pull("acme/big"))
    assert BIG not in hub.sent


def test_disk_full_mid_file_keeps_what_arrived_and_resumes(hub, small_disk, monkeypatch):
    from engine.library.hub import DiskFull

    monkeypatch.setenv("HF_HUB_CACHE", str(small_disk.root / "hub"))
    monkeypatch.setattr(pull_mod, "SPACE_MARGIN", 0)
    repo, size = _big_repo(hub, mib=6)
    filler = small_disk.root / "other-files"
    filler.write_bytes(b"\0" * (4 << 20))  # 8 MiB disk, 4 MiB taken by something else
    monkeypatch.setattr(pull_mod, "free_bytes", lambda _folder: 1 << 40)  # a probe that got it wrong
    with pytest.raises(DiskFull) as exc:
        pull(plan_pull("acme/big"))
    assert str(exc.value).startswith(f"disk full while writing {BIG} into ")
    part = repo_folder("acme/big") / "blobs" / (repo.files[BIG].sha256 + PART_SUFFIX)
    kept = part.stat().st_size
    assert 0 < kept < size
    filler.unlink()  # the user frees space; the next pull continues from what is on disk
    asked_before = len(hub.requests)
    assert (pull(plan_pull("acme/big")) / BIG).read_bytes() == repo.files[BIG].data
    assert [r for _m, p, r in hub.requests[asked_before:] if p.startswith("/lfs/")] == [f"bytes={kept}-"]


def test_offline_lists_installed_models_and_says_unreachable(hub, monkeypatch):
    _big_repo(hub)
    snap = pull(plan_pull("acme/big"))
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused, like no network
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{dead}")
    with pytest.raises(NetworkUnreachable, match="network unreachable"):
        plan_pull("acme/big")
    assert [m.repo_id for m in installed_models()] == ["acme/big"]
    assert resolve_model("acme/big") == snap


def test_delete_frees_the_blob_bytes(hub):
    _repo, size = _big_repo(hub)
    pull(plan_pull("acme/big"))
    freed = delete_model("acme/big")
    assert freed >= size
    assert not repo_folder("acme/big").exists()
    with pytest.raises(NotFound):
        delete_model("acme/big")
