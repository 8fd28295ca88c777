"""Parley entry point: the window by default; `ask`, `replay`, `serve` and `models` headless
(engine/headless/, engine/library/cli.py), `export` from the history (app/history/export.py).
Here: the command line and which command runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from engine.headless.options import CommandError, data_dir, model_dir


def _add_weights(sub) -> None:
    from engine.protocol.settings import WEIGHT_FORMATS

    sub.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help="language-model weights: auto (default: full precision when it fits), bf16, fp16, "
        "fp32, int8, int4 (CPU) or 4bit (NF4, CUDA); the vision encoder stays full precision",
    )


# each command's module is imported only when it runs: the window starts without them
def cmd_ask(args) -> int:
    from engine.headless.ask import cmd_ask as run

    return run(args)


def cmd_replay(args) -> int:
    from engine.headless.replay import cmd_replay as run

    return run(args)


def cmd_serve(args) -> int:
    from engine.headless.serve import cmd_serve as run

    return run(args)


def cmd_export(args) -> int:
    from app.history.export import ExportError, chat_list, export_chat, find_chat, open_history

    try:
        history = open_history(data_dir(args.data_dir))
    except ExportError as e:
        raise CommandError(str(e)) from e
    try:
        if args.list or not args.chat:
            for line in chat_list(history):
                print(line)
            return 0
        if not args.to:
            raise CommandError("say where to write the export: --to FOLDER")
        done = export_chat(history, find_chat(history, args.chat).id, args.to)
    except ExportError as e:
        raise CommandError(str(e)) from e
    finally:
        history.close()
    pictures = f" and {done.pictures} pictures in {done.folder.name}/" if done.folder else ""
    print(f"wrote {done.markdown}, {done.json.name}{pictures}")
    for line in done.missing:
        print(f"not exported: {line}", file=sys.stderr)
    return 0


def cmd_window(args) -> int:
    from app.shell.display_check import problem

    why = problem()  # before Qt: no display, or X11 libraries missing -> what to install
    if why:
        print(why, file=sys.stderr)
        return 2
    from app import run_app

    rc = run_app(model_dir(args.model) if args.model else None, data_dir(args.data_dir))
    # Everything is saved and closed by now (history, settings, the engine stopped after its spills).
    # What is left is the interpreter tearing down torch, transformers and Qt: 1.8-2.9 s of a 1.9-3.1 s
    # quit with the window already gone (tests/bench/startup.py, shared 2-core Xeon); skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(rc)


def _add_remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        metavar="URL",
        help="use an OpenAI-compatible server (vLLM, transformers serve, another "
        "Parley) instead of the built-in engine; with or without /v1. "
        "--model then names the server's model",
    )
    p.add_argument(
        "--api-key",
        help="the server's API key; better: set PARLEY_REMOTE_API_KEY, which other users "
        "cannot read in `ps` as they can a command line",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley", description="Chat with a local vision-language model about pictures."
    )
    parser.add_argument(
        "--model", help="model folder or a Hub repo id in the HF cache (default: the built-in Parley Shapes demo model)"
    )
    parser.add_argument("--data-dir", help="keep history, caches and the KV store in this folder")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="check this installation (every module, the demo model on a picture, a PDF page and a "
        "video frame, the window offscreen) and exit: 0 when all passed, one line per check",
    )
    sub = parser.add_subparsers(dest="command")

    ask = sub.add_parser("ask", help="ask one question and print the reply")
    ask.add_argument("--model", default=argparse.SUPPRESS)
    ask.add_argument("--data-dir", default=argparse.SUPPRESS)
    ask.add_argument("--image", action="append", help="a picture, PDF or video to send (repeatable)")
    ask.add_argument("--file", action="append", help="the same as --image: a picture, PDF or video (repeatable)")
    ask.add_argument("--pages", help="which pages of a PDF to send, e.g. 1-3,6 (default: all)")
    ask.add_argument(
        "--dpi",
        type=int,
        default=144,
        help="render PDF pages at this resolution (within what the model's processor uses; default 144)",
    )
    ask.add_argument("--pdf-text", action="store_true", help="also send the text a PDF carries (few tokens)")
    ask.add_argument("--fps", type=float, default=1.0, help="video frames sampled per second (default 1)")
    ask.add_argument("--max-frames", type=int, default=16, help="at most this many frames of a video (default 16)")
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
    srv.add_argument(
        "--api-token",
        help="require 'Authorization: Bearer TOKEN' (needed to listen beyond loopback); "
        "better: set PARLEY_API_TOKEN, which other users cannot read in `ps` as "
        "they can a command line",
    )
    _add_weights(srv)
    srv.set_defaults(func=cmd_serve)

    exp = sub.add_parser("export", help="write a chat as Markdown (its pictures in a folder beside it) and JSON")
    exp.add_argument("--data-dir", default=argparse.SUPPRESS)
    exp.add_argument("chat", nargs="?", help="the chat's title or id (or the start of its id); none: list the chats")
    exp.add_argument("--to", metavar="FOLDER", help="the folder to write into (made when missing)")
    exp.add_argument("--list", action="store_true", help="list the chats (id, last change, title) and exit")
    exp.set_defaults(func=cmd_export)

    from engine.library.cli import add_parser as add_models_parser

    add_models_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Apple GPU: an op MPS lacks runs on the CPU instead of failing the turn (read when torch loads)
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    try:
        if args.self_check:
            from app.shell.self_check import run as self_check

            return self_check()
        if args.command is None:
            return cmd_window(args)
        return args.func(args)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    import multiprocessing

    multiprocessing.freeze_support()  # a bundled app's PDFium child (engine/pictures/pdfium_process.py) starts here
    sys.exit(main())
