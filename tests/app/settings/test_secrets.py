"""Secrets are the user's alone: API keys of saved servers and the API server's token are never
in the settings file (readable by others on many systems), but in the OS keyring or, where
there is none (this machine), in a 0600 file in a 0700 folder; settings an older version wrote
move there; the HF token file is tightened when saved over."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.settings.engine_choice import REMOTE, EngineChoice, SavedServer, load_choice, save_choice
from app.settings.preferences import ApiConfig, Preferences
from app.settings.secrets import Secrets
from engine.library.token_store import os_keyring

pytestmark = pytest.mark.skipif(os_keyring() is not None, reason="an OS keyring is in use here; this checks the file")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def settings(folder: Path) -> QSettings:
    return QSettings(str(folder / "Parley.conf"), QSettings.Format.IniFormat)


def test_secrets_an_older_version_left_in_the_settings_move_out(tmp_path):
    folder = tmp_path / "config" / "Parley"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    old = settings(folder)  # as an older Parley left it: keys in plain text, 0644 in a 0755 folder
    old.setValue("api/token", "api-s3cret")
    old.setValue("engine/servers", '[{"url": "http://gpu:8000", "api_key": "sk-s3cret", "model": "big"}]')
    old.sync()
    os.chmod(folder / "Parley.conf", 0o644)
    del old

    prefs = Preferences(settings(folder))
    assert prefs.api_config().token == "api-s3cret"
    [server] = load_choice(prefs.qs).servers
    assert server.api_key == "sk-s3cret" and server.url == "http://gpu:8000"
    prefs.sync()
    text = (folder / "Parley.conf").read_text()
    assert "s3cret" not in text, text
    assert mode(folder / "Parley.conf") == 0o600 and mode(folder) == 0o700
    [kept] = [p for p in folder.iterdir() if "secret" in p.name]
    assert mode(kept) == 0o600 and "sk-s3cret" in kept.read_text()
    # read back by a fresh start
    again = Preferences(settings(folder))
    assert again.api_config().token == "api-s3cret" and load_choice(again.qs).servers[0].api_key == "sk-s3cret"


def test_new_secrets_never_reach_the_settings_file(tmp_path):
    prefs = Preferences(settings(tmp_path))
    prefs.set_api_config(ApiConfig(enabled=True, token="tok-s3cret"))
    save_choice(prefs.qs, EngineChoice(REMOTE, (SavedServer("http://gpu:8000", "sk-s3cret", "big"),), 0))
    prefs.sync()
    assert "s3cret" not in (tmp_path / "Parley.conf").read_text()
    assert mode(tmp_path / "Parley.conf") == 0o600
    assert load_choice(prefs.qs).server.api_key == "sk-s3cret" and prefs.api_config().token == "tok-s3cret"
    save_choice(prefs.qs, EngineChoice(REMOTE, (SavedServer("http://gpu:8000", "", "big"),), 0))  # key cleared
    assert load_choice(prefs.qs).server.api_key == ""
    assert "sk-s3cret" not in "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())


def test_a_damaged_secrets_file_is_one_empty_start_not_a_crash(tmp_path):
    store = Secrets(tmp_path, "Parley")
    store.set("api-token", "x")
    [path] = [p for p in tmp_path.iterdir() if "secret" in p.name]
    path.write_text("{not json")
    assert Secrets(tmp_path, "Parley").get("api-token") == ""


def test_saving_the_hf_token_tightens_an_open_file(tmp_path, monkeypatch):
    from engine.library.token_store import load_token, save_token

    path = tmp_path / "hf" / "token"
    path.parent.mkdir()
    path.write_text("hf_old")
    os.chmod(path, 0o644)  # as `hf auth login` under a loose umask, or an older Parley, left it
    monkeypatch.setenv("HF_TOKEN_PATH", str(path))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    save_token("hf_new")
    assert mode(path) == 0o600 and load_token() == "hf_new"
