"""Pictures "Parley Shapes" should not describe: photo-like and screenshot-like ones.

A person will paste a photo or a screenshot into the demo model; it should say, in one line, that
it only knows simple shapes, rather than invent some. These are the training pictures for that:
"photo": smooth random colour fields at several scales with shading and grain (the statistics
of natural images, no flat shapes); "screen": lines of text, bars and panels like a window.
Seeded from the caller's rng (numpy's generator seeded from it), so the same seed gives the same
pixels. shapes_drawn.py draws the evaluation ones another way.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from shapes_scene import Scene

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
TRAIN_FONTS = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansCondensed.ttf"]
WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which she "
    "do how their if will up other about out many then them these so some her would make like "
    "file edit view help settings open save cancel ok search home news login account profile "
    "message send reply inbox today yesterday price total order report chart data"
).split()


def random_unknown(rng: random.Random) -> Scene:
    side = rng.randint(96, 720)
    aspect = rng.choice([1.0, 4 / 3, 16 / 9, 3 / 4, rng.uniform(0.5, 2.0)])
    return Scene(
        [], ["white"], size=(max(48, round(side * aspect)), side), unknown=rng.choice(["photo", "photo", "screen"])
    )


def font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype(str(FONT_DIR / name), size)
    except OSError:  # no DejaVu on this system: Pillow's own font, at the size asked
        return ImageFont.load_default(size)


def render(scene: Scene, rng: random.Random) -> Image.Image:
    w, h = scene.pixels()
    g = np.random.default_rng(rng.getrandbits(32))
    img = photo(g, w, h) if scene.unknown == "photo" else screen(rng, w, h)
    if rng.random() < 0.5:
        import io

        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=rng.randint(30, 95))
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img


def photo(g: np.random.Generator, w: int, h: int) -> Image.Image:
    """Colour noise summed over octaves (more power at coarse scales), shading and grain: no flat shapes."""
    acc = np.zeros((h, w, 3), np.float32)
    for octave in range(5):
        cells = 2 ** (octave + 1)
        small = g.normal(0, 1, (cells, cells, 3)).astype(np.float32)
        layer = np.stack(
            [np.asarray(Image.fromarray(small[..., c]).resize((w, h), Image.Resampling.BICUBIC)) for c in range(3)], -1
        )
        acc += layer * (0.7**octave)
    base = g.uniform(40, 200, 3).astype(np.float32)
    corr = g.uniform(0.3, 1.0)  # channels move together (brightness) more than apart (hue)
    grey = acc.mean(-1, keepdims=True)
    img = base + 40 * (corr * grey + (1 - corr) * acc)
    # light falls off
    img = img * np.linspace(g.uniform(0.6, 1.2), g.uniform(0.6, 1.2), h, dtype=np.float32)[:, None, None]
    img = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    img = img.filter(ImageFilter.GaussianBlur(g.uniform(0.0, 0.02) * min(w, h)))
    arr = np.asarray(img, np.float32) + g.normal(0, g.uniform(0, 12), (h, w, 1))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def screen(rng: random.Random, w: int, h: int) -> Image.Image:
    """A window: a title bar, maybe a side panel, and lines of text in one or two columns."""
    dark = rng.random() < 0.3
    bg = (rng.randint(20, 50),) * 3 if dark else (rng.randint(235, 255),) * 3
    ink = (rng.randint(190, 240),) * 3 if dark else (rng.randint(0, 60),) * 3
    img = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(img)
    y = 0
    if rng.random() < 0.7:
        bar = max(8, h // rng.randint(8, 16))
        draw.rectangle([0, 0, w, bar], fill=tuple(rng.randint(40, 220) for _ in range(3)))
        y = bar + 2
    x0 = 0
    if rng.random() < 0.4:
        x0 = w // rng.randint(4, 6)
        draw.rectangle([0, y, x0, h], fill=tuple(max(0, min(255, v + rng.randint(-25, 25))) for v in bg))
    size = max(7, min(h, w) // rng.randint(10, 28))
    f = font(rng.choice(TRAIN_FONTS), size)
    while y < h:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
        colour = ink if rng.random() < 0.85 else tuple(rng.randint(0, 255) for _ in range(3))
        draw.text((x0 + rng.randint(2, 12), y), line.capitalize(), fill=colour, font=f)
        y += int(size * rng.uniform(1.2, 1.8))
        if rng.random() < 0.08:
            draw.rectangle([x0 + 6, y, x0 + 6 + w // 5, y + size + 4], outline=ink)
            y += size + 8
    return img
