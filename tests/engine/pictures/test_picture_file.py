"""Pictures as the model sees them: upright as a viewer shows them (EXIF orientation), and
oversized files refused as "too large" in one sentence, with nothing else on stderr."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from engine.pictures.file import PictureError, check, decode
from engine.protocol.events import Message
from engine.vision.entry import picture_key
from tests.fixtures.pictures import pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

ROOT = Path(__file__).resolve().parents[3]
EXIF_ORIENTATION = 0x0112


def upright_picture() -> Image.Image:
    """Flat colours in 8-pixel-aligned blocks: JPEG at quality 100 without chroma subsampling
    keeps them exactly, rotated or not, so rotated and upright files decode to equal pixels.
    No symmetry: a square in one corner only, a bar along one edge."""
    img = Image.new("RGB", (64, 48), (40, 40, 200))
    img.paste((250, 250, 250), (0, 0, 16, 16))  # top-left square
    img.paste((220, 30, 30), (0, 40, 64, 48))  # bottom bar
    img.paste((30, 200, 60), (48, 8, 64, 32))  # right-hand block
    return img


def jpeg_bytes(img: Image.Image, orientation: int | None = None) -> bytes:
    buf = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION] = orientation
    img.save(buf, "JPEG", quality=100, subsampling=0, exif=exif.tobytes())
    return buf.getvalue()


def rotated_jpeg(upright: Image.Image) -> bytes:
    """What a phone writes: pixels stored turned 90° counter-clockwise, Orientation 6 says
    'turn clockwise to show'."""
    return jpeg_bytes(upright.transpose(Image.Transpose.ROTATE_90), orientation=6)


def test_exif_orientation_is_applied_to_decoded_pixels():
    upright = upright_picture()
    rotated = rotated_jpeg(upright)
    raw = Image.open(io.BytesIO(rotated)).convert("RGB")
    assert raw.size == (48, 64)  # stored sideways: without the tag applied the model sees this
    shown = decode(rotated, "rotated.jpg")
    assert shown.size == (64, 48)
    assert shown.tobytes() == decode(jpeg_bytes(upright), "upright.jpg").tobytes()
    assert shown.tobytes() == ImageOps.exif_transpose(Image.open(io.BytesIO(rotated))).convert("RGB").tobytes()


@pytest.mark.slow
def test_rotated_jpeg_gets_the_features_and_reply_of_the_upright_one(tiny_model, tmp_path):
    upright, rotated = tmp_path / "upright.jpg", tmp_path / "rotated.jpg"
    upright.write_bytes(jpeg_bytes(upright_picture()))
    rotated.write_bytes(rotated_jpeg(upright_picture()))
    engine = open_engine(tiny_model("llava"), tmp_path / "d")
    try:
        a = expect_done(ask(engine, "a", [Message("user", "Where is the square?", pics(upright))], 8))
        b = expect_done(ask(engine, "b", [Message("user", "Where is the square?", pics(rotated))], 8))
        assert a.stats.pictures_encoded == 1 and b.stats.pictures_encoded == 1  # two keys
        gate = engine.gate
        fa = gate.ram.get(picture_key(pics(upright)[0].digest, gate.identity)).features
        fb = gate.ram.get(picture_key(pics(rotated)[0].digest, gate.identity)).features
        assert fa.shape == fb.shape and bool((fa == fb).all())
        assert b.token_ids == a.token_ids
    finally:
        engine.shutdown()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims a size; no pixel data is allocated or stored."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("width,height", [(20_000, 20_000), (10_000, 10_000)])
def test_huge_picture_is_too_large_not_unknown(width, height):
    with pytest.raises(PictureError) as err:
        check(png_header(width, height), "huge.png")
    message = str(err.value)
    assert message.startswith("huge.png is too large") and "64 megapixels" in message


def test_huge_picture_prints_nothing_but_its_sentence(tmp_path):
    """PIL warns between ~89 and ~178 MP and raises beyond: neither reaches stderr."""
    for w, h in [(10_000, 10_000), (20_000, 20_000)]:
        (tmp_path / f"{w}.png").write_bytes(png_header(w, h))
    code = (
        "import sys; from engine.pictures.file import PictureError, check\n"
        "for p in sys.argv[1:]:\n"
        "    try: check(open(p, 'rb').read(), 'huge.png')\n"
        "    except PictureError as e: print(e)\n"
    )
    files = [str(tmp_path / "10000.png"), str(tmp_path / "20000.png")]
    out = subprocess.run([sys.executable, "-c", code, *files], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("huge.png is too large") for line in lines)
