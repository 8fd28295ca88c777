"""`main.py models list | pull | rm` and `--model ORG/NAME`, against the hub stand-in."""
from __future__ import annotations

import pytest

import main
from engine.headless.options import model_dir
from tests.fixtures.hub_standin import safetensors_bytes, start_standin


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = start_standin(monkeypatch, tmp_path / "hf" / "hub")
    h.add_repo("acme/cli", {"config.json": b'{"model_type": "llava"}', "chat_template.jinja": b"{{ m }}",
                            "model.safetensors": safetensors_bytes(2 << 20)})
    yield h
    h.stop()


def test_pull_list_resolve_rm(hub, capsys):
    assert main.main(["models", "pull", "acme/cli"]) == 0
    out, err = capsys.readouterr()
    assert "acme/cli: complete and verified" in err and "B/s" in err  # the tqdm bar: bytes, speed
    snapshot = out.strip()
    assert model_dir("acme/cli") == snapshot
    assert main.main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert any(line.startswith("acme/cli") and "installed" in line for line in listed.splitlines())
    assert main.main(["models", "rm", "acme/cli"]) == 0
    assert capsys.readouterr().out.startswith("removed acme/cli: 0.00 GB freed")  # ~2 MiB
    assert model_dir("acme/cli").endswith("acme/cli")  # no longer resolved: left as a path


def test_pull_failures_are_one_line(hub, capsys):
    assert main.main(["models", "pull", "acme/missing"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: HTTP 404: acme/missing not found at {hub.url}/acme/missing"]
    hub.add_repo("acme/bin-only", {"config.json": b'{"model_type": "llava"}', "pytorch_model.bin": b"x" * 100})
    assert main.main(["models", "pull", "acme/bin-only"]) == 1
    assert capsys.readouterr().err.strip() == ("error: acme/bin-only cannot be used by Parley: no .safetensors "
                                               "weights (Parley loads safetensors only)")
    assert "model.safetensors" not in hub.sent and "pytorch_model.bin" not in hub.sent


def test_list_offline_says_unreachable_once(hub, capsys, monkeypatch):
    assert main.main(["models", "pull", "acme/cli"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    assert main.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.count("network unreachable") == 1
    assert any(line.startswith("acme/cli") and "installed" in line for line in out.splitlines())


def test_gated_pull_with_a_saved_token(hub, capsys, tmp_path, monkeypatch):
    import os
    import stat

    from engine.library import token_store

    hub.add_repo("acme/gated", {"config.json": b'{"model_type": "llava"}', "chat_template.jinja": b"{{ m }}",
                                "model.safetensors": safetensors_bytes(1 << 20)}, gated_token="hf_good")
    assert main.main(["models", "pull", "acme/gated"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: HTTP 401: acme/gated is gated; accept its terms at {hub.url}/acme/gated and set a Hugging Face "
        "token with access to it"]
    # no OS keyring on this machine (keyring answers with its 'fail' backend): the HF token file
    where = token_store.save_token("  hf_good\n")
    path = tmp_path / "hf" / "hf-token"
    assert where == f"the file {path}" and path.read_text() == "hf_good"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert main.main(["models", "pull", "acme/gated"]) == 0
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")  # the environment wins, as in huggingface_hub
    assert token_store.load_token() == "hf_from_env"
