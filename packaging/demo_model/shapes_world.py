"""The pictures of "Parley Shapes": scenes of one to three flat shapes and their rendering.

Drawn the way people's pictures come: any size and aspect ratio, shapes of any size anywhere
(each centre in a different cell of a 3x3 grid over the whole picture, which names its position,
and clear of the grid's lines;
neighbours may overlap a little, shapes may touch the edge), plain, noisy or two-tone
backgrounds, filled, outlined, black-edged or hand-drawn-looking (wobbly) shapes, anti-aliased
edges, blur and JPEG artefacts. The processor squashes every picture to its square input, so the
grid cell of a shape's centre is also the picture token it lands on. The look of a picture is part
of its Scene, so a hand-built Scene (packaging/screenshots.py) renders clean.
shapes_data.py writes the conversations; shapes_unknown.py draws the
pictures it should not describe. Python + Pillow + numpy; no torch here.
"""

from __future__ import annotations

import colorsys
import io
import math
import random

import numpy as np
import shapes_unknown
from PIL import Image, ImageDraw, ImageFilter
from shapes_scene import Obj, Scene  # part of this module's face: world.Scene, world.Obj

SHAPES = ["circle", "square", "triangle", "star", "diamond", "heart"]

# colour name -> (hue range in degrees, saturation range, value range); each shape draws from it
COLOURS: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "red": ((-10, 8), (0.7, 1.0), (0.7, 1.0)),
    "orange": ((22, 38), (0.8, 1.0), (0.9, 1.0)),
    "yellow": ((49, 60), (0.7, 1.0), (0.88, 1.0)),
    "green": ((95, 150), (0.55, 1.0), (0.45, 0.95)),
    "blue": ((205, 240), (0.6, 1.0), (0.6, 1.0)),
    "purple": ((272, 300), (0.5, 1.0), (0.45, 0.95)),
}
COLOUR_NAMES = list(COLOURS)
TYPICAL = {
    "red": (220, 30, 30),
    "orange": (255, 140, 0),
    "yellow": (250, 220, 30),
    "green": (40, 170, 60),
    "blue": (30, 90, 220),
    "purple": (150, 60, 200),
}  # for hand-built scenes (Obj.rgb None)

BACKGROUNDS: dict[str, tuple[int, int]] = {  # name -> grey level range
    "white": (232, 255),
    "grey": (105, 175),
    "black": (0, 40),
}
BACKGROUND_NAMES = list(BACKGROUNDS)
# A shape's centre keeps this far (a fraction of the side; 3 px of the model's 96) from the lines
# between thirds: on a line its place has no one right name ("at the top" or "at the top left"?),
# and such pictures taught arbitrary answers: a lone shape drawn near the middle used to be pushed
# onto the corner of its (randomly drawn) cell, 16% of one-shape pictures, and 12% of all shapes
# sat within half a pixel of a line.
LINE_MARGIN = 0.03
STYLES = ["fill", "fill", "fill", "edged", "outline", "hand"]  # how a shape is drawn


def cell_of(cx: float, cy: float) -> int:
    return min(2, int(cy * 3)) * 3 + min(2, int(cx * 3))


def random_rgb(rng: random.Random, colour: str) -> tuple[int, int, int]:
    (h0, h1), (s0, s1), (v0, v1) = COLOURS[colour]
    r, g, b = colorsys.hsv_to_rgb((rng.uniform(h0, h1) % 360) / 360, rng.uniform(s0, s1), rng.uniform(v0, v1))
    return round(r * 255), round(g * 255), round(b * 255)


