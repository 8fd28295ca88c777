"""`main.py models list | pull | rm` and `--model ORG/NAME`, against the hub stand-in."""

from __future__ import annotations

import pytest

import main
from engine.headless.options import model_dir
from tests.fixtures.hub_standin import safetensors_bytes, start_standin


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = start_standin(monkeypatch, tmp_path / "hf" / "hub")
    h.add_repo(
        "acme/cli",
        {
            "config.json": b'{"model_type": "llava"}',
            "chat_template.jinja": b"{{ m }}",
            "model.safetensors": safetensors_bytes(2 << 20),
        },
    )
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
    assert capsys.readouterr().err.strip() == (
        "error: acme/bin-only cannot be used by Parley: no .safetensors weights (Parley loads safetensors only)"
    )
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

    hub.add_repo(
        "acme/gated",
        {
            "config.json": b'{"model_type": "llava"}',
            "chat_template.jinja": b"{{ m }}",
            "model.safetensors": safetensors_bytes(1 << 20),
        },
        gated_token="hf_good",
    )
    assert main.main(["models", "pull", "acme/gated"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: HTTP 401: acme/gated is gated; accept its terms at {hub.url}/acme/gated and set a Hugging Face "
        "token with access to it"
    ]
    # no OS keyring on this machine (keyring answers with its 'fail' backend): the HF token file
    where = token_store.save_token("  hf_good\n")
    path = tmp_path / "hf" / "hf-token"
    assert where == f"the file {path}" and path.read_text() == "hf_good"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert main.main(["models", "pull", "acme/gated"]) == 0
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")  # the environment wins, as in huggingface_hub
    assert token_store.load_token() == "hf_from_env"


def test_list_offline_has_a_fit_column_from_the_catalog_and_loads_no_model_libraries(hub, tmp_path):
    """Issue 27: offline, `models list` printed no fit at all, and took 12-18 s: the device probe
    imported torch and transformers (with torchvision) even where no GPU can be."""
    import subprocess
    import sys

    from engine.library.catalog import load_catalog
    from tests.helpers.remote_servers import ROOT

    code = (
        "import sys, main\n"
        "rc = main.main(['models', 'list'])\n"
        "from engine.library.fit import accelerator_possible\n"
        "print('imported:', 'transformers' in sys.modules, 'torch' in sys.modules, accelerator_possible())\n"
        "sys.exit(rc)\n"
    )
    env = dict(__import__("os").environ, HF_ENDPOINT="http://127.0.0.1:1", HF_HUB_OFFLINE="0")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["MODEL", "FAMILY", "PARAMS", "DOWNLOAD", "INSTALLED", "FIT"]
    for entry in load_catalog():
        row = next(line for line in lines if line.startswith(entry.repo_id + " "))
        assert "needs ~" in row and row.endswith("(estimated from the catalog)"), row
    transformers, torch, accelerator = lines[-1].removeprefix("imported: ").split()
    assert transformers == "False" and torch == accelerator  # torch only to ask a GPU
