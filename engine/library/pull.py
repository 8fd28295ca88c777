"""Pull a model from the Hub into the standard HF cache: plan (file list, folder check, sizes),
disk-space check, then fetch. Small files go through huggingface_hub's own hf_hub_download; large
(LFS) files through fetch.fetch_blob (resumable, SHA-256 verified). The cache layout is the Hub's
(blobs/, snapshots/<commit>/ links, refs/<revision>), so other tools share the files.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import repo_check
from .fetch import PART_SUFFIX, Cancelled, fetch_blob
from .hub import LibraryError, endpoint, hub_cache_dir, repo_folder, translate
from .progress import ProgressCallback, ProgressMeter

SPACE_MARGIN = 64 << 20  # keep this much free after a pull
META_TIMEOUT_S = 15  # model info and small JSON files: a dead network must not hang the page
META_CONNECT_TIMEOUT_S = 5  # a network that drops packets fails here, not after the whole 15 s


class NoSpace(LibraryError):
    pass


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files only
    blob_id: str | None

    @property
    def etag(self) -> str:  # the blob's file name in the cache, as huggingface_hub names it
        return self.sha256 or self.blob_id or ""


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


def fetch_json(repo_id: str, filename: str, commit: str, token: str | None) -> dict | None:
    """A small JSON file read into memory (not the cache), e.g. config.json for a fit estimate."""
    import httpx2
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint())
    try:
        r = get_session().get(url, headers=build_hf_headers(token=token or False), follow_redirects=True,
                              timeout=httpx2.Timeout(META_TIMEOUT_S, connect=META_CONNECT_TIMEOUT_S))
        hf_raise_for_status(r)
        return json.loads(r.content)
    except ValueError:
        return None
    except Exception as exc:
        raise translate(exc, repo_id, commit) from None


def plan_pull(repo_id: str, revision: str = "main", token: str | None = None) -> PullPlan:
    """Ask the Hub what the model consists of and whether Parley can load it (small requests only)."""
    try:
        info = _api().model_info(repo_id, revision=revision, files_metadata=True, token=token or False,
                                 timeout=META_TIMEOUT_S)
    except Exception as exc:
        raise translate(exc, repo_id, revision) from None
    siblings = info.siblings or []
    names = [s.rfilename for s in siblings]
    commit = info.sha or revision
    index = fetch_json(repo_id, repo_check.INDEX, commit, token) if repo_check.INDEX in names else None
    config = fetch_json(repo_id, "config.json", commit, token) if "config.json" in names else None
    carrier = repo_check.template_source(names)
    carrier_json = fetch_json(repo_id, carrier, commit, token) if carrier else None
    wanted = set(repo_check.needed_files(names, index))
    files = [RemoteFile(s.rfilename, int(s.lfs.size if s.lfs else s.size or 0), s.lfs.sha256 if s.lfs else None,
                        s.blob_id) for s in siblings if s.rfilename in wanted]
    return PullPlan(repo_id, revision, commit, files, config,
                    repo_check.problem(config, names, carrier_json), token)


def bytes_to_fetch(plan: PullPlan, cache: Path) -> int:
    blobs = repo_folder(plan.repo_id, cache) / "blobs"
    need = 0
    for f in plan.files:
        if (blobs / f.etag).exists():
            continue
        part = blobs / (f.etag + PART_SUFFIX)
        need += f.size - (part.stat().st_size if part.exists() else 0)
    return need


def _link(snapshot: Path, name: str, blob: Path) -> None:
    pointer = snapshot / name
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
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


def pull(plan: PullPlan, on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
         cache: Path | None = None) -> Path:
    """Fetch every planned file; returns the snapshot folder once all are present and verified."""
    from filelock import FileLock
    from huggingface_hub import hf_hub_download, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    cache = cache or hub_cache_dir()
    cancel = cancel or threading.Event()
    repo_dir = repo_folder(plan.repo_id, cache)
    need = bytes_to_fetch(plan, cache)
    free = free_bytes(cache)
    if need + SPACE_MARGIN > free:
        raise NoSpace(f"not enough disk space in {cache}: {plan.repo_id} needs {need / 1e9:.2f} GB more "
                      f"(+{SPACE_MARGIN >> 20} MiB margin), {free / 1e9:.2f} GB free")
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / plan.commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    locks = cache / ".locks" / repo_dir.name
    locks.mkdir(parents=True, exist_ok=True)
    meter = ProgressMeter(plan.total_bytes, on_progress)
    headers = build_hf_headers(token=plan.token or False)
    # small files first: the folder is usable for a check as soon as possible
    for f in sorted(plan.files, key=lambda f: (f.sha256 is not None, f.size)):
        meter.file = f.name
        blob = blobs / f.etag
        if cancel.is_set():
            raise Cancelled(f"cancelled before {f.name}")
        try:
            if blob.exists() and (not f.sha256 or blob.stat().st_size == f.size):
                meter.resumed_from_disk(f.size)
            elif f.sha256 is None:
                hf_hub_download(plan.repo_id, f.name, revision=plan.commit, cache_dir=cache,
                                endpoint=endpoint(), token=plan.token or False, tqdm_class=_Silent)
                meter.add(f.size)
            else:
                with FileLock(str(locks / (f.etag + ".lock"))):
                    url = hf_hub_url(plan.repo_id, f.name, revision=plan.commit, endpoint=endpoint())
                    fetch_blob(get_session(), url, headers, blob, f.sha256, f.size, meter, cancel, f.name)
        except LibraryError:
            raise
        except Exception as exc:
            raise translate(exc, plan.repo_id, plan.revision) from None
        if not (snapshot / f.name).exists():
            _link(snapshot, f.name, blob)
    _write_ref(repo_dir, plan.revision, plan.commit)
    meter.finish()
    missing = [f.name for f in plan.files if not (snapshot / f.name).is_file()
               or (snapshot / f.name).stat().st_size != f.size]
    if missing:
        raise LibraryError(f"{plan.repo_id}: incomplete snapshot, missing or wrong size: {', '.join(missing)}")
    return snapshot


def _silent_tqdm():
    from tqdm.auto import tqdm

    class Silent(tqdm):  # our own meter reports progress; hf's per-file bars would interleave
        def __init__(self, *a, **k):
            k["disable"] = True
            super().__init__(*a, **k)

    return Silent


_Silent = _silent_tqdm()
