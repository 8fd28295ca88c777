"""Pull a model from the Hub into the standard HF cache: plan (file list, folder check, sizes),
disk-space check, then fetch. The cache layout is the Hub's (blobs/, snapshots/<commit> links,
refs/<revision>), so other tools share the files.

Every file goes through fetch.fetch_blob (resumable, bounded by the listed size, verified against
the listed sha256 or git blob id). Small files used to go through huggingface_hub's
hf_hub_download, but it names their blob after the ETag the server sends and their snapshot
after its X-Repo-Commit, writes the whole body before comparing sizes and never checks the git
blob id (tests/engine/library/test_hub_hostile.py shows each against a hostile stand-in). Every value from the
hub is checked where it enters (hub_values), every path is checked to lie under the cache before
anything is created, and the snapshot (links, then the ref) is published only once every file
is on disk and verified.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import hub_values, repo_check
from .fetch import PART_SUFFIX, Cancelled, fetch_blob
from .hub import LibraryError, endpoint, hub_cache_dir, repo_folder, translate
from .hub_values import Digest, inside
from .progress import ProgressCallback, ProgressMeter

SPACE_MARGIN = 64 << 20  # keep this much free after a pull
META_TIMEOUT_S = 15  # model info and small JSON files: a dead network must not hang the page
META_CONNECT_TIMEOUT_S = 5  # a network that drops packets fails here, not after the whole 15 s
# config.json and friends are read into memory for the checks before a download; a big model's
# shard index is under 10 MB, so a body past this is refused rather than read
JSON_MAX_BYTES = 16 << 20


class NoSpace(LibraryError):
    pass


class TooLarge(LibraryError):
    pass


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    digest: Digest  # what its bytes hash to; digest.hex names its blob in the cache

    @classmethod
    def listed(cls, sibling) -> RemoteFile:
        """A file as the hub's model info lists it, each value checked (HubValueError if not)."""
        name = hub_values.file_name(sibling.rfilename)
        if sibling.lfs is not None:
            size = hub_values.file_size(sibling.lfs.size, name)
            return cls(name, size, Digest("sha256", hub_values.content_sha256(sibling.lfs.sha256, name)))
        size = hub_values.file_size(sibling.size if sibling.size is not None else 0, name)
        return cls(name, size, Digest("git-sha1", hub_values.git_blob_id(sibling.blob_id, name)))

    @property
    def lfs(self) -> bool:
        return self.digest.kind == "sha256"

    @property
    def blob(self) -> str:  # the blob's file name in the cache, as huggingface_hub names it
        return self.digest.hex


