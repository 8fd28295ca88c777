"""Engine side of the SSD session spill: when to spill, stepping jobs between requests,
restoring a conversation's prefix before its turn.

SpillScheduler is the policy; the mechanism lives in engine/kvstore (the block store, and one
spill's copies and writes in kvstore/spill_job.py). This file decides *when* and keeps the rules:
a conversation is freed only after its spill is committed, a failed spill leaves it hot, and a
spill never holds up a waiting turn for more than one unit.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..kvstore import (
    KVStore,
    KVStoreError,
    RowMatch,
    SpillJob,
    SpillResult,
    StoreUnavailable,
    UnsupportedCache,
    best_of,
    model_refusal,
)
from ..pictures.span import cut_before
from ..protocol.events import Notice, SpillState, SpillStatus
from .rates import RateBook
from .session import Session

log = logging.getLogger(__name__)

FORMAT = b"parley-kv-dynamic-v1"
STORE_RETRY_S = 30.0  # how often an unavailable store (disk full) is tried again


@dataclass
class CommittedSpill:
    """A conversation's latest committed spill, reported with its next turn."""

    blocks_written: int = 0  # blocks and tail blobs written
    blocks_reused: int = 0  # blobs already in the store (another spill or conversation wrote them)


@dataclass
class _Running:
    session: Session
    job: SpillJob
    version: int
    blocking: bool = False


