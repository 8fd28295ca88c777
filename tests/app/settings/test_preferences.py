"""Engine settings kept in preferences: every EngineSettings field comes back from the settings
file as the type the engine expects (an INI file hands back strings only), None where a field
allows it; a value this version cannot read keeps that field's default and no other."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from PySide6.QtCore import QSettings

from app.settings.preferences import Preferences, engine_setting_types
from engine.protocol.settings import EngineSettings


def prefs_at(folder: Path) -> Preferences:
    # a new QSettings each time: what comes back is what the file holds, not what Qt kept in memory
    return Preferences(QSettings(str(folder / "Parley.conf"), QSettings.Format.IniFormat))


def changed(name: str, kind: type, default):
    """A value of `kind` unlike the default: every field is seen to be written and read back."""
    if kind is bool:
        return not default
    if kind is int:
        return (default or 0) + 7
    if kind is float:
        return (default or 0.0) + 1.5
    return {"weights": "int8", "dtype": "float16", "device": "cpu"}.get(name, f"other-{default}")


def test_every_engine_setting_round_trips_with_its_type(tmp_path):
    d = EngineSettings()
    kinds = engine_setting_types()
    assert list(kinds) == [f.name for f in fields(EngineSettings)]  # none left out, none invented
    want = {name: changed(name, kind, getattr(d, name)) for name, kind in kinds.items()}
    prefs = prefs_at(tmp_path)
    for name, value in want.items():
        prefs.set_engine_value(name, value)
    prefs.sync()
    got = prefs_at(tmp_path).engine_settings()
    for name, value in want.items():
        assert getattr(got, name) == value, name
        assert type(getattr(got, name)) is kinds[name], name
    assert got == EngineSettings(**want)


def test_none_round_trips_where_a_field_allows_it(tmp_path):
    prefs = prefs_at(tmp_path)
    prefs.set_engine_value("store_cap_bytes", 5 << 30)
    prefs.set_engine_value("memory_budget_bytes", 3 << 30)
    prefs.sync()
    assert prefs_at(tmp_path).engine_settings().store_cap_bytes == 5 << 30
    prefs.set_engine_value("store_cap_bytes", None)
    prefs.set_engine_value("memory_budget_bytes", None)
    prefs.sync()
    got = prefs_at(tmp_path).engine_settings()
    assert (got.store_cap_bytes, got.memory_budget_bytes) == (None, None)


def test_an_unreadable_value_keeps_only_that_fields_default(tmp_path):
    prefs = prefs_at(tmp_path)
    prefs.set_engine_value("image_cache_entries", 9)
    prefs.set_engine_value("spill_idle_s", 30.0)
    prefs.qs.setValue("engine/elastic_idle_s", "soon")  # written by hand or by another version
    prefs.qs.setValue("engine/block_tokens", "None")  # not a field that may be None
    prefs.set_engine_value("weights", "int3")  # a format from another version
    prefs.sync()
    got = prefs_at(tmp_path).engine_settings()
    d = EngineSettings()
    assert (got.image_cache_entries, got.spill_idle_s) == (9, 30.0)
    assert (got.elastic_idle_s, got.block_tokens, got.weights) == (d.elastic_idle_s, d.block_tokens, "auto")


def test_booleans_read_back_from_text(tmp_path):
    prefs = prefs_at(tmp_path)
    prefs.set_engine_value("elastic", False)
    prefs.set_engine_value("lookup_decoding", True)
    prefs.sync()
    got = prefs_at(tmp_path).engine_settings()
    assert (got.elastic, got.lookup_decoding) == (False, True)


def test_run_only_overrides_win_and_are_not_written(tmp_path):
    prefs = prefs_at(tmp_path)
    prefs.set_engine_value("spill_idle_s", 30.0)
    prefs.session_overrides = {"spill_idle_s": 5.0, "temperature": 0.3}  # the second is not an engine setting
    assert prefs.engine_settings().spill_idle_s == 5.0
    prefs.sync()
    assert prefs_at(tmp_path).engine_settings().spill_idle_s == 30.0