@dataclass
class PullPlan:
    repo_id: str
    revision: str
    commit: str
    files: list[RemoteFile]
    config: dict | None
    problem: str | None  # from repo_check.problem: why Parley could not load it
    token: str | None = field(default=None, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def free_bytes(folder: Path) -> int:
    """Free space where `folder` lives (its nearest existing parent). Tests replace this probe."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def fetch_json(repo_id: str, filename: str, commit: str, token: str | None, size: int | None = None) -> dict | None:
    """A small JSON object read into memory (not the cache), e.g. config.json for a fit estimate;
    None when it is not a JSON object. At most JSON_MAX_BYTES are read (`size`: the listed one)."""
    import httpx2
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    too_large = TooLarge(
        f"{repo_id}: {filename} is larger than the {JSON_MAX_BYTES >> 20} MiB Parley reads to check a model; refused"
    )
    if size is not None and size > JSON_MAX_BYTES:
        raise too_large
    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint())
    body = bytearray()
    try:
        with get_session().stream(
            "GET",
            url,
            headers=build_hf_headers(token=token or False),
            follow_redirects=True,
            timeout=httpx2.Timeout(META_TIMEOUT_S, connect=META_CONNECT_TIMEOUT_S),
        ) as r:
            hf_raise_for_status(r)
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > JSON_MAX_BYTES:
                    raise too_large
    except LibraryError:
        raise
    except Exception as exc:
        raise translate(exc, repo_id, commit) from None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def plan_pull(repo_id: str, revision: str = "main", token: str | None = None) -> PullPlan:
    """Ask the Hub what the model consists of and whether Parley can load it (small requests only)."""
    revision = hub_values.revision(revision)
    try:
        info = _api().model_info(
            repo_id, revision=revision, files_metadata=True, token=token or False, timeout=META_TIMEOUT_S
        )
    except Exception as exc:
        raise translate(exc, repo_id, revision) from None
    commit = hub_values.commit_id(info.sha)
    siblings = info.siblings or []
    sizes = {hub_values.file_name(s.rfilename): s.size for s in siblings}
    names = list(sizes)

    def small_json(name: str) -> dict | None:
        size = sizes.get(name)
        return fetch_json(repo_id, name, commit, token, size if isinstance(size, int) else None)

    index = small_json(repo_check.INDEX) if repo_check.INDEX in names else None
    config = small_json("config.json") if "config.json" in names else None
    carrier = repo_check.template_source(names)
    carrier_json = small_json(carrier) if carrier else None
    wanted = set(repo_check.needed_files(names, index))
    files = [RemoteFile.listed(s) for s in siblings if s.rfilename in wanted]
    return PullPlan(repo_id, revision, commit, files, config, repo_check.problem(config, names, carrier_json), token)


def bytes_to_fetch(plan: PullPlan, cache: Path) -> int:
    blobs = repo_folder(plan.repo_id, cache) / "blobs"
    need = 0
    for f in plan.files:
        if _on_disk(blobs / f.blob, f):
            continue
        part = blobs / (f.blob + PART_SUFFIX)
        need += f.size - (part.stat().st_size if part.exists() else 0)
    return need


def _on_disk(blob: Path, f: RemoteFile) -> bool:
    """The verified blob is there (a blob only gets its name once its hash was checked)."""
    try:
        return blob.stat().st_size == f.size
    except OSError:
        return False


def _link(snapshot: Path, name: str, blob: Path) -> None:
    pointer = snapshot / name
    pointer.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, pointer.parent)
    if pointer.is_symlink() and os.readlink(pointer) == target:
        return
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(target, pointer)
    except FileExistsError:  # another pull of the same repo linked it between the check and here
        if not (pointer.is_symlink() and os.readlink(pointer) == target):
            raise
    except OSError:  # Windows without symlink rights: huggingface_hub copies too
        shutil.copyfile(blob, pointer)


def _write_ref(repo_dir: Path, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo_dir / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


@contextmanager
def _file_lock(path: Path, meter: ProgressMeter):
    """huggingface_hub's per-blob lock (the same file it takes), so two pulls of one file (two
    windows, a window and `models pull`) fetch it once; waiting for it is said."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        meter.waiting()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def pull(
    plan: PullPlan,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    cache: Path | None = None,
) -> Path:
    """Fetch every planned file; returns the snapshot folder, published once all are present and verified."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    cache = cache or hub_cache_dir()
    cancel = cancel or threading.Event()
    repo_dir = repo_folder(plan.repo_id, cache)
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / plan.commit
    locks = cache / ".locks" / repo_dir.name
    # every path this pull may create, checked before it creates any
    for path in (
        blobs,
        snapshot,
        locks,
        repo_dir / "refs" / plan.revision,
        *(p for f in plan.files for p in (blobs / f.blob, snapshot / f.name, locks / (f.blob + ".lock"))),
    ):
        inside(cache, path)
    need = bytes_to_fetch(plan, cache)
    free = free_bytes(cache)
    if need + SPACE_MARGIN > free:
        raise NoSpace(
            f"not enough disk space in {cache}: {plan.repo_id} needs {need / 1e9:.2f} GB more "
            f"(+{SPACE_MARGIN >> 20} MiB margin), {free / 1e9:.2f} GB free"
        )
    blobs.mkdir(parents=True, exist_ok=True)
    locks.mkdir(parents=True, exist_ok=True)
    meter = ProgressMeter(plan.total_bytes, on_progress)
    headers = build_hf_headers(token=plan.token or False)
    for f in sorted(plan.files, key=lambda f: (f.lfs, f.size)):  # small files first: errors show early
        meter.file = f.name
        blob = blobs / f.blob
        if cancel.is_set():
            raise Cancelled(f"cancelled before {f.name}")
        try:
            if not _on_disk(blob, f):
                with _file_lock(locks / (f.blob + ".lock"), meter):
                    if not _on_disk(blob, f):  # else another pull finished it while this one waited
                        url = hf_hub_url(plan.repo_id, f.name, revision=plan.commit, endpoint=endpoint())
                        fetch_blob(get_session(), url, headers, blob, f.digest, f.size, meter, cancel, f.name)
                        continue
            meter.resumed_from_disk(f.size)
        except LibraryError:
            raise
        except Exception as exc:
            raise translate(exc, plan.repo_id, plan.revision) from None
    missing = [f.name for f in plan.files if not _on_disk(blobs / f.blob, f)]
    if missing:
        raise LibraryError(f"{plan.repo_id}: incomplete download, missing or wrong size: {', '.join(missing)}")
    for f in plan.files:  # published: links first, the ref last
        _link(snapshot, f.name, blobs / f.blob)
    _write_ref(repo_dir, plan.revision, plan.commit)
    meter.finish()
    return snapshot


def _silent_tqdm():
    from tqdm.auto import tqdm

    class Silent(tqdm):  # our own meter reports progress; hf's per-file bars would interleave
        def __init__(self, *a, **k):
            k["disable"] = True
            super().__init__(*a, **k)

    return Silent


_Silent = _silent_tqdm()
