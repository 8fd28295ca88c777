"""`main.py replay` with versions (#41 item 3): "edit" adds a version of a user message, "version"
switches back to one with the turns that followed it there; each line's stats say what was
reused, restored and prefilled, and every reply equals a fresh full prefill of the history shown."""

from __future__ import annotations

import json

import pytest

from engine.headless.versions import VersionedChat, VersionError
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import Reference, run_main


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


def test_versioned_chat_keeps_what_followed_each_version():
    chat = VersionedChat()
    for text in ("q0", "q1"):
        chat.send(Message("user", text))
        chat.answered(Message("assistant", "r" + text[1]))
    chat.send(Message("user", "q2"))
    chat.answered(Message("assistant", "r2"))
    number = chat.edit(1, Message("user", "q1'"))
    assert (number.message, number.version, number.of) == (1, 2, 2)
    assert texts(chat.history()) == ["q0", "r0", "q1'"]
    chat.answered(Message("assistant", "r1'"))
    chat.switch(1, 1)  # the first version, with the turn that followed it there
    assert texts(chat.history()) == ["q0", "r0", "q1", "r1", "q2", "r2"]
    chat.switch(1, 2)
    chat.send(Message("user", "q3"))
    chat.failed()  # a failed turn leaves nothing behind
    assert texts(chat.history()) == ["q0", "r0", "q1'", "r1'"]
    chat.edit(0, Message("user", "q0'"))
    chat.failed()  # nor does a failed edit: the version shown before is shown again
    assert texts(chat.history()) == ["q0", "r0", "q1'", "r1'"]
    with pytest.raises(VersionError):
        chat.switch(1, 3)
    with pytest.raises(VersionError):
        chat.edit(2, Message("user", "no such message"))


@pytest.mark.slow
def test_replay_edits_and_switches_versions_exactly(tiny_model, tmp_path):
    model = tiny_model("llava")
    a, b, c = (make_picture(tmp_path / f"{n}.png", i, size=(40 + 8 * i, 48)) for i, n in enumerate("abc", 1))
    u1 = ("Describe the first picture in a few words, please.", ["a.png"])
    u2 = ("Now compare it with this one, at some length.", ["b.png"])
    edit = ("No, tell me instead what this one shows.", ["c.png"])
    script = {
        "settings": {"max_new_tokens": 6, "greedy": True, "block_tokens": 16, "spill_idle_s": 3600},
        "turns": [
            {"user": u1[0], "images": u1[1]},
            {"user": u2[0], "images": u2[1]},
            {"user": edit[0], "images": edit[1], "edit": 1},
            {"user": "Which has more red in it?", "version": [1, 1]},
            {"user": "Which has more red in it?", "version": [1, 2]},
            {"user": "And the first one?", "version": [1, 1], "restart": True},
            {"user": "A version that is not there.", "version": [1, 3]},
        ],
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    res = run_main("replay", str(path), "--model", str(model), "--data-dir", str(tmp_path / "d"))
    assert res.returncode == 1, res.stderr  # the last turn names no version there is
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [line["turn"] for line in lines] == list(range(7))
    assert "no version 3" in lines[6]["error"]
    assert lines[2]["version"] == [1, 2]
    replies = [Message("assistant", line.get("reply", "")) for line in lines]

    def user(text: str, names: list[str]) -> Message:
        return Message("user", text, pics(*(tmp_path / n for n in names)))

    first = [user(*u1), replies[0]]
    version_a = first + [user(*u2), replies[1]]
    version_b = first + [user(*edit), replies[2]]
    histories = {
        0: [user(*u1)],
        1: first + [user(*u2)],
        2: first + [user(*edit)],
        3: version_a + [user("Which has more red in it?", [])],
        4: version_b + [user("Which has more red in it?", [])],
        5: version_a + [user("Which has more red in it?", []), replies[3], user("And the first one?", [])],
    }
    ref = Reference(model)
    for turn, history in histories.items():
        assert lines[turn]["reply_token_ids"] == ref.reply_ids(history, 6), f"turn {turn}"
    stats = [line.get("stats", {}) for line in lines]
    for turn in (3, 4, 5):  # each switch restores its version and encodes no picture
        s = stats[turn]
        assert s["restored_tokens"] > 0 and s["pictures_encoded"] == 0, (turn, s)
        assert s["prefill_tokens"] == s["prompt_tokens"] - s["reused_tokens"] - s["restored_tokens"]
    assert stats[3]["reused_tokens"] > 0  # hot: the opening both versions share stays in memory
    assert stats[5]["reused_tokens"] == 0  # after the restart, all of it from the SSD
