"""`python main.py models list | pull ORG/NAME [--revision REV] | rm ORG/NAME` (headless)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..platform.terminal import terminal_safe
from .catalog import load_catalog
from .hub import LibraryError, NetworkUnreachable, is_repo_id, offline_forced
from .hub_values import HubValueError, revision


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def cmd_list(args) -> int:
    from ..model.speed import describe
    from ..platform.paths import default_data_dir
    from .fit import estimate_fit, estimate_fit_from_catalog, free_device_memory
    from .installed import installed_models
    from .remote import remote_config

    data_dir = Path(args.data_dir).expanduser() if getattr(args, "data_dir", None) else default_data_dir()
    device = free_device_memory()
    installed = {m.repo_id: m for m in installed_models()}
    print(
        f"device: {device[0]}, {device[1] / (1 << 30):.2f} GiB free; precision {args.precision}, "
        f"context {args.context} tokens"
    )
    offline = offline_forced()
    catalog = {e.repo_id: e for e in load_catalog()}
    rows = [
        (e.repo_id, e.family, e.params, f"~{e.download_gb:.2f} GB" if e.approx else _gb(int(e.download_gb * 1e9)))
        for e in catalog.values()
    ]
    rows += [(r, m.model_type or "?", "", _gb(m.size_on_disk)) for r, m in installed.items() if r not in catalog]
    print(f"{'MODEL':44} {'FAMILY':11} {'PARAMS':>6} {'DOWNLOAD':>10} {'INSTALLED':9} FIT")
    if offline:
        print("network unreachable: offline mode is on (HF_HUB_OFFLINE); catalog models are sized from the catalog")
    for repo_id, family, params, size in rows:
        mark = (
            "installed"
            if repo_id in installed and installed[repo_id].complete
            else ("partial" if repo_id in installed else "")
        )
        fit = ""
        try:
            config = remote_config(repo_id, installed.get(repo_id), offline=offline)
            if config is not None:
                fit = estimate_fit(config, args.precision, args.context, device).line()
                here = describe(data_dir, config)
                fit += f"; here {here}" if here else ""
        except NetworkUnreachable as exc:
            if not offline:
                print(f"{terminal_safe(exc)}; catalog models are sized from the catalog")  # said once
                offline = True
        except (LibraryError, ValueError) as exc:
            fit = f"fit unknown: {terminal_safe(exc)}"
        if not fit and offline and repo_id in catalog:
            try:
                fit = estimate_fit_from_catalog(catalog[repo_id], args.precision, args.context, device).line()
            except ValueError as exc:
                fit = f"fit unknown: {exc}"
        print(terminal_safe(f"{repo_id:44} {family:11} {params:>6} {size:>10} {mark:9} {fit}".rstrip()))
    return 0


def cmd_pull(args) -> int:
    from .progress import TqdmProgress
    from .pull import plan_pull, pull
    from .token_store import load_token

    if not is_repo_id(args.repo):
        print(f"error: {args.repo!r} is not a repo id (ORG/NAME)", file=sys.stderr)
        return 2
    try:
        revision(args.revision)
    except HubValueError as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    bar = None
    try:
        plan = plan_pull(args.repo, args.revision, load_token())
        if plan.problem:
            print(f"error: {args.repo} cannot be used by Parley: {terminal_safe(plan.problem)}", file=sys.stderr)
            return 1
        bar = TqdmProgress(args.repo)
        snapshot = pull(plan, bar)
        bar.close()
        bar = None
        print(f"{args.repo}: complete and verified, {_gb(plan.total_bytes)} in {snapshot}", file=sys.stderr)
        print(snapshot)
        return 0
    except LibraryError as exc:
        if bar is not None:
            bar.close()
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"error: interrupted; run the same pull again to resume {args.repo}", file=sys.stderr)
        return 130


def cmd_rm(args) -> int:
    from .installed import delete_model

    try:
        freed = delete_model(args.repo)
    except LibraryError as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    print(f"removed {args.repo}: {_gb(freed)} freed")
    return 0


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list, download (pull) or remove models from the Hugging Face Hub")
    msub = models.add_subparsers(dest="models_command", required=True)
    ls = msub.add_parser("list", help="the catalog and installed models, with whether each fits")
    ls.add_argument(
        "--precision", default="bfloat16", choices=["float32", "bfloat16", "float16", "int8", "int4", "4bit"]
    )
    ls.add_argument("--context", type=int, default=4096, help="context length for the KV cache estimate")
    ls.add_argument(
        "--data-dir", default=None, help="the data folder whose measured speeds are shown (default: the app's)"
    )
    ls.set_defaults(func=cmd_list)
    pl = msub.add_parser("pull", help="download ORG/NAME into the Hugging Face cache (resumable)")
    pl.add_argument("repo")
    pl.add_argument("--revision", default="main")
    pl.set_defaults(func=cmd_pull)
    rm = msub.add_parser("rm", help="delete ORG/NAME from the Hugging Face cache")
    rm.add_argument("repo")
    rm.set_defaults(func=cmd_rm)
