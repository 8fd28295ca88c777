"""`main.py serve`: the OpenAI-compatible API over the built-in engine until Ctrl+C or kill; a
host beyond loopback without a token is refused before anything loads."""

from __future__ import annotations

import os
import sys

from . import options


def cmd_serve(args) -> int:
    import signal
    import threading

    from ..api import ApiConfigError, ApiServer, check_bind

    token = args.api_token or os.environ.get("PARLEY_API_TOKEN") or None
    try:
        check_bind(args.host, token)  # refuse before anything is loaded
    except ApiConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ..local.engine import Engine
    from ..protocol.client import EngineError, load_blocking

    model = options.model_dir(args.model)
    engine = Engine(options.engine_settings(args), options.data_dir(args.data_dir)).start()
    server = None
    try:
        server = ApiServer(engine, args.host, args.port, token=token, data_dir=engine.data_dir)
        ready = load_blocking(engine, model)
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
