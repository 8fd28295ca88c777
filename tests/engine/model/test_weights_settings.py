"""The weights setting from every side: `auto` picks what fits and says so, unsupported or
unknown formats are refused with one line (and the engine keeps working), `--weights` and replay
settings reach the engine, turn stats say what was loaded, and the Settings dialog offers it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.headless.replay import run_replay
from engine.model.load import ModelLoadError, load_model
from engine.model.weights import estimate_bytes, plan_weights
from engine.protocol.events import Message, ModelFailed
from engine.protocol.settings import WEIGHT_FORMATS, EngineSettings
from tests.helpers.engine_helpers import ask, expect_done, open_engine

ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
GIB = 1 << 30


@pytest.fixture(scope="module")
def wide_llava(tmp_path_factory):
    """Tiny models are mostly embeddings; wider layers make the formats' sizes rank as in real
    models: int8 < bf16 < fp32."""
    from tests.fixtures.tiny_models import build_tiny_model

    return build_tiny_model(
        "llava", tmp_path_factory.mktemp("wide-llava"), text={"hidden_size": 256, "intermediate_size": 1024}
    )


def test_auto_picks_full_precision_when_it_fits_else_the_next_step_down_that_fits(wide_llava):
    model = wide_llava
    need = {
        f: estimate_bytes(model, "llava", f, torch.bfloat16 if f == "bf16" else torch.float32)
        for f in ("fp32", "bf16", "int8", "int4", "4bit")
    }
    assert need["int4"] < need["int8"] < need["bf16"] < need["fp32"] and need["4bit"] < need["fp32"]
    plan = plan_weights(model, "llava", CPU, "auto", "auto", 64 * GIB)
    assert (plan.format, plan.dtype, plan.note) == ("fp32", torch.float32, "")
    plan = plan_weights(model, "llava", CPU, "auto", "auto", int(need["bf16"] * 1.1) + 1)
    assert (plan.format, plan.dtype) == ("bf16", torch.bfloat16) and plan.note.startswith("Weights: bf16 — fp32 needs")
    plan = plan_weights(model, "llava", CPU, "auto", "auto", int(need["int8"] * 1.1) + 1)
    assert (plan.format, plan.dtype) == ("int8", torch.float32) and plan.note.startswith("Weights: int8 — fp32 needs")
    # on a CPU the next step down is int4 (numba's kernels), not NF4 (bitsandbytes: for CUDA)
    plan = plan_weights(model, "llava", CPU, "auto", "auto", int(need["int4"] * 1.1) + 1)
    assert (plan.format, plan.rows) == ("int4", True) and plan.note.startswith("Weights: int4 — fp32 needs")
    plan = plan_weights(model, "llava", CPU, "auto", "auto", 1000)
    assert plan.format == min(("int8", "int4", "4bit", "bf16"), key=need.get) and "no format fits" in plan.note
    # an estimate from the safetensors headers matches what a load really takes (within 10%)
    from engine.device.ledger import model_bytes

    real = sum(model_bytes(load_model(model, weights="int8")))
    assert abs(real - need["int8"]) < 0.1 * real


def test_auto_in_the_engine_says_which_format_and_why(wide_llava, tmp_path):
    model = wide_llava
    need = {
        f: estimate_bytes(model, "llava", f, torch.bfloat16 if f == "bf16" else torch.float32) for f in ("bf16", "int8")
    }
    budget = int(need["int8"] * 1.1) + 1
    assert budget < need["bf16"] * 1.1
    notices: list[str] = []
    engine = open_engine(model, tmp_path / "data", notices=notices, memory_budget_bytes=budget)
    try:
        d = expect_done(ask(engine, "c", [Message("user", "Hello there")], 4))
        assert d.stats.weights == "int8"
        assert [n for n in notices if n.startswith("Weights: int8 — fp32 needs")]
    finally:
        engine.shutdown()


def test_unsupported_and_unknown_formats_are_refused_with_one_line(tiny_model):
    model = tiny_model("llava")
    cases = [
        (dict(weights="int3"), "unknown weights format 'int3'"),
        (dict(weights="bf16", dtype="float32"), "weights bf16 and dtype float32 disagree"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ModelLoadError) as err:
            load_model(model, **kwargs)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    for fmt in ("int8", "4bit"):  # Apple GPUs have neither library's kernels
        with pytest.raises(ModelLoadError) as err:
            plan_weights(model, "llava", torch.device("mps"), "auto", fmt, 64 * GIB)
        assert (
            str(err.value) == f"{fmt} weights are not available on mps (they run on CPU and CUDA); "
            "choose bf16, fp16 or fp32"
        )
    with pytest.raises(ValueError, match="unknown weights format 'int3'"):
        EngineSettings().with_changes({"weights": "int3"})


def test_a_refused_format_leaves_the_engine_working(tiny_model, tmp_path):
    model = tiny_model("llava")
    engine = open_engine(model, tmp_path / "data", weights="fp32")
    failures: list[str] = []
    engine.add_listener(lambda e: failures.append(e.message) if isinstance(e, ModelFailed) else None)
    try:
        before = expect_done(ask(engine, "c", [Message("user", "Hi")], 4))
        engine.update_settings(weights="bf16", dtype="float32")  # a reload that cannot work
        after = expect_done(ask(engine, "c", [Message("user", "Hi")], 4))  # runs after the refusal
        assert failures == [
            "weights bf16 and dtype float32 disagree: set dtype to auto, or choose the weights format fp32"
        ]
        assert after.token_ids == before.token_ids and after.stats.weights == "fp32"
    finally:
        engine.shutdown()


def test_changing_the_weights_setting_reloads_the_model(tiny_model, tmp_path):
    model = tiny_model("smolvlm")
    engine = open_engine(model, tmp_path / "data", weights="fp32")
    try:
        d1 = expect_done(ask(engine, "c", [Message("user", "Hi")], 4))
        engine.update_settings(weights="int8")
        d2 = expect_done(ask(engine, "c", [Message("user", "Hi")], 4))  # queued after the reload
        assert (d1.stats.weights, d2.stats.weights) == ("fp32", "int8")
        assert d2.stats.weight_bytes < d1.stats.weight_bytes / 2
    finally:
        engine.shutdown()


def test_replay_settings_and_the_weights_option(tiny_model, tmp_path):
    model = str(tiny_model("idefics3"))
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"settings": {"max_new_tokens": 3, "weights": "int8"}, "turns": [{"user": "Hello"}]}))
    out = io.StringIO()
    assert run_replay(script, model, tmp_path / "d1", out) == 0
    stats = json.loads(out.getvalue())["stats"]
    assert stats["weights"] == "int8" and stats["weight_bytes"] > 0
    out = io.StringIO()  # the command line's --weights wins over the script
    assert run_replay(script, model, tmp_path / "d2", out, {"weights": "fp32"}) == 0
    assert json.loads(out.getvalue())["stats"]["weights"] == "fp32"

    script.write_text(json.dumps({"settings": {"weights": "int3"}, "turns": [{"user": "Hello"}]}))
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "replay",
            str(script),
            "--model",
            model,
            "--data-dir",
            str(tmp_path / "d3"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "error: unknown weights format 'int3' (use auto, bf16, fp16, fp32, int8, int4, 4bit)"
    ]


def test_weights_option_on_every_headless_command():
    from main import build_parser

    parser = build_parser()
    assert parser.parse_args(["ask", "--weights", "int8", "hi"]).weights == "int8"
    assert parser.parse_args(["replay", "--weights", "4bit", "s.json"]).weights == "4bit"
    assert parser.parse_args(["serve", "--weights", "bf16"]).weights == "bf16"
    assert parser.parse_args(["ask", "hi"]).weights is None  # the engine default: auto
    res = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "ask", "--weights", "int3", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "invalid choice: 'int3'" in res.stderr


def test_settings_dialog_offers_the_weights_choice(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.settings.preferences import Preferences
    from app.settings.settings_dialog import SettingsDialog

    prefs = Preferences(QSettings(str(tmp_path / "p.ini"), QSettings.Format.IniFormat))
    dlg = SettingsDialog(prefs, tmp_path)
    qtbot.addWidget(dlg)
    assert [dlg.weights.itemData(i) for i in range(dlg.weights.count())] == list(WEIGHT_FORMATS)
    assert dlg.weights.currentData() == "auto"
    dlg.weights.setCurrentIndex(dlg.weights.findData("int8"))
    assert dlg.save() == {"weights": "int8"}
    assert prefs.engine_settings().weights == "int8"
    again = SettingsDialog(prefs, tmp_path)
    qtbot.addWidget(again)
    assert again.weights.currentData() == "int8"
    prefs.set_engine_value("weights", "int3")  # a value from another version loads as auto
    assert prefs.engine_settings().weights == "auto"
