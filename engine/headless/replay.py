"""`main.py replay`: a scripted multi-turn conversation, one JSON line per turn.

Script: {"settings": {...}, "turns": [{"user": "...", "images": ["a.png"], "wait_s": 0,
"conversation": "main", "system": "...", "restart": false}, ...]}. Picture paths (pictures, PDFs:
all their pages, videos: a frame a second, at most 16) are relative to the script's folder; each
is hashed once, when its turn is sent (a missing one fails that turn with one line, as a failed
turn does). Settings take sampling keys and any EngineSettings field.

Versions, as the window keeps them (#41): `"edit": K` sends this turn's text and pictures as a new
version of the conversation's K-th user message (0-based), its line saying which ("version":
[K, V]); `"version": [K, V]` first shows version V (1-based) of the K-th user message, with the
turns that followed it there, and then sends this turn after them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from ..pictures.attach import attach_all
from ..pictures.file import PictureError
from ..protocol.client import EngineError, Interrupted, load_blocking, run_blocking
from ..protocol.events import Message, Sampling, Turn, TurnFailed
from ..protocol.settings import EngineSettings
from . import options
from .versions import VersionedChat, VersionError

SAMPLING_KEYS = {"max_new_tokens", "greedy", "temperature", "top_p", "seed"}
TURN_KEYS = {"user", "images", "wait_s", "conversation", "system", "restart", "edit", "version"}


class ReplayError(Exception):
    pass


def parse_script(path: Path) -> tuple[Sampling, dict, list[dict]]:
    try:
        script = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReplayError(f"script not found: {path}") from None
    except ValueError as exc:
        raise ReplayError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(script, dict) or not isinstance(script.get("turns"), list):
        raise ReplayError('a script is {"settings": {...}, "turns": [...]}')
    settings = dict(script.get("settings") or {})
    unknown = set(settings) - SAMPLING_KEYS - EngineSettings.field_names()
    if unknown:
        raise ReplayError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    sampling = Sampling(**{k: settings.pop(k) for k in list(settings) if k in SAMPLING_KEYS})
    if "temperature" in script.get("settings", {}) and "greedy" not in script.get("settings", {}):
        sampling.greedy = sampling.temperature <= 0
    base = path.parent
    turns = []
    for i, t in enumerate(script["turns"]):
        if not isinstance(t, dict) or not isinstance(t.get("user"), str):
            raise ReplayError(f'turn {i}: needs a "user" text')
        bad = set(t) - TURN_KEYS
        if bad:
            raise ReplayError(f"turn {i}: unknown key(s): {', '.join(sorted(bad))}")
        _check_versions(i, t)
        t = dict(t)
        t["images"] = [str((base / p).resolve()) if not Path(p).is_absolute() else p for p in t.get("images", [])]
        turns.append(t)
    return sampling, settings, turns


def _check_versions(i: int, t: dict) -> None:
    edit, version = t.get("edit"), t.get("version")
    if edit is not None and (type(edit) is not int or edit < 0):
        raise ReplayError(f'turn {i}: "edit" is a user message\'s number, 0-based')
    if version is not None and not (
        isinstance(version, list)
        and len(version) == 2
        and all(type(x) is int for x in version)
        and version[0] >= 0
        and version[1] >= 1
    ):
        raise ReplayError(f'turn {i}: "version" is [user message (0-based), version (1-based)]')


def run_replay(
    script: Path, model_dir: str, data_dir: Path, out: TextIO, overrides: dict | None = None, remote=None
) -> int:
    """`remote` (a RemoteConfig): run the script against that server; `model_dir` is then the
    server's model name. `overrides`: engine settings from the command line (`--weights`), over
    the script's."""
    sampling, engine_settings, turns = parse_script(script)
    engine_settings.update(overrides or {})
    try:
        settings = EngineSettings().with_changes(engine_settings)
    except (TypeError, ValueError) as exc:
        raise ReplayError(str(exc)) from None

    def open_engine():
        if remote is not None:
            from ..remote import RemoteEngine

            eng = RemoteEngine(remote, settings, data_dir).start()
        else:
            from ..local.engine import Engine  # torch: only the built-in engine needs it

            eng = Engine(settings, data_dir).start()
        try:
            load_blocking(eng, model_dir)
        except EngineError as exc:
            eng.shutdown()
            raise ReplayError(str(exc)) from None
        return eng

    engine = open_engine()
    conversations: dict[str, VersionedChat] = {}
    systems: dict[str, str | None] = {}
    failures = 0
    stop_wait_s = 30.0  # how long shutting the engine down may take
    try:
        for i, t in enumerate(turns):
            if t.get("restart"):
                engine.shutdown()
                engine = open_engine()
            if t.get("wait_s"):
                time.sleep(float(t["wait_s"]))
            cid = str(t.get("conversation", "main"))
            chat = conversations.setdefault(cid, VersionedChat())
            if not chat.history() and t.get("system"):
                systems[cid] = t["system"]
            try:
                user = Message("user", t["user"], list(attach_all(t["images"]).refs))
                if t.get("version") is not None:
                    chat.switch(*t["version"])
                number = chat.edit(t["edit"], user) if t.get("edit") is not None else chat.send(user)
            except (PictureError, VersionError) as exc:
                failures += 1
                out.write(json.dumps({"turn": i, "conversation": cid, "error": str(exc)}) + "\n")
                out.flush()
                continue
            try:
                result = run_blocking(engine, Turn(cid, chat.history(), sampling, systems.get(cid)))
            except Interrupted as exc:  # Ctrl+C: the turn in progress is written with what it had
                out.write(
                    json.dumps(
                        {"turn": i, "conversation": cid, "error": "interrupted (Ctrl+C)", "partial": exc.partial}
                    )
                    + "\n"
                )
                out.flush()
                if remote is not None:  # a server that never answers is not waited for
                    stop_wait_s = 1.0
                raise
            if isinstance(result, TurnFailed):
                chat.failed()
                failures += 1
                line = {"turn": i, "conversation": cid, "error": result.message}
                if result.partial:  # a reply cut mid-stream: kept, as a stopped one is
                    line["partial"] = result.partial
            else:
                chat.answered(Message("assistant", result.reply))
                line = {
                    "turn": i,
                    "conversation": cid,
                    "reply": result.reply,
                    "reply_token_ids": result.token_ids,
                    "stats": result.stats.as_dict(),
                }
                if t.get("edit") is not None:  # which version the edit made, for a later "version" key
                    line["version"] = [number.message, number.version]
            out.write(json.dumps(line) + "\n")
            out.flush()
    finally:
        engine.shutdown(stop_wait_s)
    return 1 if failures else 0


def cmd_replay(args) -> int:
    from ..platform.terminal import terminal_safe
    from ..remote import RemoteConfigError

    try:
        remote = options.remote_config(args) if args.remote else None
        model = remote.model if remote else options.model_dir(args.model)
        overrides = {"weights": args.weights} if args.weights else {}
        return run_replay(
            Path(args.script), model, options.data_dir(args.data_dir), sys.stdout, remote=remote, overrides=overrides
        )
    except (ReplayError, RemoteConfigError) as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; the turn in progress is the last line, with its partial reply", file=sys.stderr)
        return 130