def random_scene(rng: random.Random, n: int | None = None) -> Scene:
    if n is None:
        n = rng.choices([1, 2, 3], weights=[0.45, 0.3, 0.25])[0]
    u = rng.random()
    if u < 0.25:
        size = (rng.randint(64, 160),) * 2
    else:
        side = rng.choice([rng.randint(64, 256), rng.randint(96, 480), rng.randint(200, 800)])
        aspect = math.exp(rng.uniform(math.log(0.5), math.log(2.0))) if u < 0.85 else 1.0
        size = (max(40, round(side * aspect)), side)
    w, h = size
    short = min(w, h)
    kinds = rng.sample(SHAPES, n)
    colours = rng.sample(COLOUR_NAMES, n)
    objects: list[Obj] = []
    cells = rng.sample(range(9), n)
    for kind, colour, cell in zip(kinds, colours, cells, strict=True):
        r, c = divmod(cell, 3)
        if n == 1 and rng.random() < 0.35:
            r, c = 1, 1  # a lone shape near the middle, as people often draw it
        m = LINE_MARGIN
        for attempt in range(30):
            if n == 1:
                half = rng.uniform(0.07, 0.42)
                if (r, c) == (1, 1):
                    cx, cy = 0.5 + rng.uniform(-0.08, 0.08), 0.5 + rng.uniform(-0.08, 0.08)
                else:
                    cx, cy = rng.uniform(c / 3 + m, (c + 1) / 3 - m), rng.uniform(r / 3 + m, (r + 1) / 3 - m)
            else:
                half = rng.uniform(0.06, 0.22) * (0.8**attempt)
                cx, cy = rng.uniform(c / 3 + m, (c + 1) / 3 - m), rng.uniform(r / 3 + m, (r + 1) / 3 - m)
            # at least ~70% of the shape inside the picture, the centre clear of its cell's lines
            mx, my = 0.4 * half * short / w, 0.4 * half * short / h
            cx, cy = min(max(cx, mx, 0.01), 1 - max(mx, 0.01)), min(max(cy, my, 0.01), 1 - max(my, 0.01))
            cx = min(max(cx, c / 3 + m), (c + 1) / 3 - m)
            cy = min(max(cy, r / 3 + m), (r + 1) / 3 - m)
            # neighbours may overlap a little, never hide each other
            if all(math.hypot((cx - o.cx) * w, (cy - o.cy) * h) > 0.75 * (half + o.half) * short for o in objects):
                break
        angle = _random_angle(rng, kind)
        style = rng.choice(STYLES)
        objects.append(
            Obj(
                kind,
                colour,
                cell_of(cx, cy),
                cx,
                cy,
                half,
                angle,
                style == "outline",
                style,
                random_rgb(rng, colour),
                *_random_form(rng),
            )
        )
    u = rng.random()
    if u < 0.5:
        background, split = ["white"], "none"
    elif u < 0.85:
        background, split = [rng.choice(["grey", "black"])], "none"
    else:
        background = rng.sample(BACKGROUND_NAMES, 2)
        split = rng.choice(["vertical", "horizontal"])
    noise = rng.choice([0.0, 0.0, rng.uniform(2, 10), rng.uniform(5, 22)])
    blur = rng.choice([0.0, 0.0, rng.uniform(0.0, 0.012), rng.uniform(0.005, 0.02)])
    jpeg = rng.choice([0, 0, rng.randint(10, 50), rng.randint(40, 95)])
    return Scene(objects, background, split, size, noise, blur, jpeg)


def _random_angle(rng: random.Random, kind: str) -> float:
    """A slight tilt, as drawn by hand; squares and diamonds tilt less (more and they turn into each other)."""
    return rng.uniform(-15, 15) if kind in ("triangle", "star", "heart", "circle") else rng.uniform(-8, 8)


def _random_form(rng: random.Random) -> tuple[float, float]:
    """Proportions vary from hand to hand and program to program: a fatter star, a narrower diamond."""
    return rng.uniform(-1, 1), rng.uniform(-0.12, 0.12)


def lesson_scene(rng: random.Random) -> Scene:
    """The first lesson of training: one large filled shape near the middle of a clean white square."""
    kind, colour = rng.choice(SHAPES), rng.choice(COLOUR_NAMES)
    cx, cy = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7)
    angle = _random_angle(rng, kind)
    obj = Obj(kind, colour, cell_of(cx, cy), cx, cy, rng.uniform(0.2, 0.42), angle, rgb=random_rgb(rng, colour))
    return Scene([obj], ["white"], size=(96, 96))


def _shape_points(
    kind: str, cx: float, cy: float, rx: float, ry: float, angle: float, form: float = 0.0
) -> list[tuple[float, float]]:
    if kind == "circle":
        pts = [(math.cos(t), math.sin(t)) for t in (2 * math.pi * i / 48 for i in range(48))]
    elif kind == "square":
        k = 0.85
        pts = [(-k, -k), (k, -k), (k, k), (-k, k)]
    elif kind == "triangle":
        half_base = 1.0 + 0.15 * form  # from a tall isosceles to a wide one (equilateral: 1.04)
        pts = [(0.0, -1.0), (half_base, 0.8), (-half_base, 0.8)]
    elif kind == "diamond":
        half_width = 0.72 + 0.12 * form
        pts = [(0.0, -1.0), (half_width, 0.0), (0.0, 1.0), (-half_width, 0.0)]
    elif kind == "star":
        pts = []
        for i in range(10):
            t = -math.pi / 2 + i * math.pi / 5
            rad = 1.0 if i % 2 == 0 else 0.42 + 0.08 * form
            pts.append((rad * math.cos(t), rad * math.sin(t) + 0.08))
    elif kind == "heart":
        pts = []
        for i in range(40):
            t = 2 * math.pi * i / 40
            x = 16 * math.sin(t) ** 3
            y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
            pts.append((x / 17.0, -y / 17.0 + 0.05))
    else:
        raise ValueError(kind)
    a = math.radians(angle)
    ca, sa = math.cos(a), math.sin(a)
    return [(cx + (x * ca - y * sa) * rx, cy + (x * sa + y * ca) * ry) for x, y in pts]


