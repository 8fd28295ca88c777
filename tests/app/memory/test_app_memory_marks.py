"""The window shows where each chat's memory is and what each turn saved, from real spills and
restores of a tiny model: the sidebar's marks through hot -> spilling -> on SSD -> restoring ->
hot, a spilled chat restored as soon as it is selected (after a restart too) and before any turn
is sent, each picture's cache mark, a draft's new picture loading the encoder while the person
types, the plain last-turn line under the reply, and the dock saying the same without
contradicting itself."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.chat.sidebar import MarkRole
from engine.protocol.events import EncoderStatus, KVPlace
from tests.fixtures.pictures import make_picture
from tests.helpers.window import TIMEOUT_MS, send, wait_reply

pytestmark = pytest.mark.slow


def mark_of(w, cid):
    row = w.sidebar.model.row_of(cid)
    return w.sidebar.model.index(row, 0).data(MarkRole)


def tooltip_of(w, cid) -> str:
    row = w.sidebar.model.row_of(cid)
    return w.sidebar.model.index(row, 0).data(Qt.ItemDataRole.ToolTipRole)


def click_chat(qtbot, w, cid) -> None:
    rect = w.sidebar.list.visualRect(w.sidebar.model.index(w.sidebar.model.row_of(cid), 0))
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def follow(marks, cid) -> list[KVPlace]:
    """The places a chat's mark passes through, in order (a new estimate alone is no new place)."""
    seen: list[KVPlace] = []
    marks.chatChanged.connect(
        lambda c, mark: seen.append(mark.place) if c == cid and (not seen or seen[-1] != mark.place) else None
    )
    return seen


def picture_mark(w, message_row: int, picture: int = 0):
    index = w.messages.index(message_row, 0)
    rect = w.chat.delegate.geometry(index).thumbs[picture][1]
    return w.chat.delegate.picture_mark_at(index, rect.center())


def test_a_chats_mark_follows_its_kv_to_the_ssd_and_back(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=6)
    w.new_chat()
    a = w.controller.current_id
    seen = follow(w.chat_marks, a)
    w.composer.take_files([str(make_picture(tmp_path / "p.png", seed=4))])
    send(qtbot, w, "what is this")
    wait_reply(qtbot, w)
    qtbot.waitUntil(lambda: mark_of(w, a) is not None and mark_of(w, a).place == KVPlace.HOT, timeout=TIMEOUT_MS)
    assert mark_of(w, a).words == "in memory"
    assert "In memory: " in tooltip_of(w, a) and "tokens of KV" in tooltip_of(w, a)

    qtbot.mouseClick(w.memory_dock.spill, Qt.MouseButton.LeftButton)  # Spill now: the open chat
    qtbot.waitUntil(lambda: mark_of(w, a).place == KVPlace.ON_SSD, timeout=TIMEOUT_MS)
    assert mark_of(w, a).words == "on SSD"
    # measured here: the restore speed (a one-blob probe, the first time) and this model's prefill speed
    qtbot.waitUntil(lambda: "; resumes in ~" in tooltip_of(w, a), timeout=TIMEOUT_MS)
    tip = tooltip_of(w, a)
    assert "On the SSD: " in tip and " instead of ~" in tip and tip.endswith(" re-reading it.")
    qtbot.waitUntil(lambda: w.memory_dock.chat_words.text().startswith("on the SSD: "), timeout=5000)

    w.new_chat()  # away, and back: selecting it restores it before anything is sent
    b = w.controller.current_id
    assert mark_of(w, b).place == KVPlace.NOT_CACHED and mark_of(w, b).words == "not cached"
    click_chat(qtbot, w, a)
    qtbot.waitUntil(lambda: mark_of(w, a).place == KVPlace.HOT, timeout=TIMEOUT_MS)
    assert seen == [KVPlace.HOT, KVPlace.SPILLING, KVPlace.ON_SSD, KVPlace.RESTORING, KVPlace.HOT]
    assert not w.controller.is_generating(a)


