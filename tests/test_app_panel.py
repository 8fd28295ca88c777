"""The memory dock follows MemoryReport / EncoderState / SpillState events, from the real engine
and from events delivered through the bridge's listener (the path engine threads use)."""
from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt

from engine.protocol.events import EncoderState, EncoderStatus, MemoryReport, SpillState, SpillStatus, StoreCounters
from tests.fixtures.pictures import make_picture
from tests.test_app_support import make_window, send, wait_reply  # noqa: F401


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
    title = w.history.get_conversation(cid).title  # named from its first reply (app/chat_titles.py)
    assert f"{title}: " in w.memory_dock.kv.text() and f"({report.sessions_kv[cid]:,} B)" in w.memory_dock.kv.text()
    assert report.device_name in w.memory_dock.device.text()
    assert w.memory_dock.bar.total == report.total_bytes
    # last turn timings arrived with TurnDone
    assert "tok/s" in w.memory_dock.turn_rows.labels["tokens_per_s"].text()
    taken = w.memory_dock.last_stats
    assert w.memory_dock.turn_rows.labels["draft_acceptance"].text() == (
        f"{taken.draft_acceptance * 100:.0f} % of {taken.draft_tokens}")
    assert "ms" in w.memory_dock.turn_rows.labels["prefill_s"].text()


def test_panel_follows_events_through_the_bridge(make_window, qtbot):
    w = make_window(load=False)
    # only the reports this test injects: the dock's 1 s poll would fetch the engine's own report
    # (no conversation in memory) and replace them at a random moment
    w.memory_dock.reportWanted.disconnect(w.bridge.request_memory_report)
    cid = w.controller.new_conversation()
    w.controller.rename(cid, "Holiday")
    report = MemoryReport(
        device="cuda:0", device_name="Test GPU", total_bytes=80 << 30, free_bytes=60 << 30,
        components={"language_model": 14_000_000_123, "vision_encoder": 600_000_001,
                    "hot_kv": 123_456_789, "image_cache_ram": 5_000_000, "image_cache_disk": 7},
        sessions_kv={cid: 123_456_789},
        counters={"hits": 3},
        store=StoreCounters(bytes_on_disk=9_999_999, blobs_on_disk=42, reused_blobs=17, host_buffer_bytes=2048),
        encoder_state=EncoderStatus.RESIDENT, encoder_idle_left_s=30.0)
    w.bridge.inject(report)
    qtbot.waitUntil(lambda: "Test GPU" in w.memory_dock.device.text(), timeout=5000)
    qtbot.waitUntil(lambda: "14,000,000,123 B" in w.memory_dock.component_text("language_model"), timeout=5000)
    assert "600,000,001 B" in w.memory_dock.component_text("vision_encoder")
    assert "Holiday: 117.7 MiB (123,456,789 B)" in w.memory_dock.kv.text()
    # the first screen: size, reuse, last spill / restore; block counts and the rest under Details
    assert "9,999,999 B" in w.memory_dock.store_rows.labels["bytes_on_disk"].text()
    assert w.memory_dock.store_details.labels["blobs_on_disk"].text() == "42"
    assert w.memory_dock.store_details.labels["reused_blobs"].text() == "17"
    assert "2,048 B" in w.memory_dock.store_details.labels["host_buffer_bytes"].text()
    assert not w.memory_dock.store_details.labels["blobs_on_disk"].isVisibleTo(w.memory_dock)
    w.memory_dock.details_toggle.click()
    assert w.memory_dock.store_details.labels["blobs_on_disk"].isVisibleTo(w.memory_dock)
    assert w.memory_dock.counter_rows.labels["hits"].text() == "3"
    assert "reused_blobs" not in w.memory_dock.counter_rows.labels
    # disk-resident components are listed, not stacked in the device bar
    assert "image_cache_disk" not in dict(w.memory_dock.bar.segments)
    assert dict(w.memory_dock.bar.segments)[f"hot_kv#0:{cid}"] == 123_456_789  # one segment per conversation
    assert "Hot KV, Holiday: 117.7 MiB (123,456,789 B)" in w.memory_dock.bar.toolTip()
    assert "unloads in" in w.memory_dock.encoder.text()

    legend_widgets = list(w.memory_dock._legend_rows.values())
    w.bridge.inject(EncoderState(EncoderStatus.UNLOADED))
    qtbot.waitUntil(lambda: w.memory_dock.encoder.text() == "unloaded", timeout=5000)
    assert not w.memory_dock.unload.isEnabled(), "an unloaded encoder offers no Unload button"
    w.bridge.inject(EncoderState(EncoderStatus.LOADING))
    qtbot.waitUntil(lambda: w.memory_dock.encoder.text() == "loading", timeout=5000)
    w.bridge.inject(SpillState(cid, SpillStatus.SPILLED, "12 blocks, 9 reused"))
    # one line per conversation: its hot KV and its spill state together
    qtbot.waitUntil(lambda: w.memory_dock.kv.text() == "Holiday: 117.7 MiB (123,456,789 B) · spilled — 12 blocks, 9 reused",
                    timeout=5000)
    assert "Holiday: 12 blocks, 9 reused" in w.memory_dock.store_rows.labels["last_spill"].text()
    w.bridge.inject(report)
    qtbot.waitUntil(lambda: w.memory_dock.encoder.text().startswith("resident"), timeout=5000)
    assert w.memory_dock.unload.isEnabled()
    assert list(w.memory_dock._legend_rows.values()) == legend_widgets  # updated in place, not rebuilt
    assert w.memory_dock.store_rows.labels["store_state"].text() == "in use"
    full = "paused: the disk holding /data/kv-store is full (0 bytes free); retried every 30 s"
    w.bridge.inject(dataclasses.replace(report, store_status=full))
    qtbot.waitUntil(lambda: w.memory_dock.store_rows.labels["store_state"].text() == full, timeout=5000)


def test_unload_and_spill_buttons_reach_the_engine(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=4)
    w.composer.take_files([str(make_picture(tmp_path / "p.png", seed=9))])
    send(qtbot, w, "hi")
    wait_reply(qtbot, w)
    w.memory_dock.show()
    qtbot.waitUntil(w.memory_dock.unload.isEnabled, timeout=5000)  # the dock has seen the encoder resident
    with qtbot.waitSignal(w.bridge.memoryReport, timeout=30000):
        qtbot.mouseClick(w.memory_dock.unload, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.memory_dock.encoder.text().startswith("unloaded"), timeout=5000)
    states = []
    w.bridge.spillState.connect(states.append)
    qtbot.mouseClick(w.memory_dock.spill, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(s.state == "spilled" for s in states), timeout=30000)
    assert [s.conversation_id for s in states if s.state == "spilled"] == [w.controller.current_id]
    title = w.history.get_conversation(w.controller.current_id).title
    qtbot.waitUntil(lambda: w.memory_dock.kv.text().startswith(f"{title}: not in memory · spilled — "), timeout=5000)
    assert w.memory_dock.kv.text().count("\n") == 0  # one conversation, one line
    qtbot.waitUntil(lambda: w.memory_dock.store_details.labels.get("blocks_written") is not None, timeout=5000)
    assert int(w.memory_dock.store_details.labels["blocks_written"].text()) >= 1  # a partial block counts
