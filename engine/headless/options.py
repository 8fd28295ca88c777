"""What the command line's shared options mean, for every command (the window's too): --data-dir,
--model (a folder or a Hub repo id in the HF cache), --remote/--api-key/--model and --weights."""

from __future__ import annotations

import os
from pathlib import Path

from ..platform.paths import DEMO_MODEL


def data_dir(arg: str | None) -> Path:
    from ..platform.paths import default_data_dir

    return Path(arg).expanduser().resolve() if arg else default_data_dir()


class CommandError(Exception):
    """A command cannot start as asked; main() prints the one line and exits 1."""


def model_dir(arg: str | None) -> str:
    """A folder, or a Hub repo id (ORG/NAME) already in the HF cache, resolved offline. A repo
    whose download did not finish is refused here (CommandError), before any engine starts."""
    if not arg:
        return str(DEMO_MODEL)
    from ..library.installed import partial_download, resolve_model

    snapshot = resolve_model(arg)
    if snapshot is None and (why := partial_download(arg)):
        raise CommandError(why)
    return str(snapshot) if snapshot else str(Path(arg).expanduser())


def remote_config(args):
    """--remote URL [--api-key K] --model NAME: the server to use instead of the built-in engine."""
    from ..remote import RemoteConfig

    key = args.api_key or os.environ.get("PARLEY_REMOTE_API_KEY") or ""
    return RemoteConfig.make(args.remote, getattr(args, "model", None) or "", key)


def engine_settings(args):
    from ..protocol.settings import EngineSettings

    return EngineSettings(weights=args.weights or "auto")


def attach_choice(args):
    """--pages/--dpi/--pdf-text/--fps/--max-frames: how `ask` turns PDFs and videos into pictures
    (ValueError with one sentence for a value out of range)."""
    from ..pictures.attach import AttachChoice
    from ..pictures.video import FrameSampling

    return AttachChoice(
        pages=args.pages,
        dpi=args.dpi,
        document_text=args.pdf_text,
        sampling=FrameSampling(fps=args.fps, max_frames=args.max_frames),
    )