def test_selecting_a_spilled_chat_after_a_restart_restores_it_before_any_turn(make_window, qtbot, tmp_path):
    data = tmp_path / "data"
    w = make_window(data, max_new_tokens=6)
    send(qtbot, w, "first chat, hello")
    wait_reply(qtbot, w)
    a = w.controller.current_id
    w.new_chat()
    send(qtbot, w, "second chat, hello")
    wait_reply(qtbot, w)
    w.close()  # exit writes both chats' KV to the SSD

    w2 = make_window(data, max_new_tokens=6)
    b = w2.controller.current_id  # the newest chat opens first
    assert b != a
    qtbot.waitUntil(
        lambda: mark_of(w2, a) is not None and mark_of(w2, a).place == KVPlace.ON_SSD, timeout=TIMEOUT_MS
    )  # the store says what it holds after a restart
    assert "On the SSD: " in tooltip_of(w2, a)
    seen = follow(w2.chat_marks, a)
    click_chat(qtbot, w2, a)
    qtbot.waitUntil(lambda: mark_of(w2, a).place == KVPlace.HOT, timeout=TIMEOUT_MS)
    assert seen == [KVPlace.RESTORING, KVPlace.HOT] and not w2.controller.is_generating()
    qtbot.waitUntil(lambda: w2.memory_dock.chat_words.text().startswith("in memory: "), timeout=5000)

    # the next turn starts from the restored KV, and the line under the reply says so in words
    send(qtbot, w2, "and again")
    wait_reply(qtbot, w2)
    reply = w2.messages.item(w2.messages.rowCount() - 1)
    assert reply.note.startswith("Resumed ") and " tokens from SSD in " in reply.note
    assert " while the chat was open (re-reading would take ~" in reply.note and reply.note.endswith("tok/s")
    stats = w2.memory_dock.last_stats
    assert stats.restored_tokens > 0 and stats.reused_tokens == 0
    w2.memory_dock.refresh_now()
    rows = w2.memory_dock.turn_rows.labels  # "Prompt tokens restored from SSD", never "Reused tokens 0" alone
    assert rows["restored_tokens"].text() == f"{stats.restored_tokens:,}" and rows["reused_tokens"].text() == "0"
    assert w2.memory_dock.words.labels["turn"].text() == reply.note


def test_pictures_say_whether_they_are_cached_and_a_new_one_wakes_the_encoder_early(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=4)
    qtbot.waitUntil(lambda: w.memory_dock.encoder_state == EncoderStatus.UNLOADED, timeout=TIMEOUT_MS)
    states: list = []
    w.bridge.encoderState.connect(lambda e: states.append(e.state))

    # a draft holding a new picture starts the encoder loading while the person types
    old = make_picture(tmp_path / "old.png", seed=5)
    w.composer.take_files([str(old)])
    qtbot.waitUntil(lambda: w.memory_dock.encoder_state == EncoderStatus.RESIDENT, timeout=TIMEOUT_MS)
    assert states == [EncoderStatus.LOADING, EncoderStatus.RESIDENT] and not w.controller.is_generating()
    assert "Not encoded yet" in w.composer.chips.itemAt(0).widget().toolTip()
    send(qtbot, w, "what is this")
    wait_reply(qtbot, w)
    first = w.memory_dock.last_stats
    assert first.image_cache_misses == 1 and first.encoder_loads == 0  # loaded already, before the turn
    # the first token comes after the encode, never before it
    assert first.first_token_s >= first.encode_s + first.prefill_s
    line = w.messages.item(1).note
    assert line.startswith("Read ") and " · new picture encoded in " in line and "encoder loaded" not in line
    qtbot.waitUntil(lambda: picture_mark(w, 0) is not None and picture_mark(w, 0)[0] == "cached", timeout=TIMEOUT_MS)
    assert "cached in memory" in picture_mark(w, 0)[1]

    with qtbot.waitSignal(w.bridge.memoryReport, timeout=TIMEOUT_MS):
        w.bridge.unload_encoder()
    qtbot.waitUntil(lambda: w.memory_dock.encoder_state == EncoderStatus.UNLOADED, timeout=TIMEOUT_MS)
    states.clear()

    # a draft holding only a cached picture leaves the encoder off; the turn says it stayed off
    w.new_chat()
    w.composer.take_files([str(old)])
    qtbot.waitUntil(lambda: "Encoded and cached" in w.composer.chips.itemAt(0).widget().toolTip(), timeout=TIMEOUT_MS)
    send(qtbot, w, "and this one")
    wait_reply(qtbot, w)
    line = w.messages.item(1).note
    assert line.startswith("Read ") and " · picture from cache, encoder stayed off · " in line
    assert states == [] and w.memory_dock.last_stats.encoder_loads == 0

    # a new picture sent at once (no time to load ahead): the turn loads the encoder and says so
    new = make_picture(tmp_path / "new.png", seed=6)
    w.composer.take_files([str(new)])
    send(qtbot, w, "and the new one")
    wait_reply(qtbot, w)
    last = w.memory_dock.last_stats
    assert last.image_cache_misses == 1 and last.image_cache_hits == 1
    line = w.messages.item(3).note
    assert line.startswith("Continued ") and " tokens from memory" in line and " · new picture encoded in " in line
    assert ", the other from cache" in line
    qtbot.waitUntil(lambda: picture_mark(w, 2) is not None and picture_mark(w, 2)[0] == "cached", timeout=TIMEOUT_MS)


