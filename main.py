"""Parley entry point: the window by default; `ask`, `replay` and `serve` headless."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from engine.platform.paths import DEMO_MODEL


def _data_dir(arg: str | None) -> Path:
    from engine.platform.paths import default_data_dir

    return Path(arg).expanduser().resolve() if arg else default_data_dir()


def _model_dir(arg: str | None) -> str:
    """A folder, or a Hub repo id (ORG/NAME) already in the HF cache, resolved offline."""
    if not arg:
        return str(DEMO_MODEL)
    from engine.library.installed import resolve_model

    snapshot = resolve_model(arg)
    return str(snapshot) if snapshot else str(Path(arg).expanduser())


def _remote_config(args):
    """--remote URL [--api-key K] --model NAME: the server to use instead of the built-in engine."""
    from engine.remote import RemoteConfig

    key = args.api_key or os.environ.get("PARLEY_REMOTE_API_KEY") or ""
    return RemoteConfig.make(args.remote, getattr(args, "model", None) or "", key)


def _settings(args):
    from engine.protocol.settings import EngineSettings

    return EngineSettings(weights=args.weights or "auto")


def _add_weights(sub) -> None:
    from engine.protocol.settings import WEIGHT_FORMATS

    sub.add_argument("--weights", choices=WEIGHT_FORMATS, help="language-model weights: auto (default: full precision "
                     "when it fits), bf16, fp16, fp32, int8 or 4bit; the vision encoder stays full precision")


def cmd_ask(args) -> int:
    from engine.protocol.client import EngineError, load_blocking, run_blocking
    from engine.protocol.events import Message, Sampling, Turn, TurnFailed
    from engine.pictures.file import PictureError
    from engine.pictures.ref import as_refs
    from engine.remote import RemoteConfigError, RemoteEngine

    try:
        images = as_refs(args.image or [])  # each file hashed once, here, before any model loads
    except PictureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        remote = _remote_config(args) if args.remote else None
    except RemoteConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if remote is not None:
        engine = RemoteEngine(remote, data_dir=_data_dir(args.data_dir)).start()
    else:
        from engine.local.engine import Engine  # torch: only the built-in engine needs it

        engine = Engine(_settings(args), _data_dir(args.data_dir)).start()
    try:
        load_blocking(engine, remote.model if remote else _model_dir(args.model))
        sampling = Sampling(greedy=args.temperature <= 0, temperature=max(args.temperature, 1e-6),
                            top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
        turn = Turn("ask", [Message("user", args.prompt, images)], sampling, args.system)
        streamed = []

        def on_token(ev):
            streamed.append(ev.text)
            sys.stdout.write(ev.text)
            sys.stdout.flush()

        result = run_blocking(engine, turn, on_token=on_token)
        if isinstance(result, TurnFailed):
            print(f"error: {result.message}", file=sys.stderr)
            return 1
        sys.stdout.write("\n")
        return 0
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.shutdown()


def cmd_replay(args) -> int:
    from engine.remote import RemoteConfigError
    from engine.headless.replay import ReplayError, run_replay

    try:
        remote = _remote_config(args) if args.remote else None
        model = remote.model if remote else _model_dir(args.model)
        overrides = {"weights": args.weights} if args.weights else {}
        return run_replay(Path(args.script), model, _data_dir(args.data_dir), sys.stdout, remote=remote,
                          overrides=overrides)
    except (ReplayError, RemoteConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def cmd_serve(args) -> int:
    import signal
    import threading

    from engine.api import ApiConfigError, ApiServer, check_bind

    token = args.api_token or os.environ.get("PARLEY_API_TOKEN") or None
    try:
        check_bind(args.host, token)  # refuse before anything is loaded
    except ApiConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from engine.protocol.client import EngineError, load_blocking
    from engine.local.engine import Engine

    engine = Engine(_settings(args), _data_dir(args.data_dir)).start()
    server = None
    try:
        server = ApiServer(engine, args.host, args.port, token=token, data_dir=engine.data_dir)
        ready = load_blocking(engine, _model_dir(args.model))
        server.start()
        print(f"Parley API listening on {server.url} (model {ready.name}); Ctrl+C stops it", flush=True)
        done = threading.Event()
        # Ctrl+C and kill both stop it, also where SIGINT came in ignored (nohup, a background
        # job of a script): Python then never turns it into KeyboardInterrupt
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, lambda *_: done.set())
        while not done.wait(0.5):
            pass
        return 0
    except (ApiConfigError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while the model was loading
        return 130
    finally:
        if server is not None:
            server.stop()
        engine.shutdown()


def cmd_window(args) -> int:
    from app.display_check import problem

    why = problem()  # before Qt: no display, or X11 libraries missing -> what to install
    if why:
        print(why, file=sys.stderr)
        return 2
    from app import run_app

    return run_app(_model_dir(args.model) if args.model else None, _data_dir(args.data_dir))


def _add_remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", metavar="URL", help="use an OpenAI-compatible server (vLLM, transformers serve, another "
                                                   "Parley) instead of the built-in engine; with or without /v1. "
                                                   "--model then names the server's model")
    p.add_argument("--api-key", help="the server's API key (or set PARLEY_REMOTE_API_KEY)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="Chat with a local vision-language model about pictures.")
    parser.add_argument("--model", help="model folder or a Hub repo id in the HF cache "
                                         "(default: the built-in Parley Shapes demo model)")
    parser.add_argument("--data-dir", help="keep history, caches and the KV store in this folder")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command")

    ask = sub.add_parser("ask", help="ask one question and print the reply")
    ask.add_argument("--model", default=argparse.SUPPRESS)
    ask.add_argument("--data-dir", default=argparse.SUPPRESS)
    ask.add_argument("--image", action="append", help="a picture to send (repeatable)")
    ask.add_argument("--system", help="system prompt")
    ask.add_argument("--max-new-tokens", type=int, default=256)
    ask.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ask.add_argument("--top-p", type=float, default=0.9)
    ask.add_argument("--seed", type=int)
    _add_weights(ask)
    ask.add_argument("prompt")
    _add_remote_options(ask)
    ask.set_defaults(func=cmd_ask)

    rep = sub.add_parser("replay", help="run a scripted conversation; one JSON line per turn")
    rep.add_argument("--model", default=argparse.SUPPRESS)
    rep.add_argument("--data-dir", default=argparse.SUPPRESS)
    _add_weights(rep)
    rep.add_argument("script")
    _add_remote_options(rep)
    rep.set_defaults(func=cmd_replay)

    srv = sub.add_parser("serve", help="serve an OpenAI-compatible API (/v1/chat/completions) on this machine")
    srv.add_argument("--model", default=argparse.SUPPRESS)
    srv.add_argument("--data-dir", default=argparse.SUPPRESS)
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    srv.add_argument("--port", type=int, default=8011, help="port (default 8011; 0 = any free port)")
    srv.add_argument("--api-token", help="require 'Authorization: Bearer TOKEN' (needed to listen beyond loopback; "
                                         "or set PARLEY_API_TOKEN)")
    _add_weights(srv)
    srv.set_defaults(func=cmd_serve)

    from engine.library.cli import add_parser as add_models_parser

    add_models_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Apple GPU: an op MPS lacks runs on the CPU instead of failing the turn (read when torch loads)
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    if args.command is None:
        return cmd_window(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
