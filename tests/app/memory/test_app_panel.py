"""The memory dock follows MemoryReport / EncoderState / SpillState events, from the real engine
and from events delivered through the bridge's listener (the path engine threads use)."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt

from engine.protocol.events import (
    ChatMemory,
    ChatMemoryReport,
    EncoderState,
    EncoderStatus,
    KVPlace,
    MemoryReport,
    SpillState,
    SpillStatus,
    StoreCounters,
)
from tests.fixtures.pictures import make_picture
from tests.helpers.window import send, wait_reply


def test_panel_shows_the_engines_own_report(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=8)
    w.composer.take_files([str(make_picture(tmp_path / "p.png", seed=2))])
    send(qtbot, w, "what is this")
    wait_reply(qtbot, w)
    with qtbot.waitSignal(w.bridge.memoryReport, timeout=30000) as blocker:
        w.bridge.request_memory_report()
    report: MemoryReport = blocker.args[0]
    w.memory_dock.refresh_now()
    lm = report.components["language_model"]
    assert f"({lm:,} B)" in w.memory_dock.component_text("language_model")
    assert f"({report.components['vision_encoder']:,} B)" in w.memory_dock.component_text("vision_encoder")
    cid = w.controller.current_id
    assert report.sessions_kv[cid] > 0
    title = w.history.get_conversation(cid).title  # named from its first question (app/history/chat_titles.py)
    assert f"{title}: " in w.memory_dock.kv.text() and f"({report.sessions_kv[cid]:,} B)" in w.memory_dock.kv.text()
    assert w.memory_dock.device.text() == report.device_name  # "CPU (x86_64)", not "… (cpu)" again
    assert w.memory_dock.bar.total == report.total_bytes
    # last turn timings arrived with TurnDone
    assert "tok/s" in w.memory_dock.turn_rows.labels["tokens_per_s"].text()
    taken = w.memory_dock.last_stats
    kept = round(taken.draft_acceptance * taken.draft_tokens)
    assert w.memory_dock.turn_rows.labels["draft_acceptance"].text() == (
        f"{taken.draft_tokens:,}, {kept:,} kept ({taken.draft_acceptance * 100:.0f} %)"
        if taken.draft_tokens
        else "none"
    )
    assert "ms" in w.memory_dock.turn_rows.labels["prefill_s"].text()


def test_panel_follows_events_through_the_bridge(make_window, qtbot):
    w = make_window(load=False)
    # only the reports this test injects: the dock's 1 s poll would fetch the engine's own report
    # (no conversation in memory) and replace them at a random moment
    w.memory_dock.reportWanted.disconnect(w.bridge.request_memory_report)
    cid = w.controller.new_conversation()
    w.controller.rename(cid, "Holiday")
    other = w.controller.new_conversation()
    w.controller.rename(other, "Receipts")
    w.controller.open_conversation(cid)
    report = MemoryReport(
        device="cuda:0",
        device_name="Test GPU",
        total_bytes=80 << 30,
        free_bytes=60 << 30,
        components={
            "language_model": 14_000_000_123,
            "vision_encoder": 600_000_001,
            "hot_kv": 123_456_789,
            "image_cache_ram": 5_000_000,
            "image_cache_disk": 7,
        },
        sessions_kv={cid: 123_456_789},
        counters={"hits": 3, "ram_hits": 2},
        store=StoreCounters(
            bytes_on_disk=9_999_999, blobs_on_disk=42, reused_blobs=17, host_buffer_bytes=2048, sessions=2
        ),
        encoder_state=EncoderStatus.RESIDENT,
        encoder_idle_left_s=30.0,
    )
    w.bridge.inject(report)
    w.bridge.inject(
        ChatMemoryReport(
            [
                ChatMemory(cid, KVPlace.HOT, 4_000, 123_456_789),
                ChatMemory(other, KVPlace.ON_SSD, 8_190, 240 << 20, 0.41, 420.0),
            ]
        )
    )
    dock = w.memory_dock
    qtbot.waitUntil(lambda: "Test GPU" in dock.device.text(), timeout=5000)
    qtbot.waitUntil(lambda: "14,000,000,123 B" in dock.component_text("language_model"), timeout=5000)
    assert "600,000,001 B" in dock.component_text("vision_encoder")
    # the first screen in words: this chat's KV, the encoder and why, the store with what it holds
    qtbot.waitUntil(
        lambda: dock.chat_words.text().startswith("in memory: 4,000 tokens of KV (117.7 MiB)"), timeout=5000
    )
    assert dock.encoder.text().startswith("in memory; unloads in ")
    assert dock.words.labels["store"].text() == "holds 2 chats (9.5 MiB)"
    # every chat with KV somewhere is listed, the one on the SSD too (never "none" while the store holds it)
    assert dock.kv.text() == "Holiday: 117.7 MiB (123,456,789 B)\nReceipts: on the SSD (240.0 MiB)"
    # the counters sit behind Details, under names a person reads
    assert not dock.details.isVisibleTo(dock)
    dock.details_toggle.click()
    assert dock.details.isVisibleTo(dock)
    assert "9,999,999 B" in dock.store_rows.labels["bytes_on_disk"].text()
    assert dock.store_details.labels["blobs_on_disk"].text() == "42"
    assert dock.store_details.labels["reused_blobs"].text() == "17"
    assert "2,048 B" in dock.store_details.labels["host_buffer_bytes"].text()
    assert dock.counter_rows.labels["hits"].text() == "3"
    titles = [dock.counter_rows.form.labelForField(label).text() for label in dock.counter_rows.labels.values()]
    assert titles == ["Pictures found in the cache", "Pictures found in memory"]
    assert "reused_blobs" not in dock.counter_rows.labels
    # disk-resident components are listed, not stacked in the device bar
    assert "image_cache_disk" not in dict(dock.bar.segments)
    assert dict(dock.bar.segments)[f"hot_kv#0:{cid}"] == 123_456_789  # one segment per conversation
    assert "Hot KV, Holiday: 117.7 MiB (123,456,789 B)" in dock.bar.toolTip()

    # the other chat, opened: on the SSD with its resume estimate, then restoring, then in memory
    w.controller.open_conversation(other)
    qtbot.waitUntil(
        lambda: (
            dock.chat_words.text() == "on the SSD: 8,190 tokens of KV (240.0 MiB); resumes in "
            "~0.4 s instead of ~7 min re-reading it"
        ),
        timeout=5000,
    )
    w.bridge.inject(ChatMemoryReport([ChatMemory(other, KVPlace.RESTORING, 8_190, 240 << 20, restored_tokens=2_048)]))
    qtbot.waitUntil(
        lambda: (
            dock.chat_words.text()
            == "restoring from the SSD: 2,048 of 8,190 tokens read back (240.0 MiB); the next turn starts from them"
        ),
        timeout=5000,
    )
    # the sidebar's mark says it in the same words (memory_marks.where_words), as a sentence
    assert w.chat_marks.mark(other).tooltip == f"R{dock.chat_words.text()[1:]}."

    legend_widgets = list(dock._legend_rows.values())
    w.bridge.inject(EncoderState(EncoderStatus.UNLOADED))
    qtbot.waitUntil(
        lambda: dock.encoder.text() == "not in memory: it loads only for a picture that is not cached yet", timeout=5000
    )
    assert not dock.unload.isEnabled(), "an unloaded encoder offers no Unload button"
    w.bridge.inject(EncoderState(EncoderStatus.LOADING))
    qtbot.waitUntil(lambda: dock.encoder.text().startswith("loading"), timeout=5000)
    w.bridge.inject(SpillState(cid, SpillStatus.SPILLED, "12 blocks, 9 reused"))
    qtbot.waitUntil(lambda: "Holiday: 12 blocks, 9 reused" in dock.store_rows.labels["last_spill"].text(), timeout=5000)
    assert dock.words.labels["store"].text().startswith("holds 2 chats (9.5 MiB); last saved “Holiday” ")
    w.bridge.inject(report)
    qtbot.waitUntil(lambda: dock.encoder.text().startswith("in memory"), timeout=5000)
    assert dock.unload.isEnabled()
    assert list(dock._legend_rows.values()) == legend_widgets  # updated in place, not rebuilt
    assert dock.store_rows.labels["store_state"].text() == "in use"
    full = "paused: the disk holding /data/kv-store is full (0 bytes free); retried every 30 s"
    w.bridge.inject(dataclasses.replace(report, store_status=full))
    qtbot.waitUntil(lambda: dock.store_rows.labels["store_state"].text() == full, timeout=5000)
    assert dock.words.labels["store"].text() == full


def test_unload_and_spill_buttons_reach_the_engine(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=4)
    w.composer.take_files([str(make_picture(tmp_path / "p.png", seed=9))])
    send(qtbot, w, "hi")
    wait_reply(qtbot, w)
    w.memory_dock.show()
    qtbot.waitUntil(w.memory_dock.unload.isEnabled, timeout=5000)  # the dock has seen the encoder resident
    with qtbot.waitSignal(w.bridge.memoryReport, timeout=30000):
        qtbot.mouseClick(w.memory_dock.unload, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.memory_dock.encoder.text().startswith("not in memory"), timeout=5000)
    states = []
    w.bridge.spillState.connect(states.append)
    qtbot.mouseClick(w.memory_dock.spill, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(s.state == "spilled" for s in states), timeout=30000)
    assert [s.conversation_id for s in states if s.state == "spilled"] == [w.controller.current_id]
    title = w.history.get_conversation(w.controller.current_id).title
    qtbot.waitUntil(lambda: w.memory_dock.kv.text().startswith(f"{title}: on the SSD ("), timeout=5000)
    assert w.memory_dock.kv.text().count("\n") == 0  # one conversation, one line
    assert w.memory_dock.chat_words.text().startswith("on the SSD: ")
    qtbot.waitUntil(lambda: w.memory_dock.store_details.labels.get("blocks_written") is not None, timeout=5000)
    assert int(w.memory_dock.store_details.labels["blocks_written"].text()) >= 1  # a partial block counts