def _rows(rows) -> list[tuple[str, str]]:
    """(name, value) of a dock section's rows, top to bottom."""
    form = rows.form
    out = []
    for i in range(form.rowCount()):
        name = form.itemAt(i, form.ItemRole.LabelRole)
        value = form.itemAt(i, form.ItemRole.FieldRole)
        if name is not None and value is not None:
            out.append((name.widget().text(), value.widget().text()))
    return out


def test_the_dock_speaks_of_the_open_chat_in_plain_words(make_window, qtbot, tmp_path, tiny_model):
    """Issue 40: "Last turn" showed another chat's turn; counters read "Times the encoder loaded 1",
    an unlabelled "… on disk 0" and "Drafted words kept 0 % of 7"; after a restart "Last turn" was
    empty; and the dock said "No model loaded" while the model loaded."""
    import re

    data = tmp_path / "data"
    w = make_window(data_dir=data, max_new_tokens=6, load=False)
    dock = w.memory_dock
    with qtbot.waitSignal(w.bridge.modelLoading, timeout=TIMEOUT_MS):
        w.load_model(str(tiny_model("llava")))
    dock.refresh_now()
    assert dock.words.labels["model"].text().startswith("loading ")  # said when the status bar says it
    qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
    dock.refresh_now()
    assert w.model_name and dock.words.labels["model"].text().startswith(w.model_name)
    assert "No model" not in dock.device.text()

    w.composer.take_files([str(make_picture(tmp_path / "a.png", seed=2))])
    send(qtbot, w, "first chat")
    wait_reply(qtbot, w)
    a, a_line = w.controller.current_id, w.messages.items()[-1].note
    w.new_chat()
    send(qtbot, w, "second chat")
    wait_reply(qtbot, w)
    b, b_line = w.controller.current_id, w.messages.items()[-1].note
    assert a_line and b_line and a_line != b_line
    dock.refresh_now()
    assert dock.words.labels["turn"].text() == b_line
    click_chat(qtbot, w, a)
    dock.refresh_now()
    assert dock.words.labels["turn"].text() == a_line  # the open chat's turn, not the latest of any chat

    with qtbot.waitSignal(w.bridge.memoryReport, timeout=TIMEOUT_MS):
        w.bridge.request_memory_report()
    dock.refresh_now()
    counters = _rows(dock.counter_rows)
    names = [n for n, _ in counters]
    assert names and not [n for n in names if n.startswith("…")]  # every row says what it counts
    hits = names.index("Pictures found in the cache")
    assert names[hits + 1 : hits + 3] == ["Pictures found in memory", "Pictures found on disk"]
    for name, value in counters:
        if name.startswith("Encoder "):
            assert re.fullmatch(r"[\d,]+ times?", value), (name, value)
    turn = dict(_rows(dock.turn_rows))
    assert not [n for n in turn if n.startswith("…")]
    if "Words guessed ahead" in turn:
        assert re.fullmatch(r"none|[\d,]+, [\d,]+ kept \(\d+ %\)", turn["Words guessed ahead"])
    w.shutdown()

    again = make_window(data_dir=data, load=False)  # a relaunch: the lines come from history
    again.memory_dock.refresh_now()
    shown = {again.controller.current_id: again.memory_dock.words.labels["turn"].text()}
    other = a if again.controller.current_id == b else b
    click_chat(qtbot, again, other)
    again.memory_dock.refresh_now()
    shown[other] = again.memory_dock.words.labels["turn"].text()
    assert shown == {a: a_line, b: b_line}


def test_a_turns_pictures_are_marked_when_it_ends_without_asking_the_engine_again(
    make_window, qtbot, tmp_path, monkeypatch
):
    """The marks come with the turn's end (TurnDone.pictures): the chat shows each picture cached
    as the reply finishes, and the window sends the engine no second request for them."""
    w = make_window(max_new_tokens=4)
    engine = w.bridge.builtin
    asked: list[tuple[int, bool]] = []  # (pictures, draft) of each CheckPictures the engine gets
    check = engine.check_pictures

    def counted(refs, draft=False):
        asked.append((len(refs), draft))
        check(refs, draft)

    monkeypatch.setattr(engine, "check_pictures", counted)
    w.composer.take_files([str(make_picture(tmp_path / "a.png", seed=3))])
    qtbot.waitUntil(lambda: "Not encoded yet" in w.composer.chips.itemAt(0).widget().toolTip(), timeout=TIMEOUT_MS)
    assert asked == [(1, True)]  # the draft's picture: marked new, the encoder loads meanwhile
    send(qtbot, w, "what is this")
    wait_reply(qtbot, w)
    assert picture_mark(w, 0) is not None and picture_mark(w, 0)[0] == "cached"  # as the reply ends: no wait
    send(qtbot, w, "and what colour is it")
    wait_reply(qtbot, w)
    assert picture_mark(w, 0)[0] == "cached"
    assert asked == [(1, True)]  # two turns, and not one more request for their marks