def _wobble(rng: random.Random, pts: list[tuple[float, float]], amount: float) -> list[tuple[float, float]]:
    """A hand-drawn look: more points along each edge, pushed sideways by a smooth random wave."""
    dense = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] + pts[:1], strict=True):
        steps = max(1, int(math.hypot(x1 - x0, y1 - y0) / max(2.0, amount * 2)))
        dense += [(x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps) for i in range(steps)]
    phase, freq = rng.uniform(0, 2 * math.pi), rng.randint(2, 5)
    out = []
    for i, (x, y) in enumerate(dense):
        t = 2 * math.pi * i / len(dense)
        d = amount * (math.sin(freq * t + phase) + 0.5 * math.sin(2.3 * freq * t + phase * 2))
        out.append((x + d * math.cos(3 * t + phase), y + d * math.sin(2 * t)))
    return out


def _jitter(rng: random.Random, rgb: tuple[int, int, int], amount: int) -> tuple[int, int, int]:
    r, g, b = (max(0, min(255, v + rng.randint(-amount, amount))) for v in rgb)
    return r, g, b


def _background(rng: random.Random, name: str) -> tuple[int, int, int]:
    lo, hi = BACKGROUNDS[name]
    v = rng.randint(lo, hi)
    return _jitter(rng, (v, v, v), 5)  # a faint tint, like paper or a dim screen


def render(scene: Scene, rng: random.Random, size: tuple[int, int] | None = None) -> Image.Image:
    """Draw the scene at its size (or `size`); the processor then squashes it to its input."""
    if scene.unknown:
        return shapes_unknown.render(scene, rng)
    size = size or scene.size
    if size is None:
        side = rng.choice([96, 128, 160, 200, 256])
        size = (side, side)
    w, h = size
    ss = 3 if max(w, h) <= 200 else 2 if max(w, h) <= 400 else 1  # draw large, shrink: anti-aliased edges
    W, H = w * ss, h * ss
    bg = [_background(rng, name) for name in scene.background]
    img = Image.new("RGB", (W, H), bg[0])
    draw = ImageDraw.Draw(img)
    if scene.split == "vertical":
        draw.rectangle([W // 2, 0, W, H], fill=bg[1])
    elif scene.split == "horizontal":
        draw.rectangle([0, H // 2, W, H], fill=bg[1])
    short = min(W, H)
    for o in scene.objects:
        fill = o.rgb or TYPICAL[o.colour]
        style = "outline" if o.outline and o.style == "fill" else o.style
        rad = o.half * short
        wide = math.exp(o.stretch / 2)
        pts = _shape_points(o.kind, o.cx * W, o.cy * H, rad * wide, rad / wide, o.angle, o.form)
        # strokes stay at least ~1.5 pixels wide once the processor has shrunk the picture
        line = max(2 * ss, round(1.5 * max(W, H) / 96), round(rad * rng.uniform(0.08, 0.2)))
        if style == "fill":
            draw.polygon(pts, fill=fill)
        elif style == "edged":  # a coloured shape with a dark (or white, on black) edge
            edge = (
                (255, 255, 255)
                if scene.background == ["black"] and rng.random() < 0.5
                else _jitter(rng, (20, 20, 20), 20)
            )
            draw.polygon(pts, fill=fill, outline=edge, width=max(ss, line // 2))
        elif style == "outline":
            draw.polygon(pts, outline=fill, width=line)
        else:  # hand: a wobbly stroke, sometimes coloured in
            wob = _wobble(rng, pts, rad * rng.uniform(0.02, 0.06))
            if rng.random() < 0.5:
                draw.polygon(wob, fill=fill)
            draw.line(wob + wob[:1], fill=fill, width=line, joint="curve")
    if ss > 1:
        img = img.reduce(ss)
    if scene.noise > 0:  # sensor / paper grain; numpy seeded from rng, so the same seed gives the same pixels
        grain = np.random.default_rng(rng.getrandbits(32)).normal(0.0, scene.noise, (h, w, 1))
        img = Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) + grain, 0, 255).astype(np.uint8))
    if scene.blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(scene.blur * min(w, h)))
    if scene.jpeg:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=scene.jpeg)
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img