class SpillScheduler:
    def __init__(self, loaded, settings, data_dir: Path, emit: Callable, rates: RateBook):
        self.emit = emit
        self.rates = rates  # every restore measures how fast this machine gives KV back
        self.loaded = loaded
        self.settings = settings
        self.store: KVStore | None = None
        self.refusal = model_refusal(loaded.model.config)
        self.error: str | None = None  # the store cannot be used at all (e.g. not a folder)
        self.unavailable: str | None = None  # it cannot be used now (disk full): retried later
        self._retry_at = 0.0
        self._last_failure: str | None = None
        self.running: _Running | None = None
        self.last_spill: dict[str, CommittedSpill] = {}  # conversation id -> its latest committed spill
        self.failed_at: dict[str, float] = {}
        self._leaving: list[SpillJob] = []  # versions left by a turn, being written (versions below)
        self.root = data_dir / "kv-store"
        if not self.refusal:
            self._open_store()

    def _open_store(self) -> bool:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # cap and free-space floor: the store's own rule unless the settings name a cap
            self.store = KVStore(
                str(self.root),
                FORMAT + self.loaded.fingerprint,
                block_tokens=self.settings.block_tokens,
                unit_bytes=self.settings.unit_bytes,
                max_bytes=self.settings.store_cap_bytes or None,
            )
        except StoreUnavailable as exc:
            self._retry_at = time.monotonic() + STORE_RETRY_S
            if self.unavailable is None:  # said once (the engine logs notices), not on every retry
                self.emit(
                    Notice(
                        "warning",
                        f"The KV store is unavailable ({exc.reason}); idle conversations "
                        f"stay in memory, and it is tried again every {STORE_RETRY_S:.0f} s.",
                    )
                )
            self.unavailable = exc.reason
            return False
        except (KVStoreError, OSError) as exc:
            self.error = str(exc)
            return False
        if self.unavailable is not None:
            self.emit(Notice("info", "The KV store is usable again; idle conversations spill to disk."))
            self.unavailable = None
        return True

    def apply_settings(self, settings) -> None:
        """Settings changed while running (the Settings dialog): the idle time is read from
        `settings` at each look; a new cap goes to the store now (a lower one evicts at once)."""
        cap_changed = settings.store_cap_bytes != self.settings.store_cap_bytes
        self.settings = settings
        if cap_changed and self.store is not None:
            try:
                self.store.set_cap(settings.store_cap_bytes or None)
            except (KVStoreError, sqlite3.Error, OSError) as exc:  # e.g. a full disk: the next spill evicts
                log.warning("the new KV store cap is kept from the next spill: %s", exc)

    def retry(self, now: bool = False) -> bool:
        """Reopen a store that was unavailable (at most every STORE_RETRY_S unless `now`)."""
        if self.store is not None:
            return True
        if self.unavailable is None or (not now and time.monotonic() < self._retry_at):
            return False
        return self._open_store()

    @property
    def status(self) -> str:
        """One line for the memory dock: why the store is not in use, or empty when it is."""
        if self.refusal:
            return "off: " + self.refusal
        if self.error:
            return "unavailable: " + self.error
        if self.unavailable:
            return f"paused: {self.unavailable}; retried every {STORE_RETRY_S:.0f} s"
        return ""

    @property
    def available(self) -> bool:
        return self.store is not None

    # ------------------------------------------------------------------ spilling

    def begin(self, session: Session, blocking: bool = False) -> bool:
        if self.store is None or session.cache is None or self.running is not None:
            return False
        # a session may end inside a picture (a restore of whole blocks, then a failed prefill):
        # what is spilled stops before it, as a stored picture span must end within its tokens
        n = cut_before(len(session.ids), session.pictures)
        try:
            job = self.store.begin_spill(
                session.conversation_id,
                session.ids[:n],
                [p for p in session.pictures if p.end <= n],
                session.cache,
                self._state(session),
            )
        except UnsupportedCache as exc:
            self.emit(SpillState(session.conversation_id, SpillStatus.REFUSED, str(exc)))
            self.failed_at[session.conversation_id] = time.monotonic()
            return False
        self.running = _Running(session, job, session.version, blocking)
        self.emit(SpillState(session.conversation_id, SpillStatus.SPILLING))
        return True

    def step(self, more: Callable[[], bool]) -> bool:
        """Advance the running job while `more()` allows (between units); True when it ended."""
        r = self.running
        if r is None:
            return False
        while not r.job.copies_done and more():
            r.job.step()
        if not r.job.copies_done or not r.job.done():
            return False
        self._finish(r, r.job.result())
        return True

    def cancel_for(self, conversation_id: str) -> None:
        """A turn of the spilling conversation arrived: its copies stop, it stays hot."""
        r = self.running
        if r is not None and r.session.conversation_id == conversation_id and not r.job.copies_done:
            r.job.cancel()
            r.job.wait()
            self.running = None
            self.emit(SpillState(conversation_id, SpillStatus.CANCELLED, "the conversation continued"))

    def _finish(self, r: _Running, result: SpillResult) -> None:
        """The running spill `r` ended with `result`: on success its session is freed (if unchanged since)."""
        self.running = None
        cid = r.session.conversation_id
        if not result.ok:
            self.failed_at[cid] = time.monotonic()
            msg = f"Could not spill conversation to disk ({result.error}); it stays in memory."
            self.emit(SpillState(cid, SpillStatus.FAILED, result.error or ""))
            if result.error != self._last_failure:  # a full disk fails every spill: say it once
                self.emit(Notice("warning", msg))
            self._last_failure = result.error
            return
        self._last_failure = None
        self.last_spill[cid] = CommittedSpill(result.blocks_written + result.tail_written, result.reused_blobs)
        if r.session.version == r.version:  # nothing happened to it meanwhile: free the memory
            r.session.drop_kv()
        self.emit(
            SpillState(
                cid,
                SpillStatus.SPILLED,
                f"{result.blocks_written + result.tail_written} written, {result.reused_blobs} reused",
            )
        )

    def spill_blocking(self, session: Session) -> bool:
        """Spill one session to completion now (exit, make-room, spill-now)."""
        if self.running is not None:
            self._complete(self.running)
        if not self.begin(session, blocking=True):
            return False
        assert self.running is not None  # begin() set it when it said True
        self._complete(self.running)
        return session.cache is None

    def _complete(self, r: _Running) -> None:
        """Run the spill `r` to its end now."""
        r.job.run_copies()
        r.job.wait()
        self._finish(r, r.job.result())

    def due(self, sessions: dict, keep: set[str | None]) -> Session | None:
        """The longest-idle hot conversation past spill_idle_s, never one in `keep` (the one whose
        turn runs, the one open in the window)."""
        if self.running is not None or not self.retry():
            return None
        now = time.monotonic()
        idle = self.settings.spill_idle_s
        candidates = [
            s
            for c, s in sessions.items()
            if c not in keep
            and s.cache is not None
            and now - s.last_used >= idle
            and now - self.failed_at.get(c, -1e9) >= max(idle, 30.0)
        ]
        return min(candidates, key=lambda s: s.last_used, default=None)

    # ------------------------------------------------------------------ restoring

    def restore(self, session: Session, prompt) -> int:
        """Fill a session from the store before its turn; returns the tokens restored. Cold: from
        the stored row of this conversation's version that holds the most of the prompt (its own
        row or a version row), or any conversation's blocks with the same opening. Hot: when the
        turn continues another version than the one in memory, the one in memory is kept as a
        version row first (versions below), and a stored version holding more of the prompt than
        the hot KV is restored past the hot opening, which stays. Bad blobs end the prefix; the
        rest is prefilled."""
        if self.store is None or len(prompt.ids) < 2:
            return 0
        hot = session.reusable_prefix(prompt) if session.cache is not None else 0
        if session.cache is not None and not self._leaves(session, hot):
            return 0  # the version in memory goes on: no stored version holds more of it
        self.settle_versions()  # rows of versions left before are committed: they can be found
        if session.cache is not None:
            self._keep_left_version(session)  # its writes go on during this turn
        cid = session.conversation_id
        try:
            matches = self.store.row_matches(cid, prompt.ids, prompt.pictures)
        except KVStoreError as exc:
            log.warning("looking up stored versions failed: %s", exc)
            return 0
        if session.cache is None:
            self._keep_stored_version(cid, matches)
        best = best_of(matches)
        limit = len(prompt.ids) - 1
        if session.cache is not None and (best is None or min(best.up_to, limit) <= hot):
            return 0  # the hot KV holds as much: nothing to read
        try:
            # whole blocks, even where the last one ends inside a picture: the turn prefills only
            # that picture's remaining tokens (its features sliced), not the whole picture again
            res = self.store.restore(
                best.id if best is not None else cid,
                prompt.ids,
                prompt.pictures,
                device=self.loaded.device,
                dtype=self.loaded.dtype,
                max_tokens=limit,
                cut_pictures=False,
                skip_tokens=hot,
            )
        except KVStoreError as exc:
            log.warning("restore failed: %s", exc)
            return 0
        if res.stats.bytes_read:
            self.rates.record_restore(res.stats.bytes_read, res.stats.seconds)
        if res.cache is None or res.n_tokens <= max(hot, res.start):
            return 0
        if res.start:
            session.splice(prompt, res.start, res.n_tokens, res.cache)
        else:
            rope_delta = int((res.state or {}).get("rope_delta", 0))
            session.reset_to(prompt, res.n_tokens, res.cache, rope_delta=rope_delta)
        return res.n_tokens - res.start

    # ------------------------------------------------------------------ versions

    @staticmethod
    def _state(session: Session) -> dict:
        """What a restore needs besides the KV: positions (Qwen2-VL family), and where the last
        reply began (to tell a version left from one going on, also after a restart)."""
        return {"rope_delta": session.rope_delta, "reply_start": session.reply_start}

    def _leaves(self, session: Session, keep: int) -> bool:
        """A turn keeping the first `keep` tokens of the hot session leaves the version it holds:
        it changed a message before the last reply (an edit, a switch), or it drops a block or
        more (a long reply regenerated). Anything less is the version going on: a reply's last
        tokens tokenized anew, or a short reply regenerated, cheaper to prefill than to keep."""
        assert self.store is not None  # restore() checked
        return keep < session.reply_start - 1 or len(session.ids) - keep >= self.store.block_tokens

    def _keep_left_version(self, session: Session) -> None:
        """The turn leaves the version the hot session holds: its KV is spilled as a version row
        of the conversation before the cache is cropped. Only blocks the store lacks are copied
        and written (the opening it shares is there, or is written once); the copies finish here,
        since the turn's prefill overwrites the cropped part, and the writes go on meanwhile."""
        store = self.store
        assert store is not None  # restore() checked
        n = cut_before(len(session.ids), session.pictures)  # as begin(): a stored picture ends within its tokens
        ids, pictures = session.ids[:n], [p for p in session.pictures if p.end <= n]
        vid = store.version_id(session.conversation_id, ids, pictures)
        if store.session_info(vid) is not None:
            return  # left before, as it is: its row is there
        try:
            job = store.begin_spill(vid, ids, pictures, session.cache, self._state(session))
            job.run_copies()
        except (UnsupportedCache, KVStoreError, ValueError) as exc:
            log.warning("keeping the version left failed: %s", exc)
            return
        self._leaving.append(job)

    def settle_versions(self) -> None:
        """Wait until the versions left are committed (their writes ran during the turn that left
        them): after each turn, and before rows are looked up. A failed one is only logged: its KV
        is prefilled when needed."""
        for job in self._leaving:
            result = job.result()
            if not result.ok:
                log.warning("keeping a version failed: %s", result.error)
        self._leaving.clear()

    def _keep_stored_version(self, cid: str, matches: list[RowMatch]) -> None:
        """A cold turn continuing another version than the conversation's stored row: that row is
        kept as a version row too (a manifest row naming the same blobs), since the conversation's
        next spill replaces it."""
        store = self.store
        assert store is not None  # restore() checked
        own = matches[0] if matches and matches[0].id == cid else None
        if own is None or own.n_tokens == own.row_tokens:
            return  # the stored row goes on, all of it
        info = store.session_info(cid)
        # as _leaves, from the surely matched opening (a tail matching in part counts as left);
        # a row from before versions has no reply_start: all of it counts as prompt
        reply_start = int((info or {}).get("state", {}).get("reply_start", own.row_tokens))
        if own.n_tokens < reply_start - 1 or own.row_tokens - own.n_tokens >= store.block_tokens:
            store.keep_as_version(cid)

    def take_committed(self, conversation_id: str) -> CommittedSpill:
        """The spill committed since the conversation's previous turn (none: all zero)."""
        return self.last_spill.pop(conversation_id, CommittedSpill())

    def counters(self) -> dict:
        return dict(self.store.counters) if self.store is not None else {}

    def close(self, sessions: dict) -> None:
        """App exit: spill every hot conversation (nothing lost), then close the store."""
        if self.store is None:
            return
        self.settle_versions()
        for s in sorted(sessions.values(), key=lambda s: s.last_used):
            if s.cache is not None:
                try:
                    self.spill_blocking(s)
                except Exception:
                    log.exception("spill on exit failed for %s", s.conversation_id)
        self.store.close()
        self.store = None
