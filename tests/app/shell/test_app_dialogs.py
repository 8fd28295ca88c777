"""Model picker, settings, theme, and run_app end to end."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app.connection.bridge import EngineBridge
from app.models.model_catalog import scan_hf_cache
from app.models.model_picker import ModelPicker, PathRole, ProblemRole
from app.settings.settings_dialog import SettingsDialog
from app.theme import apply_theme, is_dark
from tests.helpers.window import send, wait_reply


def fake_hub(root: Path, tiny: Path) -> Path:
    """A Hugging Face cache layout: a usable VLM, an unsupported VLM, a text-only model."""
    hub = root / "hub"
    good = hub / "models--acme--tiny-llava"
    snap = good / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (good / "refs").mkdir()
    (good / "refs" / "main").write_text("abc123")
    for f in tiny.iterdir():
        (snap / f.name).symlink_to(f)
    odd = hub / "models--acme--other-vlm" / "snapshots" / "x"
    odd.mkdir(parents=True)
    (odd / "config.json").write_text(json.dumps({"model_type": "paligemma", "vision_config": {}}))
    text = hub / "models--acme--chat-only" / "snapshots" / "y"
    text.mkdir(parents=True)
    (text / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return hub


def test_hf_cache_lists_vision_models_only(tmp_path, tiny_model):
    hub = fake_hub(tmp_path, tiny_model("llava"))
    entries = scan_hf_cache(hub, EngineBridge.check_model_folder)
    assert [(e.name, e.family) for e in entries] == [("acme/other-vlm", "paligemma"), ("acme/tiny-llava", "llava")]
    assert "Unsupported architecture 'paligemma'" in entries[0].problem
    assert entries[1].problem is None and entries[1].path.endswith("abc123")


def test_model_picker_explains_and_chooses(qtbot, tmp_path, tiny_model):
    hub = fake_hub(tmp_path, tiny_model("llava"))
    picker = ModelPicker([], EngineBridge.check_model_folder, hub=hub)
    qtbot.addWidget(picker)
    rows = [picker.list.item(i) for i in range(picker.list.count())]
    labels = [r.text() for r in rows]
    assert any("Parley Shapes" in t and "demo" in t for t in labels)
    assert "Hugging Face cache" in labels
    odd = next(r for r in rows if r.text().startswith("acme/other-vlm"))
    picker.list.setCurrentItem(odd)
    assert not picker.load.isEnabled() and "Unsupported architecture" in picker.why.text()
    good = next(r for r in rows if r.text().startswith("acme/tiny-llava"))
    picker.list.setCurrentItem(good)
    assert picker.load.isEnabled() and good.data(ProblemRole) is None
    qtbot.mouseClick(picker.load, Qt.MouseButton.LeftButton)
    assert picker.chosen == good.data(PathRole)
    # a folder that is no model says why and is not taken
    picker2 = ModelPicker([], EngineBridge.check_model_folder, hub=hub)
    qtbot.addWidget(picker2)
    (tmp_path / "empty").mkdir()
    assert not picker2.try_folder(str(tmp_path / "empty"))
    assert "has no config.json" in picker2.why.text() and picker2.chosen is None


def test_settings_are_saved_and_reach_the_engine(make_window, qtbot):
    w = make_window(load=False)
    dlg = SettingsDialog(w.prefs, w.data_dir, w)
    qtbot.addWidget(dlg)
    dlg.greedy.setChecked(False)
    dlg.temperature.setValue(0.3)
    dlg.top_p.setValue(0.8)
    dlg.max_tokens.setValue(77)
    dlg.system_prompt.setPlainText("Answer in one sentence.")
    dlg.elastic_idle.setValue(12)
    dlg.spill_idle.setValue(34)
    dlg.cache_entries.setValue(9)
    w.apply_settings(dlg)
    s = w.prefs.sampling()
    assert (s.greedy, s.temperature, s.max_new_tokens) == (False, 0.3, 77)
    assert abs(s.top_p - 0.8) < 1e-9
    assert w.prefs.system_prompt() == "Answer in one sentence."
    es = w.prefs.engine_settings()
    assert (es.elastic_idle_s, es.spill_idle_s, es.image_cache_entries) == (12.0, 34.0, 9)
    eng = w.bridge.engine
    qtbot.waitUntil(lambda: eng.settings.elastic_idle_s == 12.0 and eng.settings.spill_idle_s == 34.0, timeout=10000)


def test_chat_system_prompt_is_sent(make_window, qtbot, monkeypatch):
    w = make_window(max_new_tokens=4)
    w.prefs.set_system_prompt("Global rule.")
    sent = []
    orig = w.bridge.submit
    monkeypatch.setattr(w.bridge, "submit", lambda turn: (sent.append(turn), orig(turn))[1])
    send(qtbot, w, "hello")
    wait_reply(qtbot, w)
    w.history.set_system_prompt(w.controller.current_id, "This chat's rule.")
    send(qtbot, w, "again")
    wait_reply(qtbot, w)
    assert [t.system_prompt for t in sent] == ["Global rule.", "This chat's rule."]
    assert [m.role for m in sent[1].messages] == ["user", "assistant", "user"]


def test_dark_and_light_themes():
    app = QApplication.instance()
    apply_theme(app, "dark")
    assert is_dark(app.palette())
    apply_theme(app, "light")
    assert not is_dark(app.palette())
    assert app.palette().color(QPalette.ColorRole.Base).lightness() > 200
    apply_theme(app, "system")


def test_run_app_loads_the_model_and_closes_cleanly(qtbot, tmp_path, tiny_model):
    from app import run_app
    from app.shell.main_window import MainWindow

    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, str(tmp_path / "cfg"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "cfg"))
    seen = {}

    def poke():
        wins = [x for x in QApplication.topLevelWidgets() if isinstance(x, MainWindow) and x.isVisible()]
        if wins and wins[0].model_ready:
            seen["title"] = QApplication.applicationName()
            seen["desktop"] = QApplication.desktopFileName()
            seen["model"] = wins[0].status.model_label.text()
            seen["icon"] = not wins[0].windowIcon().isNull()
            wins[0].close()
        else:
            QTimer.singleShot(50, poke)

    QTimer.singleShot(50, poke)
    rc = run_app(str(tiny_model("llava")), tmp_path / "data", {"max_new_tokens": 5})
    assert rc == 0
    assert seen == {"title": "Parley", "desktop": "parley", "model": seen["model"], "icon": True}
    assert "llava" in seen["model"]
    assert (tmp_path / "data" / "history.sqlite3").is_file()


def test_about_says_the_version_and_what_it_runs_on(tmp_path):
    """Issue 40: About showed no version."""
    import re
    from pathlib import Path

    import app
    from app.shell.main_window import about_text

    text = about_text(tmp_path / "my <data>")
    assert f"Parley {app.__version__}" in text and re.fullmatch(r"\d+\.\d+\.\d+", app.__version__)
    assert "PySide6 6." in text and "torch 2." in text and "transformers 5." in text
    assert "my &lt;data&gt;" in text  # a folder name is shown as text, never as markup
    spec = (Path(__file__).resolve().parents[3] / "packaging" / "parley.spec").read_text()
    assert f'"CFBundleShortVersionString": "{app.__version__}"' in spec  # one version everywhere
