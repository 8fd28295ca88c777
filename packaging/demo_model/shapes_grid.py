"""The first "Parley Shapes" world, kept to measure the model on it: tidy 3x3-grid scenes.

A scene holds 1-3 shapes, each of a different kind and a different colour, each near the centre of
its own cell of a 3x3 grid, on a plain or two-tone background, drawn squarish and without
anti-aliasing. The first weights were trained on these alone; eval_shapes.py --set grid
still asks about them (the training pictures are now shapes_world.py's).
"""

from __future__ import annotations

import math
import random

from PIL import Image, ImageDraw
from shapes_world import Obj, Scene

SHAPES = ["circle", "square", "triangle", "star", "diamond", "heart"]

# colour name -> reference RGB values (Pillow's named colours first); each draw adds jitter
COLOURS: dict[str, list[tuple[int, int, int]]] = {
    "red": [(255, 0, 0), (220, 30, 30), (200, 20, 40), (235, 50, 40)],
    "orange": [(255, 165, 0), (255, 140, 0), (240, 120, 30), (250, 150, 50)],
    "yellow": [(255, 255, 0), (250, 220, 30), (240, 230, 60), (255, 235, 0)],
    "green": [(0, 128, 0), (0, 200, 0), (40, 170, 60), (0, 255, 0), (30, 140, 70)],
    "blue": [(0, 0, 255), (30, 90, 220), (20, 60, 180), (30, 144, 255), (0, 0, 160)],
    "purple": [(128, 0, 128), (150, 60, 200), (110, 40, 160), (160, 32, 240)],
}
COLOUR_NAMES = list(COLOURS)

BACKGROUNDS: dict[str, list[tuple[int, int, int]]] = {
    "white": [(255, 255, 255), (245, 245, 245), (250, 248, 240), (238, 238, 238)],
    "grey": [(128, 128, 128), (150, 150, 150), (170, 170, 170), (110, 110, 110)],
    "black": [(0, 0, 0), (20, 20, 20), (35, 35, 35)],
}
BACKGROUND_NAMES = list(BACKGROUNDS)


def random_scene(rng: random.Random, n: int | None = None) -> Scene:
    if n is None:
        n = rng.choices([1, 2, 3], weights=[0.45, 0.3, 0.25])[0]
    kinds = rng.sample(SHAPES, n)
    colours = rng.sample(COLOUR_NAMES, n)
    if n == 1:
        # lone shapes are often centred and big, like a picture a person draws
        cells = [4] if rng.random() < 0.35 else [rng.randrange(9)]
    else:
        cells = rng.sample(range(9), n)
    objects = []
    for kind, colour, cell in zip(kinds, colours, cells, strict=True):
        r, c = divmod(cell, 3)
        cx = (c + 0.5) / 3 + rng.uniform(-0.05, 0.05)
        cy = (r + 0.5) / 3 + rng.uniform(-0.05, 0.05)
        if n == 1:
            room = min(cx, 1 - cx, cy, 1 - cy) - 0.02  # stay inside the picture
            half = rng.uniform(0.085, max(0.09, min(0.40, room)))
        else:
            room = min(abs(cx - c / 3), abs((c + 1) / 3 - cx), abs(cy - r / 3), abs((r + 1) / 3 - cy))
            half = rng.uniform(0.08, max(0.085, min(0.15, room - 0.005)))
        angle = rng.uniform(-12, 12) if kind in ("triangle", "star", "heart") else rng.uniform(-4, 4)
        objects.append(Obj(kind, colour, cell, cx, cy, half, angle, outline=rng.random() < 0.08))
    u = rng.random()
    if u < 0.5:
        background, split = ["white"], "none"
    elif u < 0.85:
        background, split = [rng.choice(["grey", "black"])], "none"
    else:
        background = rng.sample(BACKGROUND_NAMES, 2)
        split = rng.choice(["vertical", "horizontal"])
    return Scene(objects, background, split)


def _jitter(rng: random.Random, rgb: tuple[int, int, int], amount: int) -> tuple[int, int, int]:
    r, g, b = (max(0, min(255, v + rng.randint(-amount, amount))) for v in rgb)
    return r, g, b


def _shape_points(kind: str, cx: float, cy: float, rx: float, ry: float, angle: float) -> list[tuple[float, float]]:
    if kind == "circle":
        pts = [(math.cos(t), math.sin(t)) for t in (2 * math.pi * i / 48 for i in range(48))]
    elif kind == "square":
        k = 0.85
        pts = [(-k, -k), (k, -k), (k, k), (-k, k)]
    elif kind == "triangle":
        pts = [(0.0, -1.0), (1.0, 0.8), (-1.0, 0.8)]
    elif kind == "diamond":
        pts = [(0.0, -1.0), (0.72, 0.0), (0.0, 1.0), (-0.72, 0.0)]
    elif kind == "star":
        pts = []
        for i in range(10):
            t = -math.pi / 2 + i * math.pi / 5
            rad = 1.0 if i % 2 == 0 else 0.42
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


def render(scene: Scene, rng: random.Random, size: tuple[int, int] | None = None) -> Image.Image:
    """Draw the scene. Canvas size varies (the processor resizes to its own square size)."""
    if size is None:
        side = rng.choice([96, 96, 112, 128, 160, 200, 256, rng.randint(64, 320)])
        aspect = rng.uniform(0.8, 1.25) if rng.random() < 0.3 else 1.0
        size = (max(48, int(side * aspect)), side)
    w, h = size
    bg = [_jitter(rng, rng.choice(BACKGROUNDS[name]), 6) for name in scene.background]
    img = Image.new("RGB", (w, h), bg[0])
    draw = ImageDraw.Draw(img)
    if scene.split == "vertical":
        draw.rectangle([w // 2, 0, w, h], fill=bg[1])
    elif scene.split == "horizontal":
        draw.rectangle([0, h // 2, w, h], fill=bg[1])
    side = min(w, h)
    for o in scene.objects:
        fill = _jitter(rng, rng.choice(COLOURS[o.colour]), 14)
        pts = _shape_points(o.kind, o.cx * w, o.cy * h, o.half * side * w / side, o.half * side * h / side, o.angle)
        if o.outline:
            draw.polygon(pts, outline=fill, width=max(2, round(side * 0.03)))
        else:
            draw.polygon(pts, fill=fill)
    return img
