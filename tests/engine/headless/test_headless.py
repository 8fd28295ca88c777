"""`main.py ask` and `main.py replay` as a user scripts them (real subprocesses)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import Reference, run_main

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_ask_prints_the_reference_reply(tiny_model, tmp_path):
    model = tiny_model("qwen2_vl")
    pic = make_picture(tmp_path / "a.png", 3)
    res = run_main(
        "ask",
        "--model",
        str(model),
        "--data-dir",
        str(tmp_path / "d"),
        "--image",
        str(pic),
        "--max-new-tokens",
        "6",
        "What is this?",
    )
    assert res.returncode == 0, res.stderr
    ref = Reference(model)
    ids = ref.reply_ids([Message("user", "What is this?", pics(pic))], 6)
    expected = ref.loaded.tokenizer.decode(ids, skip_special_tokens=True)
    assert res.stdout == expected + "\n"


def test_ask_with_a_bad_picture_says_why(tiny_model, tmp_path):
    res = run_main(
        "ask",
        "--model",
        str(tiny_model("llava")),
        "--data-dir",
        str(tmp_path / "d"),
        "--image",
        str(tmp_path / "nope.png"),
        "hi",
    )
    assert res.returncode == 1
    assert "Picture not found" in res.stderr and "Traceback" not in res.stderr


def test_replay_interleaves_conversations_and_reports_stats(tiny_model, tmp_path):
    model = tiny_model("idefics3")
    make_picture(tmp_path / "a.png", 1)
    make_picture(tmp_path / "b.png", 2, size=(70, 50))
    script = {
        "settings": {"max_new_tokens": 5, "greedy": True},
        "turns": [
            {"user": "What is in the picture?", "images": ["a.png"], "system": "Be brief."},
            {"user": "Other chat.", "conversation": "side"},
            {"user": "And this one?", "images": ["b.png"]},
            {"user": "Thanks.", "wait_s": 0.1},
        ],
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    res = run_main("replay", str(path), "--model", str(model), "--data-dir", str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [line["turn"] for line in lines] == [0, 1, 2, 3]
    required = {
        "prompt_tokens",
        "reused_tokens",
        "prefill_tokens",
        "generated_tokens",
        "prefill_s",
        "decode_s",
        "encode_s",
        "encoder_loads",
        "image_cache_hits",
        "image_cache_misses",
        "restored_tokens",
        "spill_blocks_written",
        "spill_blocks_reused",
    }
    for line in lines:
        assert required <= set(line["stats"]), required - set(line["stats"])
        assert len(line["reply_token_ids"]) == 5
    # main: turn 2 re-sends a.png (a cache hit) and reuses turn 0's prefix
    assert lines[2]["stats"]["image_cache_hits"] == 1 and lines[2]["stats"]["image_cache_misses"] == 1
    assert lines[2]["stats"]["reused_tokens"] >= lines[0]["stats"]["prompt_tokens"]
    assert lines[1]["stats"]["reused_tokens"] == 0  # a different conversation has its own cache
    # the replies equal a fresh full prefill of the same conversation
    ref = Reference(model)
    convo = [Message("user", "What is in the picture?", pics(tmp_path / "a.png"))]
    assert lines[0]["reply_token_ids"] == ref.reply_ids(convo, 5, system="Be brief.")
    convo += [Message("assistant", lines[0]["reply"]), Message("user", "And this one?", pics(tmp_path / "b.png"))]
    assert lines[2]["reply_token_ids"] == ref.reply_ids(convo, 5, system="Be brief.")


def test_replay_rejects_a_bad_script(tiny_model, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"settings": {"max_new_tokenz": 3}, "turns": []}))
    res = run_main("replay", str(path), "--model", str(tiny_model("llava")), "--data-dir", str(tmp_path / "d"))
    assert res.returncode == 1 and "unknown setting" in res.stderr


def test_headless_stderr_keeps_only_messages(tiny_model, tmp_path):
    """stderr is a pipe here (as in scripts and logs): no "Loading weights" progress bar."""
    res = run_main(
        "ask", "--model", str(tiny_model("llava")), "--data-dir", str(tmp_path / "d"), "--max-new-tokens", "2", "hi"
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""


@contextlib.contextmanager
def read_only_folder(path: Path):
    """A folder nothing can be written into: by mode for a normal user; for root (whom modes do
    not stop) a read-only tmpfs mounted there."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot make a read-only folder as root here (mount refused)")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes / mounts")
def test_replay_with_a_read_only_store_logs_it_once(tiny_model, tmp_path):
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "settings": {"max_new_tokens": 2, "spill_idle_s": 0.05},
                "turns": [{"user": "hi"}, {"user": "again", "wait_s": 0.3}, {"user": "and again", "wait_s": 0.3}],
            }
        )
    )
    data = tmp_path / "d"
    with read_only_folder(data / "kv-store"):
        res = run_main("-v", "replay", "--model", str(tiny_model("llava")), "--data-dir", str(data), str(script))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 3  # every turn answered: the store is not needed for that
    store_lines = [line for line in res.stderr.splitlines() if "KV store" in line]
    assert len(store_lines) == 1, res.stderr
    assert "WARNING" in store_lines[0]
    assert "Read-only file system" in store_lines[0] or "Permission denied" in store_lines[0]
