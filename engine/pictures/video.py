"""Videos: frames sampled at a rate and count, each frame a picture (FrameRef), decoded with
PyAV one at a time (a seek to the nearest key frame, then forward to the timestamp), so memory
stays bounded whatever the clip's length.

A frame's digest is derived from the video's digest, its timestamp and the sampling settings,
so a cached frame needs neither the file nor a decode. A video is checked once where it comes in
(`Video.of_file`): one PictureError sentence for a file with no video stream, a codec this build
cannot decode, or a clip longer than MAX_SECONDS. Torch-free.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av

from .file import MAX_PIXELS, PictureError
from .ref import PictureRef, PixelLimit, captioned, check_file_digest, derived_digest, file_digest

FRAME_DOMAIN = b"parley.frame.v1\0"
CLIP_DOMAIN = b"parley.clip.v1\0"
MAX_SECONDS = 3 * 3600  # a frame every few minutes of a longer clip tells a model little
# Frames decoded to reach one sampled frame from the key frame before it: a clip with one key frame
# decodes from its start for every sample (a 3-hour 720p clip: 4 min 52 s for `ask`). 250 frames
# are 8 s of 30 fps video, under a second of decoding at 720p here.
MAX_DECODE_FRAMES = 250
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".ogv")


@dataclass(frozen=True)
class FrameSampling:
    """Frames per second, and the most frames taken (spread over the clip when it is longer)."""

    fps: float = 1.0
    max_frames: int = 16

    def __post_init__(self):
        if not (0.01 <= self.fps <= 30):
            raise ValueError(f"frames are sampled at 0.01 to 30 per second, not {self.fps!r}")
        if not (1 <= self.max_frames <= 512):
            raise ValueError(f"a clip gives 1 to 512 frames, not {self.max_frames!r}")

    def times(self, duration: float) -> list[float]:
        """Timestamps (seconds) of the sampled frames, in order."""
        n = max(1, int(duration * self.fps))
        if n <= self.max_frames:
            return [round(i / self.fps, 3) for i in range(n)]
        n = self.max_frames
        return [round(duration * (i + 0.5) / n, 3) for i in range(n)]


DEFAULT_SAMPLING = FrameSampling()


def clock(t: float) -> str:
    s = int(t)
    h, m = divmod(s // 60, 60)
    frac = f"{t - s:.1f}"[1:] if t != s else ""
    return (f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}") + frac


# FFmpeg's own pixel cap for every decoder Parley opens: probing a stream decodes its first frame
# at full size (a 280 KB mp4 of one 16000×16000 PNG frame took 1.3 s and 250 MB before any check
# of ours could run); with the cap the probe stops and the frame size reads as 0 (refused below).
_PIXEL_CAP = {"max_pixels": str(MAX_PIXELS)}


def _open(path: str, name: str):
    try:
        return av.open(path, options=_PIXEL_CAP)
    except av.error.InvalidDataError:
        raise PictureError(f"{name} is not a video Parley can read (damaged, or an unknown format)") from None
    except (av.error.FFmpegError, OSError) as exc:
        raise PictureError(f"{name} cannot be opened as a video ({exc})") from None


@dataclass(frozen=True)
class Video:
    """A checked video: where it is, its content digest, its length and picture size."""

    path: str
    digest: str
    duration: float  # seconds
    width: int
    height: int

    @property
    def name(self) -> str:
        return Path(self.path).name

    @classmethod
    def of_file(cls, path: str | Path, cancelled: Callable[[], bool] | None = None) -> Video:
        """Check a video where it comes in: a stream, a codec, a length and a frame size within
        the limits (read from the container, before any frame is decoded); `cancelled` stops the
        hashing of a large file."""
        path = str(path)
        name = Path(path).name
        if not Path(path).is_file():
            raise PictureError(f"{name} was not found" if not Path(path).exists() else f"{name} is not a file")
        with _open(path, name) as c:
            if not c.streams.video:
                raise PictureError(f"{name} has no video stream (sound only?)")
            s = c.streams.video[0]
            if s.codec_context is None:
                raise PictureError(f"{name} uses a video codec this build of Parley cannot decode")
            if s.duration is not None and s.time_base is not None:
                duration = float(s.duration * s.time_base)
            elif c.duration is not None:
                duration = c.duration / av.time_base
            else:
                raise PictureError(f"{name} does not say how long it is; Parley cannot sample its frames")
            if duration > MAX_SECONDS:
                raise PictureError(
                    f"{name} is {clock(duration)} long; Parley samples clips of at most "
                    f"{MAX_SECONDS // 3600} hours (cut the part you want to ask about)"
                )
            width, height = s.codec_context.width, s.codec_context.height
            check_frame_size(width, height, name)
        video = cls(path, file_digest(path, cancelled), duration, width, height)
        video.frame(0.0).picture()  # the first frame decodes: a codec that fails says so now
        return video

    def frame(self, t: float, sampling: FrameSampling = DEFAULT_SAMPLING, name: str = "") -> FrameRef:
        return FrameRef.of(self.path, self.digest, t, sampling, name)

    def frame_refs(self, sampling: FrameSampling = DEFAULT_SAMPLING, name: str = "") -> list[FrameRef]:
        """The sampled frames as pictures; `name`: what their captions call the file ("" : only the time)."""
        return [self.frame(t, sampling, name) for t in sampling.times(self.duration)]

    def check_reach(self, sampling: FrameSampling = DEFAULT_SAMPLING) -> None:
        """Refuse now a clip whose sampled frames lie too far past a key frame to decode (one seek
        and one packet read each, no decoding)."""
        with _open(self.path, self.name) as c:
            s = c.streams.video[0]
            rate = float(s.average_rate or s.guessed_rate or 30)
            for t in sampling.times(self.duration):
                if t <= 0 or s.time_base is None:
                    continue
                try:
                    c.seek(int(t / s.time_base), stream=s, backward=True, any_frame=False)
                    key = next((p for p in c.demux(s) if p.pts is not None), None)
                except av.error.FFmpegError:
                    continue  # decoding says so, with its own words
                if key is not None and (t - float(key.pts * s.time_base)) * rate > MAX_DECODE_FRAMES:
                    raise PictureError(_far_from_key(f"{self.name} at {clock(t)}"))


@dataclass(frozen=True)
class FrameRef(PictureRef):
    """The frame shown at `time` seconds into the video at `path`, sampled with `fps`/`max_frames`."""

    video: str = ""  # the video's digest
    time: float = 0.0
    fps: float = 1.0
    max_frames: int = 16

    @classmethod
    def of(
        cls, path: str, video: str, t: float, sampling: FrameSampling = DEFAULT_SAMPLING, name: str = ""
    ) -> FrameRef:
        t = round(float(t), 3)
        if t < 0:
            raise ValueError(f"not a timestamp: {t!r}")
        digest = derived_digest(FRAME_DOMAIN, video, f"{t:.3f}", sampling.fps, sampling.max_frames)
        return cls(path, digest, video, t, sampling.fps, sampling.max_frames, name=name)

    @property
    def label(self) -> str:
        return f"{self.file_name} at {clock(self.time)}"

    @property
    def clip_key(self) -> tuple:
        return (self.path, self.video, self.fps, self.max_frames)

    @property
    def caption(self) -> str:
        return captioned(self.name, f"frame at {clock(self.time)}")  # `name` only, as a page's (document.py)

    def picture(self, limit: PixelLimit | None = None):
        check_file_digest(self.path, self.video, Path(self.path).name)
        image = decode_frame(self.path, self.time, self.label)
        if limit is not None:
            s = limit.scale_for(*image.size)
            if s < 1:
                image = image.resize((max(1, round(image.width * s)), max(1, round(image.height * s))))
        return image

    def read_checked(self) -> bytes:
        buf = io.BytesIO()
        self.picture().save(buf, "PNG")
        return buf.getvalue()


def video_size(path: str, label: str) -> tuple[int, int]:
    """A video's frame size from its container (nothing decoded)."""
    with _open(path, label) as c:
        if not c.streams.video or c.streams.video[0].codec_context is None:
            raise PictureError(f"{label}: the file has no video stream Parley can decode")
        cc = c.streams.video[0].codec_context
        return cc.width, cc.height


