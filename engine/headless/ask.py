"""`main.py ask`: one question (with pictures) to the built-in engine or a remote server; the reply
streams to stdout, a failure is one line on stderr."""

from __future__ import annotations

import sys

from . import options


def cmd_ask(args) -> int:
    from ..pictures.attach import attach_all
    from ..pictures.file import PictureError
    from ..platform.terminal import terminal_safe
    from ..protocol.client import EngineError, load_blocking, run_blocking
    from ..protocol.events import Message, Sampling, Turn, TurnFailed
    from ..remote import RemoteConfigError, RemoteEngine

    try:  # each file checked and hashed once, here, before any model loads
        files = attach_all((args.image or []) + (args.file or []), options.attach_choice(args))
    except (PictureError, ValueError) as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    try:
        remote = options.remote_config(args) if args.remote else None
    except RemoteConfigError as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    model = remote.model if remote else options.model_dir(args.model)
    if remote is not None:
        engine = RemoteEngine(remote, data_dir=options.data_dir(args.data_dir)).start()
    else:
        from ..local.engine import Engine  # torch: only the built-in engine needs it

        engine = Engine(options.engine_settings(args), options.data_dir(args.data_dir)).start()
    streamed = []
    stop_wait_s = 30.0  # how long shutting the engine down may take
    try:
        load_blocking(engine, model)
        sampling = Sampling(
            greedy=args.temperature <= 0,
            temperature=max(args.temperature, 1e-6),
            top_p=args.top_p,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        )
        text = f"{files.text}\n\n{args.prompt}" if files.text else args.prompt
        turn = Turn("ask", [Message("user", text, list(files.refs))], sampling, args.system)

        def on_token(ev):
            streamed.append(ev.text)
            sys.stdout.write(terminal_safe(ev.text))  # a reply's escape codes must not act on the terminal
            sys.stdout.flush()

        result = run_blocking(engine, turn, on_token=on_token)
        if isinstance(result, TurnFailed):
            print(f"error: {terminal_safe(result.message)}", file=sys.stderr)
            return 1
        sys.stdout.write("\n")
        return 0
    except EngineError as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl+C: what was printed stays; one line says why it ends there
        if streamed:
            sys.stdout.write("\n")
            sys.stdout.flush()
        print("error: interrupted" + ("; the partial reply is above" if streamed else ""), file=sys.stderr)
        if remote is not None:  # a server that never answers is not waited for
            stop_wait_s = 1.0
        return 130
    finally:
        engine.shutdown(stop_wait_s)
