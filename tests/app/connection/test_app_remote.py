"""The window with a remote engine: Settings switch it to Parley's `serve` running in a second
process, a picture goes out and the server's reply comes back, the server dies and the window
says so with nothing lost, Retry sends the turn again and the built-in engine carries the same
conversation on."""

from __future__ import annotations

import base64

import pytest

from app.history.history import COMPLETE
from app.settings.engine_choice import BUILTIN, REMOTE, load_choice
from app.settings.settings_dialog import SettingsDialog
from tests.fixtures.pictures import make_picture
from tests.helpers.remote_servers import ParleyServe
from tests.helpers.window import choose_engine, send, wait_reply

openai = pytest.importorskip("openai")
TIMEOUT_MS = 120_000


@pytest.mark.slow
def test_switch_to_a_server_send_a_picture_server_dies_nothing_lost(make_window, qtbot, tiny_model, tmp_path):
    w = make_window(max_new_tokens=8)
    builtin_name = w.model_name
    server = ParleyServe(tiny_model("llava"), tmp_path / "server-data")
    try:
        assert w.engines.label.text() == "Built-in engine"
        choose_engine(w, qtbot, server.url.removesuffix("/v1"))  # pasted without /v1
        qtbot.waitUntil(lambda: w.model_ready and "(remote)" in w.status.model_label.text(), timeout=TIMEOUT_MS)
        choice = load_choice(w.prefs.qs)
        assert choice.kind == REMOTE and choice.server.url == server.url.removesuffix("/v1")
        assert w.engines.label.text().startswith("Remote: 127.0.0.1:")
        assert w.engines.panel.isVisible() and not w.memory_dock.isVisible()

        pic = make_picture(tmp_path / "shapes.png", seed=3)
        w.composer.take_files([str(pic)])
        send(qtbot, w, "What is in this picture?")
        wait_reply(qtbot, w)
        user, reply = w.messages.items()
        assert reply.status == COMPLETE and reply.text
        # the server keeps its caches to itself: no memory mark, no picture mark; the line is the server's
        cid = w.controller.current_id
        assert w.chat_marks.mark(cid) is None and w.picture_marks.words(user.digests[0]) is None
        assert reply.note.startswith("first text after ") or reply.note.startswith("The server had ")
        # the server's own answer to the same request, asked directly
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
        url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
        direct = client.chat.completions.create(
            model=w.model_name,
            max_tokens=8,
            temperature=0,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "What is in this picture?"},
                    ],
                }
            ],
        )
        assert reply.text == direct.choices[0].message.content
        qtbot.waitUntil(lambda: w.engines.panel.text("turns") == "1", timeout=TIMEOUT_MS)
        assert w.engines.panel.text("ttft").endswith(" s") and w.engines.panel.text("error") == "none"

        server.kill()
        send(qtbot, w, "And now?")
        wait_reply(qtbot, w)
        assert w.notice.isVisible() and "connection refused" in w.notice.text()
        assert w.retry.isVisible()
        assert w.engines.panel.text("error") == w.notice.text()
        cid = w.controller.current_id
        stored = w.history.messages(cid)
        assert [(m.role, m.text) for m in stored] == [
            ("user", "What is in this picture?"),
            ("assistant", reply.text),
            ("user", "And now?"),
        ]
        assert w.history.picture_path(stored[0].pictures[0]).read_bytes() == pic.read_bytes()
        assert w.composer.text() == ""  # the sent text is in the history, not lost with the turn

        qtbot.mouseClick(w.retry, qtbot_left())  # still dead: the same clear message again
        wait_reply(qtbot, w)
        assert "connection refused" in w.notice.text() and w.retry.isVisible()
        assert len(w.history.messages(cid)) == 3

        choose_engine(w, qtbot, None)  # back to the built-in engine: the conversation goes on
        assert load_choice(w.prefs.qs).kind == BUILTIN
        qtbot.waitUntil(lambda: w.model_name == builtin_name and w.model_ready, timeout=TIMEOUT_MS)
        assert w.engines.label.text() == "Built-in engine" and w.memory_dock.isVisible()
        qtbot.mouseClick(w.retry, qtbot_left())
        wait_reply(qtbot, w)
        roles = [(m.role, m.status) for m in w.history.messages(cid)]
        assert roles == [("user", COMPLETE), ("assistant", COMPLETE), ("user", COMPLETE), ("assistant", COMPLETE)]
        assert not w.retry.isVisible()
    finally:
        server.close()


def qtbot_left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def test_settings_refuse_a_remote_engine_without_an_address(make_window, qtbot):
    w = make_window(load=False)
    dlg = SettingsDialog(w.prefs, w.data_dir, w, api_apply=w.apply_api)
    dlg.engine_box.remote.setChecked(True)
    dlg.accept()
    assert dlg.result() != dlg.DialogCode.Accepted
    assert dlg.engine_box.error.text() == "Add a server (its address) to use a remote engine."
    assert load_choice(w.prefs.qs).kind == BUILTIN and w.engines.label.text() == "Built-in engine"


def test_fetch_models_from_nothing_says_why(make_window, qtbot):
    from tests.helpers.remote_servers import free_port

    w = make_window(load=False)
    dlg = SettingsDialog(w.prefs, w.data_dir, w)
    box = dlg.engine_box
    box.add_server()
    qtbot.keyClicks(box.url, f"127.0.0.1:{free_port()}")
    with qtbot.waitSignal(box.checked, timeout=30_000) as got:
        box.fetch_models()
    assert got.args == [[]]
    assert "connection refused" in box.error.text() and not box.error.isHidden()


def test_several_saved_servers_and_the_chosen_one(make_window, qtbot):
    w = make_window(load=False)
    dlg = SettingsDialog(w.prefs, w.data_dir, w)
    box = dlg.engine_box
    for url, model in (("http://gpu-a:8000/v1", "big"), ("gpu-b:8000", "bigger")):
        box.add_server()
        qtbot.keyClicks(box.url, url)
        box.model.setEditText(model)
    box.server_list.setCurrentIndex(0)
    assert (box.url.text(), box.model.currentText()) == ("http://gpu-a:8000/v1", "big")
    choice = box.choice()
    assert choice.kind == REMOTE and choice.current == 0 and len(choice.servers) == 2
    assert choice.server.config().base_url == "http://gpu-a:8000/v1" and choice.server.model == "big"
    box.server_list.setCurrentIndex(1)
    box.remove_server()
    assert [s.url for s in box.choice().servers] == ["http://gpu-a:8000/v1"]


def test_a_stream_cut_mid_reply_is_kept_interrupted(make_window, qtbot):
    from app.history.history import INTERRUPTED
    from tests.helpers.remote_servers import DropsMidStream, StubServer

    server = StubServer(DropsMidStream)
    try:
        w = make_window(load=False)
        choose_engine(w, qtbot, server.root)
        qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
        send(qtbot, w, "Tell me")
        wait_reply(qtbot, w)
        reply = w.messages.items()[-1]
        assert (reply.role, reply.text, reply.status) == ("assistant", "Half a reply", INTERRUPTED)
        stored = w.history.messages(w.controller.current_id)[-1]
        assert (stored.text, stored.status) == ("Half a reply", INTERRUPTED)
        assert "dropped mid-reply" in w.notice.text() and w.retry.isVisible()
    finally:
        server.close()
