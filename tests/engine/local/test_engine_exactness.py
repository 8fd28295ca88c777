"""The engine's greedy tokens equal `model.generate` on a fresh full prefill, turn by turn,
in every family, while reusing the KV prefix (and only the prefix) between turns."""

from __future__ import annotations

import pytest

from engine.local.prompt import build_prompt, render
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine

pytestmark = pytest.mark.slow

NEW = 8


@pytest.fixture
def pictures(tmp_path):
    return [make_picture(tmp_path / f"p{i}.png", seed=i, size=(40 + 12 * i, 36 + 8 * i)) for i in range(3)]


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_with_pictures_matches_full_prefill(family, tiny_model, tmp_path, pictures):
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    engine = open_engine(model_dir, tmp_path / "data")
    try:
        script = [
            ("What is in this picture?", [pictures[0]]),
            ("And what about these two?", [pictures[1], pictures[2]]),
            ("Which one is brighter?", []),
            ("Look again at this one.", [pictures[0]]),
        ]
        messages: list[Message] = []
        previous_prompt = 0
        for n, (text, imgs) in enumerate(script):
            messages.append(Message("user", text, pics(*imgs)))
            done = expect_done(ask(engine, "c1", messages, NEW, system="You are terse."))
            expected = ref.reply_ids(messages, NEW, system="You are terse.")
            assert done.token_ids == expected, f"turn {n}: engine {done.token_ids} != reference {expected}"
            ref_prompt, _ = ref.prompt_ids(messages, "You are terse.")
            s = done.stats
            assert s.prompt_tokens == len(ref_prompt)
            assert s.prefill_tokens == s.prompt_tokens - s.reused_tokens
            if n == 0:
                assert s.reused_tokens == 0
            else:
                # the previous prompt is a prefix of this one: all of it is reused, only new text runs
                assert s.reused_tokens >= previous_prompt
                assert s.prefill_tokens < s.prompt_tokens
            # pictures whose tokens are in the reused prefix are not encoded again
            new_pictures = len(imgs) if n != 3 else 1
            assert s.pictures_encoded <= new_pictures
            previous_prompt = s.prompt_tokens
            messages.append(Message("assistant", done.reply))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_ids_equal_the_processor(family, tiny_model, tmp_path, pictures):
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    from engine.protocol.settings import EngineSettings
    from engine.vision.gate import GateTurnStats, PictureGate

    gate = PictureGate(ref.loaded, EngineSettings())
    messages = [
        Message("user", "two pictures", pics(pictures[0], pictures[1])),
        Message("assistant", "ok"),
        Message("user", "a third", pics(pictures[2])),
    ]
    entries = [gate.lookup(p, GateTurnStats()) for m in messages for p in m.images]
    prompt = build_prompt(ref.loaded, render(ref.loaded.processor, messages, None), entries)
    expected, _ = ref.prompt_ids(messages)
    assert prompt.ids == expected
    assert [c.n_tokens for c in prompt.picture_chunks] == [e.n_tokens for e in entries]
    # the chunks tile the prompt in order: text, picture, ..., each picture whole and with its key
    assert [t for c in prompt.chunks for t in c.ids] == expected
    assert all(a.end == b.start for a, b in zip(prompt.chunks, prompt.chunks[1:], strict=False))
    assert [c.key for c in prompt.picture_chunks] == [e.key for e in entries]


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_edit_and_regenerate_crop_the_cache(family, tiny_model, tmp_path, pictures):
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    engine = open_engine(model_dir, tmp_path / "data")
    try:
        m1 = Message("user", "Describe this.", pics(pictures[0]))
        d1 = expect_done(ask(engine, "c", [m1], NEW))
        m2 = Message("user", "Now this one, please.", pics(pictures[1]))
        convo = [m1, Message("assistant", d1.reply), m2]
        d2 = expect_done(ask(engine, "c", convo, NEW))

        # regenerate the last reply: same prompt, everything but the last token is reused
        again = expect_done(ask(engine, "c", convo, NEW))
        assert again.token_ids == d2.token_ids
        assert again.stats.prefill_tokens == 1

        # edit the first message (different picture, different text): the cache is cropped to
        # the template's opening, and the reply equals a fresh prefill
        edited = [Message("user", "Describe that.", pics(pictures[2]))]
        d3 = expect_done(ask(engine, "c", edited, NEW))
        assert d3.token_ids == ref.reply_ids(edited, NEW)
        assert d3.stats.reused_tokens < d1.stats.prompt_tokens
        assert d3.stats.pictures_encoded == 1
    finally:
        engine.shutdown()


def test_same_tokens_for_a_different_picture_are_not_reused(tiny_model, tmp_path, pictures):
    """Picture tokens are all the same id: the prefix match must compare picture keys too."""
    model_dir = tiny_model("llava")
    ref = Reference(model_dir)
    engine = open_engine(model_dir, tmp_path / "data")
    try:
        expect_done(ask(engine, "c", [Message("user", "What is it?", pics(pictures[0]))], NEW))
        swapped = [Message("user", "What is it?", pics(make_picture(tmp_path / "other.png", seed=9, size=(40, 36))))]
        d = expect_done(ask(engine, "c", swapped, NEW))
        assert d.token_ids == ref.reply_ids(swapped, NEW)
        assert d.stats.pictures_encoded == 1
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_chunked_prefill_is_exact_and_never_splits_a_picture(family, tiny_model, tmp_path, pictures):
    from engine.local.runner import prefill_chunks
    from engine.pictures.span import PictureKey, PictureSpan

    spans = (PictureSpan(10, 30, PictureKey(b"k")),)
    chunks = prefill_chunks(0, 50, spans, 7)
    assert chunks[0] == (0, 7) and (7, 10) in chunks and (10, 30) in chunks
    assert sum(b - a for a, b in chunks) == 50
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    engine = open_engine(model_dir, tmp_path / "data", prefill_chunk_tokens=5)
    try:
        messages = [Message("user", "Two pictures, described at some length please.", pics(pictures[0], pictures[1]))]
        d = expect_done(ask(engine, "c", messages, NEW))
        assert d.token_ids == ref.reply_ids(messages, NEW)
        messages += [Message("assistant", d.reply), Message("user", "And the third?", pics(pictures[2]))]
        d2 = expect_done(ask(engine, "c", messages, NEW))
        assert d2.token_ids == ref.reply_ids(messages, NEW)
    finally:
        engine.shutdown()
