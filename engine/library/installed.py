"""Models already in the HF cache: list them, resolve a repo id to its snapshot folder (offline),
delete one with the bytes it frees (huggingface_hub's cache scan/delete API)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import repo_check
from .fetch import PART_SUFFIX
from .hub import LibraryError, NotFound, hub_cache_dir, is_repo_id, repo_folder
from .hub_values import is_commit_id


@dataclass(frozen=True)
class InstalledModel:
    repo_id: str
    commit: str
    snapshot: Path
    size_on_disk: int
    complete: bool  # config.json and every weight shard present
    model_type: str | None


def snapshot_for(repo_dir: Path, revision: str = "main") -> Path | None:
    ref = repo_dir / "refs" / revision
    try:
        commit = ref.read_text().strip()
        # a ref written by anything but a commit id (an older Parley trusted the hub) is ignored
        snap = repo_dir / "snapshots" / commit if is_commit_id(commit) else None
        if snap is not None and snap.is_dir():
            return snap
    except OSError:
        pass
    snap = repo_dir / "snapshots" / revision  # a commit hash given directly
    if snap.is_dir():
        return snap
    snaps = [p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()]
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def is_complete(snapshot: Path) -> bool:
    """A pulled snapshot: config.json and weights; with a shard index, every shard it names."""
    if not (snapshot / "config.json").is_file():
        return False
    index = repo_check.read_json(snapshot / repo_check.INDEX)
    if index is not None:
        return all((snapshot / s).is_file() for s in set(index.get("weight_map", {}).values()))
    return any(p.is_file() for p in snapshot.glob("*.safetensors"))


def installed_models(cache: Path | None = None) -> list[InstalledModel]:
    """Every model repo in the cache (complete or not), read from disk only."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = cache or hub_cache_dir()
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        snap = snapshot_for(repo.repo_path)
        if snap is None:
            continue
        config = repo_check.read_json(snap / "config.json") or {}
        out.append(
            InstalledModel(
                repo.repo_id, snap.name, snap, repo.size_on_disk, is_complete(snap), config.get("model_type")
            )
        )
    return out


def resolve_model(text: str, cache: Path | None = None, revision: str = "main") -> Path | None:
    """A repo id ("ORG/NAME") present in the cache -> its snapshot folder; None otherwise.
    An existing folder always wins, so a relative path that looks like a repo id still works."""
    if not is_repo_id(text) or Path(text).expanduser().exists():
        return None
    repo_dir = repo_folder(text, cache)
    if not repo_dir.is_dir():
        return None
    snap = snapshot_for(repo_dir, revision)
    return snap if snap is not None and is_complete(snap) else None


def partial_download(text: str, cache: Path | None = None) -> str | None:
    """The sentence for a repo id that is in the cache without a complete snapshot (a pull that
    did not finish publishes nothing); None when it is complete, absent, or a folder."""
    if not is_repo_id(text) or Path(text).expanduser().exists():
        return None
    if not repo_folder(text, cache).is_dir() or resolve_model(text, cache) is not None:
        return None
    return (
        f"{text}: the download is incomplete, so there is nothing verified to load; run "
        f"`python main.py models pull {text}` to finish it"
    )


def delete_model(repo_id: str, cache: Path | None = None) -> int:
    """Remove every revision of `repo_id` and any partial download; returns the bytes freed."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = cache or hub_cache_dir()
    repo_dir = repo_folder(repo_id, cache)
    parts = list((repo_dir / "blobs").glob("*" + PART_SUFFIX)) if repo_dir.is_dir() else []
    freed = 0
    for part in parts:
        freed += part.stat().st_size
        part.unlink()
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        info = None
    repo = (
        None if info is None else next((r for r in info.repos if r.repo_id == repo_id and r.repo_type == "model"), None)
    )
    if info is None or repo is None:
        if parts:
            return freed
        raise NotFound(f"{repo_id} is not installed in {cache}")
    strategy = info.delete_revisions(*[r.commit_hash for r in repo.revisions])
    freed += strategy.expected_freed_size
    strategy.execute()
    if repo_dir.is_dir():  # config-only leftovers (refs, .no_exist) of a repo with no revision left
        import shutil

        shutil.rmtree(repo_dir, ignore_errors=True)
    if repo_dir.exists():
        raise LibraryError(f"could not remove {repo_dir} completely")
    return freed
