"""Prompt-lookup decoding: drafts come from earlier text, and greedy replies are exactly the
ones plain decoding gives (token ids against a fresh full prefill with `model.generate`)."""

from __future__ import annotations

import pytest

from engine.local.lookup_decode import PICTURE, NgramDrafter, accepted_prefix
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine

NEW = 24


def test_draft_continues_the_latest_earlier_occurrence():
    d = NgramDrafter([5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6])
    assert d.draft(3) == [7, 2, 3]  # "5 6" last seen before "7 2 3"
    d.append(7)
    assert d.draft(2) == [2, 3]  # the longest gram "5 6 7" decides
    assert NgramDrafter([1, 2, 3]).draft(4) == []  # nothing repeats: no draft
    assert NgramDrafter([4, 9, 8, 4]).draft(4) == []  # one repeated token is not enough
    assert NgramDrafter([4, 9, 8, 4], min_ngram=1).draft(4) == [9, 8, 4]


def test_draft_stops_at_pictures_and_end_of_sequence():
    assert NgramDrafter([4, 5, PICTURE, 6, 4, 5]).draft(4) == []
    assert NgramDrafter([3, 4, 5, 9, 6, 3, 4], eos={6}).draft(4) == [5, 9]
    assert NgramDrafter([PICTURE, PICTURE, 3, PICTURE, PICTURE], min_ngram=1).draft(4) == []


def test_draft_length_adapts_and_respects_the_limit():
    d = NgramDrafter(list(range(20)) + [0, 1], max_draft=10)
    assert len(d.draft(100)) == 4
    d.feedback(4, 4)
    assert len(d.draft(100)) == 6 and len(d.draft(2)) == 2
    d.feedback(6, 1)
    assert len(d.draft(100)) == 5


def test_refused_drafts_pause_drafting_longer_each_time():
    d = NgramDrafter(list(range(20)) + [0, 1])
    pauses = []
    for _ in range(6):
        d.feedback(4, 0)
        n = 0
        while d.draft(100) == []:
            n += 1
        pauses.append(n)
    assert pauses == [2, 4, 8, 16, 32, 64]
    d.feedback(4, 2)  # a draft taken (even in part) ends the pause
    assert d.draft(100) != []
    assert accepted_prefix([1, 2, 3], [1, 2, 4, 9]) == 2 and accepted_prefix([1], [2, 1]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_lookup_replies_equal_plain_greedy(family, tiny_model, tmp_path):
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    pic = make_picture(tmp_path / "p.png", seed=3)
    engine = open_engine(model_dir, tmp_path / "data")
    plain = open_engine(model_dir, tmp_path / "plain", lookup_decoding=False)
    try:
        messages = [Message("user", "Describe the picture, then say it again word for word.", pics(pic))]
        for n in range(3):
            done = expect_done(ask(engine, "c", messages, NEW))
            assert done.token_ids == ref.reply_ids(messages, NEW), f"turn {n}"
            assert done.token_ids == expect_done(ask(plain, "c", messages, NEW)).token_ids
            messages += [Message("assistant", done.reply), Message("user", "Repeat your last answer exactly.")]
        # whether a random tiny model repeats itself enough to draft is chance: the oracle test
        # below drives drafts through every family's cache on purpose
    finally:
        engine.shutdown()
        plain.shutdown()


class OracleDrafter(NgramDrafter):
    """Drafts the reference reply's next tokens, every second draft with its last token wrong:
    drives whole acceptances, partial ones and rejections through the real model and cache."""

    expected: list[int] = []
    prompt_len = 0

    def __init__(self, ids, **kw):
        super().__init__(ids, **kw)
        OracleDrafter.prompt_len = len(ids)
        self.calls = 0

    def draft(self, limit):
        self.calls += 1
        at = len(self.seq) - self.prompt_len  # drafts follow the current token
        out = list(self.expected[at : at + min(limit, 3 + self.calls % 4)])
        if out and self.calls % 2:
            out[-1] = (out[-1] + 1) % 50
        return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_accepted_and_rejected_drafts_keep_the_reply_exact(family, tiny_model, tmp_path, monkeypatch):
    import engine.local.runner as turn_runner

    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    pic = make_picture(tmp_path / "p.png", seed=4)
    messages = [Message("user", "What do you see here?", pics(pic))]
    expected = ref.reply_ids(messages, NEW)
    monkeypatch.setattr(OracleDrafter, "expected", expected)
    monkeypatch.setattr(turn_runner, "NgramDrafter", OracleDrafter)
    engine = open_engine(model_dir, tmp_path / "data")
    try:
        done = expect_done(ask(engine, "c", messages, NEW))
        assert done.token_ids == expected
        s = done.stats
        assert 0 < s.draft_accepted < s.draft_tokens
        # the cache holds exactly the prompt and the reply fed back: the next turn reuses it all
        messages += [Message("assistant", done.reply), Message("user", "And now?")]
        again = expect_done(ask(engine, "c", messages, NEW))
        assert again.stats.reused_tokens >= s.prompt_tokens
        assert again.token_ids == ref.reply_ids(messages, NEW)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_demo_model_restating_itself_takes_drafts(tmp_path):
    from engine.platform.paths import DEMO_MODEL

    ref = Reference(DEMO_MODEL)
    pic = make_picture(tmp_path / "p.png", seed=5, size=(96, 96))
    engine = open_engine(DEMO_MODEL, tmp_path / "data")
    try:
        messages = [Message("user", "Describe the picture.", pics(pic))]
        first = expect_done(ask(engine, "c", messages, 40))
        messages += [Message("assistant", first.reply), Message("user", "Describe the picture.")]
        second = expect_done(ask(engine, "c", messages, 40))
        assert second.token_ids == ref.reply_ids(messages, 40)
        assert second.stats.draft_accepted >= len(second.token_ids) // 2, second.stats
    finally:
        engine.shutdown()
