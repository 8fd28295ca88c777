"""Engine behaviour a user depends on: stop, bad model folders, bad pictures, streaming text,
the memory ledger — and that nothing bad stops the engine from serving the next turn."""

from __future__ import annotations

import json
import threading

import pytest

from engine.local.detok import IncrementalDetokenizer
from engine.local.engine import Engine
from engine.model.kv_growth import ROOM_MIN
from engine.pictures.ref import PictureRef
from engine.protocol.client import EngineError, load_blocking, run_blocking
from engine.protocol.events import MemoryReport, Message, Sampling, Token, Turn, TurnDone, TurnFailed
from tests.fixtures.pictures import make_broken_picture, make_not_a_picture, make_picture, pics
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine


@pytest.fixture
def llava(tiny_model):
    return tiny_model("llava")


def test_stop_takes_effect_within_one_token(llava, tmp_path):
    engine = open_engine(llava, tmp_path / "d")
    seen: list[Token] = []
    stop_sent = threading.Event()

    def on_token(ev):
        seen.append(ev)
        if len(seen) == 3 and not stop_sent.is_set():
            stop_sent.set()
            engine.stop(ev.turn_id)

    try:
        turn = Turn("c", [Message("user", "Tell me a long story.")], Sampling(max_new_tokens=200))
        done = run_blocking(engine, turn, on_token=on_token)
        assert isinstance(done, TurnDone) and done.stopped
        # the stop arrived while token 3 was being handled: at most one more token follows
        assert 3 <= len(done.token_ids) <= 4
        assert done.reply == "".join(t.text for t in seen)
        # the conversation continues normally afterwards
        nxt = expect_done(ask(engine, "c", [Message("user", "Short one.")], 5))
        assert len(nxt.token_ids) == 5 and not nxt.stopped
    finally:
        engine.shutdown()


def test_stop_of_a_queued_turn_means_it_never_runs(llava, tmp_path):
    engine = open_engine(llava, tmp_path / "d")
    try:
        turn = Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=5))
        turn.turn_id = engine.new_turn_id()
        engine.stop(turn.turn_id)
        done = run_blocking(engine, Turn("c2", [Message("user", "after")], Sampling(max_new_tokens=2)))
        assert isinstance(done, TurnDone)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "setup, needle",
    [
        (lambda d: d.mkdir(), "no config.json"),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text(json.dumps({"model_type": "bert"}))),
            "Unsupported architecture",
        ),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{not json")), "cannot be read as JSON"),
        (lambda d: None, "not found"),
    ],
)
def test_bad_model_folder_gets_a_clear_message(tmp_path, setup, needle):
    folder = tmp_path / "model"
    setup(folder)
    engine = Engine(data_dir=tmp_path / "d").start()
    try:
        with pytest.raises(EngineError) as err:
            load_blocking(engine, str(folder))
        assert needle in str(err.value)
        assert "Traceback" not in str(err.value)
        assert engine.running
    finally:
        engine.shutdown()


def test_model_without_chat_template_is_refused(llava, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(llava, folder)
    for f in folder.glob("*"):
        if f.name.endswith(".jinja"):
            f.unlink()
        elif f.suffix == ".json":
            data = json.loads(f.read_text())
            if isinstance(data, dict) and "chat_template" in data:
                data.pop("chat_template")
                f.write_text(json.dumps(data))
    engine = Engine(data_dir=tmp_path / "d").start()
    try:
        with pytest.raises(EngineError, match="chat template"):
            load_blocking(engine, str(folder))
    finally:
        engine.shutdown()


def test_bad_pictures_fail_the_turn_clearly_and_the_next_turn_works(llava, tmp_path):
    engine = open_engine(llava, tmp_path / "d")
    good = make_picture(tmp_path / "good.png", seed=1)
    cases = [  # refs whose files went, or never were pictures: each fails its own turn
        (PictureRef(str(tmp_path / "missing.png"), "0" * 64), "not found"),
        (pics(make_broken_picture(tmp_path / "broken.png"))[0], "damaged"),
        (pics(make_not_a_picture(tmp_path / "doc.pdf"))[0], "not a picture"),
        (PictureRef(str(tmp_path), "1" * 64), "folder"),
    ]
    try:
        for bad, needle in cases:
            res = ask(engine, "c", [Message("user", "look", pics(good) + [bad])], 4)
            assert isinstance(res, TurnFailed), bad
            assert needle in res.message
        ok = expect_done(ask(engine, "c", [Message("user", "look", pics(good))], 4))
        assert ok.token_ids == Reference(llava).reply_ids([Message("user", "look", pics(good))], 4)
    finally:
        engine.shutdown()


def test_turn_without_a_model_fails_cleanly(tmp_path):
    engine = Engine(data_dir=tmp_path / "d").start()
    try:
        res = run_blocking(engine, Turn("c", [Message("user", "hi")]))
        assert isinstance(res, TurnFailed) and "No model" in res.message
    finally:
        engine.shutdown()


def test_streamed_text_is_exact_across_multibyte_characters(llava):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llava)
    text = "héllo wörld — 世界 🎉🙂 ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split())  # multi-byte characters really are split over tokens
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)


