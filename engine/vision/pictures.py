"""A picture's first trip to the model: decode and the processor's per-picture step."""

from __future__ import annotations

from pathlib import Path

from ..pictures.document import DEFAULT_DPI
from ..pictures.ref import PictureRef, PixelLimit
from ..pictures.span import PictureKey
from .entry import PictureEntry


def pixel_limit(loaded) -> PixelLimit:
    """The most of a picture this model's processor uses: a page is rendered (a frame scaled) to
    no more, since the processor would only shrink it. The Qwen2-VL family's size edges are pixel
    areas; the others' are sides."""
    size = getattr(loaded.processor.image_processor, "size", None)
    if size is None:
        return PixelLimit()

    def get(k: str):  # a SizeDict, or a plain dict in older processor configs
        return size.get(k) if isinstance(size, dict) else getattr(size, k, None)

    if loaded.family.mrope:
        return PixelLimit(max_pixels=get("longest_edge") or get("max_pixels"))
    return PixelLimit(longest_edge=get("longest_edge"), shortest_edge=get("shortest_edge"))


# A4 in inches: most documents' page (US Letter is within 6% of its area)
A4_INCHES = (8.27, 11.69)


def page_tokens(loaded, dpi: int = DEFAULT_DPI) -> int:
    """Tokens one A4 page rendered at `dpi` (within the processor's limit, as render_page does)
    expands to: what the window needs to choose how many of a PDF's pages fit the context.
    Measured with the processor's own per-picture step on a blank page of that size."""
    from PIL import Image

    w, h = (x * dpi for x in A4_INCHES)
    s = pixel_limit(loaded).scale_for(w, h)
    page = Image.new("RGB", (max(1, round(w * s)), max(1, round(h * s))), "white")
    _, replacement = preprocess(loaded, page)
    return replacement.count(loaded.processor.image_token)


def estimated_tokens(loaded, refs) -> list[int | None]:
    """Tokens each page or frame of `refs` will expand to, from its size alone (a page's from its
    page dictionary, a frame's from the container), nothing rendered or decoded: the context is
    checked before a turn draws 1,000 pages. None for other pictures (a plain picture, a clip).
    One processor step per distinct size."""
    from ..pictures.document import PageRef, page_sizes
    from ..pictures.file import MAX_PIXELS
    from ..pictures.pdfium_process import render_scale
    from ..pictures.video import FrameRef, video_size

    limit = pixel_limit(loaded)
    by_size: dict[tuple[int, int], int] = {}
    frame_sizes: dict[str, tuple[int, int]] = {}
    wanted: dict[str, list[int]] = {}
    for ref in refs:
        if isinstance(ref, PageRef):
            wanted.setdefault(ref.path, []).append(ref.index)
    # one call to the PDFium child per document
    points = {
        (path, i): size
        for path, pages in wanted.items()
        for i, size in zip(pages, page_sizes(path, pages, Path(path).name), strict=True)
    }
    out: list[int | None] = []
    for ref in refs:
        if isinstance(ref, PageRef):
            w_pt, h_pt = points[ref.path, ref.index]
            s = render_scale(w_pt, h_pt, ref.dpi, limit, MAX_PIXELS)
            size = (max(1, round(w_pt * s)), max(1, round(h_pt * s)))
        elif isinstance(ref, FrameRef):
            if ref.path not in frame_sizes:
                frame_sizes[ref.path] = video_size(ref.path, ref.label)
            w, h = frame_sizes[ref.path]
            s = limit.scale_for(w, h)
            size = (max(1, round(w * s)), max(1, round(h * s))) if s < 1 else (w, h)
        else:
            out.append(None)
            continue
        if size not in by_size:
            by_size[size] = _blank_tokens(loaded, size)
        out.append(by_size[size])
    return out


def _blank_tokens(loaded, size: tuple[int, int]) -> int:
    from PIL import Image

    _, replacement = preprocess(loaded, Image.new("RGB", size, "white"))
    return replacement.count(loaded.processor.image_token)


def preprocess(loaded, image) -> tuple[dict, str]:
    """One picture -> (model inputs for the encoder, placeholder replacement text).

    Uses the processor's own per-picture step so the expansion equals what the processor
    produces for the whole prompt.
    """
    images = [[image]] if loaded.family.nested_images else [image]
    # transformers' private per-picture step: no public call gives one picture's expansion
    processed, replacements = loaded.processor._process_images(images, **loaded.merged_kwargs["images_kwargs"])
    return dict(processed), replacements[0]


def prepare_clip(loaded, key: PictureKey, clip) -> PictureEntry:
    """A clip through the processor's video path (Qwen2-VL family): its frames as one video,
    sampled at the clip's rate (the positions of Qwen2.5-VL count its seconds)."""
    frames = clip.pictures(pixel_limit(loaded))
    n = len(frames)
    kwargs = dict(loaded.merged_kwargs.get("videos_kwargs", {}))
    # cap_pixels_per_frame: the per-frame pixel cap of the reference implementation (qwen-vl-utils),
    # which transformers 5.24 asks callers to choose (it warns on every clip otherwise)
    kwargs.update(
        return_tensors="pt",
        do_sample_frames=False,
        cap_pixels_per_frame=True,
        video_metadata=[{"fps": clip.fps, "total_num_frames": n, "frames_indices": list(range(n))}],
    )
    processed, replacements = loaded.processor._process_videos([frames], **kwargs)
    processed = dict(processed)
    seconds = processed.pop("second_per_grid_ts", None)
    processed.pop("video_metadata", None)
    grid = [int(x) for x in processed["video_grid_thw"][0].tolist()]
    return PictureEntry(
        key=key,
        replacement=replacements[0],
        n_tokens=replacements[0].count(loaded.processor.video_token),
        grid_thw=grid,
        encoder_inputs=processed,
        modality="video",
        second_per_grid=float(seconds[0]) if seconds is not None else None,
    )


def prepare_entry(loaded, key: PictureKey, ref: PictureRef) -> PictureEntry:
    """Read (a page: render, a frame: decode) + preprocess one picture into an entry that still
    needs encoding."""
    if ref.modality == "video":
        return prepare_clip(loaded, key, ref)
    image = ref.picture(pixel_limit(loaded))
    processed, replacement = preprocess(loaded, image)
    grid = processed.get("image_grid_thw")
    grid_thw = [int(x) for x in grid[0].tolist()] if grid is not None else None
    return PictureEntry(
        key=key,
        replacement=replacement,
        n_tokens=replacement.count(loaded.processor.image_token),
        grid_thw=grid_thw,
        encoder_inputs=processed,
    )
