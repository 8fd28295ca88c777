"""`main.py ask`: one question (with pictures) to the built-in engine or a remote server; the reply
streams to stdout, a failure is one line on stderr."""
from __future__ import annotations

import sys

from . import options


def cmd_ask(args) -> int:
    from ..pictures.file import PictureError
    from ..pictures.ref import as_refs
    from ..protocol.client import EngineError, load_blocking, run_blocking
    from ..protocol.events import Message, Sampling, Turn, TurnFailed
    from ..remote import RemoteConfigError, RemoteEngine

    try:
        images = as_refs(args.image or [])  # each file hashed once, here, before any model loads
    except PictureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        remote = options.remote_config(args) if args.remote else None
    except RemoteConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = remote.model if remote else options.model_dir(args.model)
    if remote is not None:
        engine = RemoteEngine(remote, data_dir=options.data_dir(args.data_dir)).start()
    else:
        from ..local.engine import Engine  # torch: only the built-in engine needs it

        engine = Engine(options.engine_settings(args), options.data_dir(args.data_dir)).start()
    try:
        load_blocking(engine, model)
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
