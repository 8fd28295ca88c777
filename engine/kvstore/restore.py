"""Restore planning, pure: which stored blobs make the longest valid prefix of a new prompt, which
files to read and how far. No I/O and no lock: the index calls choose_blobs with the manifest's
answers and pins the choice; reader.read_prefix executes the ReadPlan.

The prompt's own chained block keys are the lookup: a key names its whole prefix (tokens and
pictures), so block i can come from this session's row or from any session holding that key.
After the chain, one blob of the session's own is compared token by token and picture by picture:
its tail (a partial block) when all of its blocks matched, else the block inside which the new
prompt leaves it (a re-sent reply that differs from the one generated, an edit), so a prompt that
leaves the stored one mid-block restores up to the token where they differ, not to the block before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..pictures.span import PictureSpan, cut_before, pictures_agree
from .blob import KIND_BLOCK, KIND_TAIL, BlobHeader
from .keys import BlockKey
from .manifest import SessionRow


@dataclass
class RestoreStats:
    source: str = "none"  # whose blocks it read: "session", "shared", "session+shared" or "none"
    blobs_read: int = 0
    bytes_read: int = 0
    bad_blobs: int = 0  # failed their check (ended the prefix; never served)
    missing_blobs: int = 0  # in the index but gone from disk (ended the prefix)
    session_tokens: int = 0  # tokens the session's own row holds (0 without a usable row)
    state_complete: bool = False  # the row's state describes exactly the restored tokens
    seconds: float = 0.0


@dataclass
class RestoreResult:
    cache: Any | None  # transformers DynamicCache holding tokens start..n_tokens, or None
    n_tokens: int
    state: dict = field(default_factory=dict)
    stats: RestoreStats = field(default_factory=RestoreStats)
    start: int = 0  # the tokens before it were not read (the caller holds them: restore's skip_tokens)


@dataclass(frozen=True)
class Compared:
    """The session's blob read after the chain and used as far as the new prompt agrees with it."""

    key: BlockKey
    kind: int  # KIND_TAIL (the session's tail) or KIND_BLOCK (the block the prompt leaves inside)
    n_tokens: int  # tokens the blob holds


@dataclass
class RestoreChoice:
    """Which keys a restore reads: the block chain, then one of the session's blobs compared."""

    row: SessionRow | None  # the session's own row, when it matches the namespace and block size
    chain: list[BlockKey]  # block keys, in order, each from the row or from any session
    from_own: int  # how many of them the row itself names
    compared: Compared | None = None  # only set with a row

    @property
    def pins(self) -> list[BlockKey]:
        return self.chain + ([self.compared.key] if self.compared is not None else [])

    @property
    def source(self) -> str:
        return "session" if self.from_own == len(self.chain) else "shared" if self.from_own == 0 else "session+shared"


@dataclass
class ReadItem:
    key: BlockKey
    path: str
    kind: int
    start: int  # where the blob's first token goes in the destination (its sequence position less ReadPlan.first)
    n: int  # tokens the blob holds
    use: int  # tokens wanted (<= n)
    expect: np.ndarray | None  # token ids the blob must hold (None: checked by `accept`)
    accept: Callable[[BlobHeader], int] | None = None  # a compared blob: how many tokens match


@dataclass
class ReadPlan:
    items: list[ReadItem]
    n_tokens: int  # tokens the items cover, if every blob verifies
    keep_whole: tuple[PictureSpan, ...] = ()  # pictures a shorter result must not cut
    first: int = 0  # sequence position of the first token read (whole blocks skipped before it)


def choose_blobs(
    keys: list[BlockKey], row: SessionRow | None, present: dict[bytes, int], ns: bytes, block_tokens: int, limit: int
) -> RestoreChoice:
    """keys: the prompt's block keys; row: the session's stored row (or None); present: which of
    the keys any session holds (empty when sharing is off); limit: the most tokens wanted."""
    if row is not None and not (row.namespace == ns and row.block_tokens == block_tokens):
        row = None  # stored under another namespace or block size: its keys mean nothing here
    own = row.block_keys if row is not None else []
    chain: list[BlockKey] = []
    from_own = 0
    for i, k in enumerate(keys):
        if i < len(own) and own[i] == k:
            from_own += 1
        elif k not in present:
            break
        chain.append(k)
    compared = None
    if row is not None and from_own == len(chain) and len(chain) * block_tokens < limit:
        if len(chain) < len(own):  # the prompt leaves the row inside its next block
            compared = Compared(own[len(chain)], KIND_BLOCK, block_tokens)
        elif row.tail_key is not None:
            compared = Compared(row.tail_key, KIND_TAIL, row.tail_tokens)
    return RestoreChoice(row, chain, from_own, compared)


def plan_reads(
    choice: RestoreChoice,
    tokens: np.ndarray,
    pictures: tuple[PictureSpan, ...],
    limit: int,
    block_tokens: int,
    cut_pictures: bool,
    path_of: Callable[[bytes], str],
    skip_blocks: int = 0,
) -> ReadPlan:
    """The files to read, in order, and how many tokens of each (never past `limit`, and with
    cut_pictures never ending inside a picture). The first `skip_blocks` blocks are not read (the
    caller holds them): the plan then starts at their end."""
    B = block_tokens
    first = skip_blocks * B
    row, last = choice.row, choice.compared
    n_plan = min(limit, len(choice.chain) * B + (last.n_tokens if last is not None else 0))
    keep_whole = pictures if cut_pictures else ()
    n_plan = cut_before(n_plan, keep_whole)
    if n_plan <= first:
        return ReadPlan([], 0, keep_whole, first)
    items = []
    for i, k in enumerate(choice.chain):
        if i * B >= n_plan:
            break
        if i < skip_blocks:
            continue
        start = i * B - first
        items.append(ReadItem(k, path_of(k), KIND_BLOCK, start, B, min(B, n_plan - i * B), tokens[i * B : (i + 1) * B]))
    base = len(choice.chain) * B
    if row is not None and last is not None and n_plan > base:
        items.append(
            ReadItem(
                last.key,
                path_of(last.key),
                last.kind,
                base - first,
                last.n_tokens,
                n_plan - base,
                None,
                agreeing_tokens(tokens, pictures, row, base),
            )
        )
    return ReadPlan(items, n_plan - first, keep_whole, first)


def agreeing_tokens(tokens: np.ndarray, pictures: tuple[PictureSpan, ...], row: SessionRow, base: int):
    """How many of a compared blob's tokens the new prompt shares: equal token ids, and the same
    pictures (same span, same key) over that range."""

    def accept(hdr: BlobHeader) -> int:
        stored = hdr.tokens
        given = tokens[base : base + len(stored)]
        m = min(len(stored), len(given))
        diff = np.nonzero(stored[:m] != given[:m])[0]
        if len(diff):
            m = int(diff[0])
        return pictures_agree(base, base + m, row.pictures, pictures) - base

    return accept