def test_memory_report_has_exact_component_bytes(llava, tmp_path):
    engine = open_engine(llava, tmp_path / "d")
    reports: list[MemoryReport] = []
    got = threading.Event()

    def listen(ev):
        if isinstance(ev, MemoryReport) and "c" in ev.sessions_kv:
            reports.append(ev)
            got.set()

    engine.add_listener(listen)
    try:
        expect_done(ask(engine, "c", [Message("user", "hi", pics(make_picture(tmp_path / "a.png", 1)))], 4))
        engine.request_memory_report()
        assert got.wait(10)
        rep = reports[-1]
        model = engine.loaded.model
        vision = sum(
            p.numel() * p.element_size()
            for n, p in model.named_parameters()
            if n.startswith(("model.vision_tower", "model.multi_modal_projector"))
        )
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        total += sum(b.numel() * b.element_size() for b in model.buffers())
        assert rep.components["vision_encoder"] == vision
        assert rep.components["language_model"] + vision <= total
        assert rep.components["language_model"] > 0
        cfg = model.config.text_config
        n_tokens = engine.sessions["c"].cached_tokens
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
        # what the cache holds: its tokens, plus the spare room its layers grow into
        # (engine/model/kv_growth.py: an eighth, at least ROOM_MIN tokens)
        room = engine.sessions["c"].cache.layers[0].held()[0].shape[-2]
        assert n_tokens < room <= n_tokens + max(ROOM_MIN, n_tokens // 8) + 4  # + the reply's last tokens
        assert rep.sessions_kv["c"] == per_token * room
        assert rep.total_bytes > 0 and 0 < rep.free_bytes <= rep.total_bytes
    finally:
        engine.shutdown()


def test_stateless_turns_continue_the_best_matching_session(llava, tmp_path):
    """API clients re-send the whole conversation: the engine finds the session to continue."""
    engine = open_engine(llava, tmp_path / "d")
    pic = make_picture(tmp_path / "a.png", 2)
    try:
        # a window conversation with the same opening is never borrowed
        expect_done(ask(engine, "window", [Message("user", "What is it?", pics(pic))], 4))
        convo = [Message("user", "What is it?", pics(pic))]
        d1 = expect_done(ask(engine, "", convo, 4))
        assert d1.conversation_id.startswith("api:") and d1.stats.reused_tokens == 0
        convo += [Message("assistant", d1.reply), Message("user", "More?")]
        d2 = expect_done(ask(engine, "", convo, 4))
        assert d2.conversation_id == d1.conversation_id
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == Reference(llava).reply_ids(convo, 4)
        other = expect_done(ask(engine, "", [Message("user", "Unrelated question")], 2))
        assert other.conversation_id != d1.conversation_id
    finally:
        engine.shutdown()


def test_a_conversation_longer_than_the_context_fails_clearly(llava, tmp_path):
    engine = open_engine(llava, tmp_path / "d")
    try:
        limit = engine.loaded.context_tokens
        res = ask(engine, "c", [Message("user", "word " * (limit + 10))], 4)
        assert isinstance(res, TurnFailed) and "more than the model's context" in res.message
        # near the limit the reply is cut to fit instead of running past the context
        n = expect_done(ask(engine, "c", [Message("user", "hi")], 4)).stats.prompt_tokens
        tok = engine.loaded.tokenizer
        per_word = len(tok("word " * 100, add_special_tokens=False)["input_ids"]) / 100
        text = "hi " + "word " * int((limit - n - 12) / per_word)
        d = expect_done(ask(engine, "c2", [Message("user", text)], 500))
        assert d.stats.prompt_tokens + d.stats.generated_tokens <= limit
        # the cut is reported, so the API can answer finish_reason "length"
        assert d.stats.max_new_tokens == limit - d.stats.prompt_tokens < 500
    finally:
        engine.shutdown()