def check_frame_size(width: int, height: int, name: str) -> None:
    """The picture budget every source gets (file.MAX_PIXELS), from the container's own numbers:
    a codec decodes a frame at full size, so a frame over it is refused before decoding."""
    if width * height > MAX_PIXELS:
        raise PictureError(
            f"{name} has frames of {width}×{height} pixels; the limit is {MAX_PIXELS // 1_000_000} megapixels"
        )
    if width <= 0 or height <= 0:  # also what a probe stopped by _PIXEL_CAP leaves
        raise PictureError(
            f"{name} does not say its frame size, or its frames are over "
            f"{MAX_PIXELS // 1_000_000} megapixels; Parley cannot decode it safely"
        )


def _far_from_key(label: str) -> str:
    return (
        f"{label} lies more than {MAX_DECODE_FRAMES} frames past a key frame, too far to decode "
        "(re-encode the clip with a key frame every few seconds)"
    )


def decode_frame(path: str, t: float, label: str):
    """The frame on screen at `t` seconds: one frame kept at a time, at most MAX_DECODE_FRAMES
    decoded from the key frame before it."""
    with _open(path, label) as c:
        s = c.streams.video[0]
        if s.codec_context is not None:
            check_frame_size(s.codec_context.width, s.codec_context.height, label)
            s.codec_context.options = dict(_PIXEL_CAP)  # a frame that grows past it fails to decode
        s.thread_type = "AUTO"
        decoded = 0
        try:
            if t > 0 and s.time_base is not None:
                c.seek(int(t / s.time_base), stream=s, backward=True, any_frame=False)
            last = None
            for frame in c.decode(s):
                decoded += 1
                if decoded > MAX_DECODE_FRAMES:
                    raise PictureError(_far_from_key(label))
                if frame.width * frame.height > MAX_PIXELS:  # a stream that grows mid-way
                    raise PictureError(
                        f"{label} is {frame.width}×{frame.height} pixels; the limit is "
                        f"{MAX_PIXELS // 1_000_000} megapixels"
                    )
                if last is not None and frame.time is not None and frame.time > t + 1e-6:
                    break
                last = frame
                if frame.time is not None and frame.time >= t - 1e-6:
                    break
        except av.error.FFmpegError as exc:
            raise PictureError(f"{label} cannot be decoded ({exc})") from None
        if last is None:
            raise PictureError(f"{label}: the video has no frame there")
        return last.to_image().convert("RGB")


