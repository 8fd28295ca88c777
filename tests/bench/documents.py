"""Documents and video through the gate at the published Qwen2-VL-2B shape (bf16 on CPU),
measured side by side in one run (the machine may be shared: read the ratios).

- a 20-page PDF: the first question encodes its pages; a second question in a new conversation,
  the encoder unloaded: its time to first token ÷ a text-only turn's of the same prompt length
  (goal ≤ 1.05 with 0 encoder loads);
- the same for a 60-frame clip (one video through the processor's video path);
- pages rendered per second and pages encoded per second;
- peak memory while a 1 GB video is checked (hashed) and its frames decoded, above what the
  process held before (goal < 300 MB).

    python tests/bench/documents.py [--pages 20] [--frames 60] [--video-mb 1024] [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time

from _common import parse_args, precision, ratio_line, same_length_text, workdir

from engine.pictures.attach import attach
from engine.pictures.video import FrameSampling
from engine.protocol.events import Message
from engine.vision.pictures import pixel_limit
from tests.fixtures.documents import make_pdf, make_video
from tests.fixtures.published_configs import build_published, spec_for
from tests.helpers.engine_helpers import ask, expect_done, open_engine

SHAPE = "Qwen2-VL-2B-Instruct"
QUICK = {"layers": 2, "vision_layers": 2, "vocab_size": 4096}
NEW = 8


def first_token_s(engine, cid, messages):
    done = expect_done(ask(engine, cid, messages, NEW))
    return done.stats.first_token_s, done.stats


def cached_vs_text(engine, question: str, pictures: list, what: str) -> tuple[str, dict]:
    """First turn (encodes), then the same question in a new conversation with the encoder away,
    against a text-only turn of the same prompt length."""
    engine.unload_encoder()
    _, first = first_token_s(engine, f"{what}-first", [Message("user", question, pictures)])
    engine.unload_encoder()
    t_cached, s = first_token_s(engine, f"{what}-again", [Message("user", question, pictures)])
    text, n = same_length_text(engine.loaded.processor, s.prompt_tokens, question)
    t_text, _ = first_token_s(engine, f"{what}-text", [Message("user", text)])
    print(
        f"{what}: prefill {s.prefill_s:.2f} s of {s.prefill_tokens} tokens, restore {s.restore_s:.2f} s, "
        f"first token {s.first_token_s:.2f} s; hits {s.image_cache_hits}"
    )
    line = ratio_line(
        f"{what}: second question's time to first token / text-only turn's",
        t_cached / t_text,
        at_most=1.05,
        also=("0 encoder loads", s.encoder_loads == 0 and s.pictures_encoded == 0),
    )
    return line, {"first": first, "cached_s": t_cached, "text_s": t_text, "prompt": s.prompt_tokens, "text_len": n}


def peak_rss_above(work) -> float:
    """MB the process's resident memory rose above its level before `work()` at most (sampled)."""
    import psutil

    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        work()
    finally:
        done.set()
        t.join()
    return (peak - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument(
        "--dpi",
        type=int,
        default=72,
        help="page resolution (72: a US Letter page is ~620 tokens, so 20 pages fit the 32k context)",
    )
    ap.add_argument("--video-mb", type=int, default=1024, help="size of the video read for the memory figure")
    args = parse_args(ap, quick={"pages": 3, "frames": 4, "video_mb": 8, "dpi": 36})
    reduce = QUICK if args.quick else {}
    spec_for(SHAPE, **reduce)
    model_dir = build_published(SHAPE, **reduce)
    d = workdir("documents")
    pdf = attach(make_pdf(d / "doc.pdf", args.pages, size=(612, 792)))  # US Letter pages
    clip = attach(make_video(d / "clip.mp4", seconds=args.frames / 2, fps=4, size=(448, 336)))
    pages = pdf.refs(dpi=args.dpi)
    frames = clip.refs(sampling=FrameSampling(fps=2, max_frames=args.frames))

    engine = open_engine(model_dir, d / "data", **precision(args.quick), elastic=True, elastic_idle_s=86400)
    try:
        first_token_s(engine, "warm-up", [Message("user", "Hello there.")])  # one-time kernel set-up
        limit = pixel_limit(engine.loaded)
        t0 = time.perf_counter()
        sizes = [p.picture(limit).size for p in pages]
        render_s = time.perf_counter() - t0
        pdf_line, pdf_fig = cached_vs_text(engine, "What do these pages say?", pages, f"{args.pages}-page PDF")
        clip_line, clip_fig = cached_vs_text(engine, "What happens in this clip?", frames, f"{len(frames)}-frame clip")
    finally:
        engine.shutdown()

    big = make_video(d / "big.mp4", seconds=1, fps=1, size=(64, 48))
    _grow_to(big, args.video_mb)

    def read_big():
        v = attach(big).video
        for f in v.frame_refs(FrameSampling(fps=1, max_frames=args.frames)):
            f.picture(limit)

    rss_mb = peak_rss_above(read_big)
    first = pdf_fig["first"]
    print(
        f"shape {SHAPE}{' (quick: ' + str(reduce) + ')' if reduce else ''}, bf16 on CPU; pages rendered at "
        f"{sizes[0][0]}x{sizes[0][1]} ({args.dpi} dpi, within the processor's limit); {NEW} new tokens; one run each"
    )
    print(
        f"PDF prompt {pdf_fig['prompt']} tokens (text-only {pdf_fig['text_len']}): second question "
        f"{pdf_fig['cached_s']:.2f} s to first token, text-only {pdf_fig['text_s']:.2f} s"
    )
    print(
        f"clip prompt {clip_fig['prompt']} tokens (text-only {clip_fig['text_len']}): second question "
        f"{clip_fig['cached_s']:.2f} s to first token, text-only {clip_fig['text_s']:.2f} s"
    )
    print(pdf_line)
    print(clip_line)
    print(ratio_line("pages rendered per second", len(pages) / render_s, digits=1, note="PDFium, one thread"))
    print(
        ratio_line(
            "pages encoded per second",
            first.pictures_encoded / max(first.encode_s, 1e-9),
            digits=2,
            note="the first question's encode",
        )
    )
    print(ratio_line(f"peak memory reading a {args.video_mb} MB video", rss_mb, at_most=300, unit="MB", digits=0))


def _grow_to(path, mb: int) -> None:
    """A real video of about `mb` megabytes: noise frames at full quality compress poorly."""
    from fractions import Fraction

    import av
    import numpy as np

    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        s = out.add_stream("mpeg4", rate=10)
        s.width, s.height = 1280, 720
        s.pix_fmt = "yuv420p"
        s.bit_rate = 400_000_000
        s.options = {"qscale": "1"}
        s.time_base = Fraction(1, 10)
        written, i = 0, 0
        while written < mb << 20:
            img = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for p in s.encode(frame):
                written += p.size
                out.mux(p)
            i += 1
        for p in s.encode():
            out.mux(p)


if __name__ == "__main__":
    main()