@dataclass(frozen=True)
class ClipRef(PictureRef):
    """A run of frames of one video, given to a family with native video input (Qwen2-VL,
    Qwen2.5-VL) as one video: one span in the prompt, one cache entry, keyed from its frames'."""

    frames: tuple[FrameRef, ...] = ()

    @classmethod
    def of(cls, frames: list[FrameRef]) -> ClipRef:
        first = frames[0]
        digest = derived_digest(CLIP_DOMAIN, first.video, *(f.digest for f in frames))
        return cls(first.path, digest, tuple(frames), name=first.name)

    @property
    def modality(self) -> str:
        return "video"

    @property
    def fps(self) -> float:
        return self.frames[0].fps

    @property
    def members(self) -> tuple[PictureRef, ...]:
        return self.frames

    @property
    def label(self) -> str:
        return f"{self.file_name} ({len(self.frames)} frames)"

    @property
    def caption(self) -> str:
        return captioned(self.name, f"video from {clock(self.frames[0].time)} to {clock(self.frames[-1].time)}")

    def picture(self, limit: PixelLimit | None = None):
        raise TypeError("a clip is read with pictures()")

    def pictures(self, limit: PixelLimit | None = None) -> list:
        """Its frames' pixels, each decoded alone (one frame's decoder state at a time)."""
        return [f.picture(limit) for f in self.frames]

    def read_checked(self) -> bytes:
        raise TypeError("a clip is sent as its frames")


def as_clips(refs) -> list[PictureRef]:
    """Runs of frames of the same video and sampling -> one ClipRef each; other pictures as they are."""
    out: list[PictureRef] = []
    run: list = []
    for r in list(refs) + [None]:
        key = r.clip_key if r is not None else None
        if run and (key is None or key != run[0].clip_key):
            out.append(ClipRef.of(run))
            run = []
        if key is not None:
            run.append(r)
        elif r is not None:
            out.append(r)
    return out
