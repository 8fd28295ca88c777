"""Evaluation pictures for "Parley Shapes" drawn by a different hand than its training renderer.

Pictures as a person makes them in a paint program: Pillow's ImageDraw primitives (ellipse,
rectangle, regular_polygon, pieslice) at random canvas sizes and aspect ratios, colours from a
palette of named web colours (not the training shades), white / grey / black backgrounds, filled,
outlined or filled-and-outlined, anti-aliased half the time (drawn 4x and shrunk). Shapes are
placed anywhere but kept clear of each other and of the 3x3 grid's lines (a person wouldn't
call a shape on a line "at the top left" either). The pictures it must not describe are drawn
here too: gradient-and-noise "photos" and text pages in serif / monospace fonts (training uses
sans). eval_shapes.py --set drawn uses these; none of it is used in training.
"""

from __future__ import annotations

import math
import random

from PIL import Image, ImageDraw, ImageFilter, ImageFont
from shapes_unknown import FONT_DIR, WORDS
from shapes_world import SHAPES, Obj, Scene, cell_of

PALETTE = {  # named colours as a drawing program offers them
    "red": ["red", "#e41a1c", "crimson", "#d62728", "#ff3b30"],
    "orange": ["orange", "darkorange", "#ff7f0e", "#ff9500"],
    "yellow": ["yellow", "gold", "#ffdd00", "#ffcc00"],
    "green": ["green", "limegreen", "#2ca02c", "forestgreen", "#34c759"],
    "blue": ["blue", "#1f77b4", "royalblue", "dodgerblue", "#007aff"],
    "purple": ["purple", "#9467bd", "darkviolet", "#af52de", "rebeccapurple"],
}
GREYS = {
    "white": ["white", "#fafafa", "#f2f2f2"],
    "grey": ["grey", "#999999", "#a9a9a9", "#777777"],
    "black": ["black", "#111111", "#202020"],
}


def drawn_scene(rng: random.Random, n: int | None = None) -> Scene:
    if n is None:
        n = rng.choices([1, 2, 3], weights=[0.5, 0.35, 0.15])[0]
    side = rng.randint(120, 800)
    size = (max(80, round(side * math.exp(rng.uniform(math.log(0.5), math.log(2.0))))), side)
    w, h = size
    short = min(w, h)
    kinds, colours = rng.sample(SHAPES, n), rng.sample(list(PALETTE), n)
    objects: list[Obj] = []
    while len(objects) < n:
        half = rng.uniform(0.1, 0.4) if n == 1 else rng.uniform(0.07, 0.17)
        mx, my = half * short / w, half * short / h  # whole shape inside the picture
        cx, cy = rng.uniform(mx, 1 - mx), rng.uniform(my, 1 - my)
        near_line = any(abs(v - k / 3) < 0.04 for v in (cx, cy) for k in (1, 2))
        cell = cell_of(cx, cy)
        if near_line or any(o.cell == cell for o in objects):
            continue
        if any(math.hypot((cx - o.cx) * w, (cy - o.cy) * h) < 1.1 * (half + o.half) * short for o in objects):
            continue
        kind, colour = kinds[len(objects)], colours[len(objects)]
        objects.append(Obj(kind, colour, cell, cx, cy, half, style=rng.choice(["fill", "fill", "edged", "outline"])))
    return Scene(objects, [rng.choice(list(GREYS))], size=size)


def _star(cx, cy, r, inner=0.38):
    return [
        (
            cx + (r if i % 2 == 0 else r * inner) * math.cos(-math.pi / 2 + i * math.pi / 5),
            cy + (r if i % 2 == 0 else r * inner) * math.sin(-math.pi / 2 + i * math.pi / 5),
        )
        for i in range(10)
    ]


def draw(scene: Scene, rng: random.Random) -> Image.Image:
    if scene.unknown:
        return draw_unknown(scene, rng)
    k = 4 if rng.random() < 0.5 else 1  # anti-aliased: drawn 4x, shrunk
    w, h = scene.pixels()
    bg = rng.choice(GREYS[scene.background[0]])
    img = Image.new("RGB", (w * k, h * k), bg)
    d = ImageDraw.Draw(img)
    short = min(w, h) * k
    for o in scene.objects:
        x, y, r = o.cx * w * k, o.cy * h * k, o.half * short
        colour = rng.choice(PALETTE[o.colour])
        width = max(k, round(r * rng.uniform(0.08, 0.15))) if o.style != "fill" else 0
        edge = ("white" if scene.background == ["black"] else "black") if o.style == "edged" else colour
        fill = None if o.style == "outline" else colour
        box = [x - r, y - r, x + r, y + r]
        if o.kind == "circle":
            d.ellipse(box, fill=fill, outline=edge if width else None, width=width)
        elif o.kind == "square":
            s = 0.85 * r
            d.rectangle([x - s, y - s, x + s, y + s], fill=fill, outline=edge if width else None, width=width)
        elif o.kind == "triangle":
            d.regular_polygon((x, y + 0.15 * r, r), 3, fill=fill, outline=edge if width else None, width=width)
        elif o.kind == "diamond":
            pts = [(x, y - r), (x + 0.65 * r, y), (x, y + r), (x - 0.65 * r, y)]
            d.polygon(pts, fill=fill, outline=edge if width else None, width=width)
        elif o.kind == "star":
            d.polygon(_star(x, y + 0.1 * r, r), fill=fill, outline=edge if width else None, width=width)
        else:  # heart: two round lobes and a point, as primitives
            if fill:
                d.ellipse([x - r, y - 0.75 * r, x, y + 0.25 * r], fill=fill)
                d.ellipse([x, y - 0.75 * r, x + r, y + 0.25 * r], fill=fill)
                d.polygon([(x - 0.96 * r, y - 0.05 * r), (x + 0.96 * r, y - 0.05 * r), (x, y + r)], fill=fill)
            if width:
                d.arc([x - r, y - 0.75 * r, x, y + 0.25 * r], 150, 360, fill=edge, width=width)
                d.arc([x, y - 0.75 * r, x + r, y + 0.25 * r], 180, 30, fill=edge, width=width)
                d.line(
                    [(x - 0.93 * r, y + 0.05 * r), (x, y + r), (x + 0.93 * r, y + 0.05 * r)],
                    fill=edge,
                    width=width,
                    joint="curve",
                )
    if k > 1:
        img = img.resize((w, h), Image.Resampling.BOX)
    return img


def drawn_unknown(rng: random.Random) -> Scene:
    side = rng.randint(150, 800)
    return Scene(
        [],
        ["white"],
        size=(round(side * rng.choice([1.0, 1.5, 0.75, 1.78])), side),
        unknown=rng.choice(["photo", "screen"]),
    )


def draw_unknown(scene: Scene, rng: random.Random) -> Image.Image:
    w, h = scene.pixels()
    if scene.unknown == "photo":  # gradients, a horizon, soft noise: a landscape-ish photo
        top = tuple(rng.randint(60, 230) for _ in range(3))
        bottom = tuple(rng.randint(20, 160) for _ in range(3))
        grad = Image.linear_gradient("L").resize((w, h))
        img = Image.composite(Image.new("RGB", (w, h), bottom), Image.new("RGB", (w, h), top), grad)
        d = ImageDraw.Draw(img)
        horizon = rng.uniform(0.4, 0.7) * h
        pts = [(0, h)] + [(x, horizon + rng.uniform(-0.1, 0.1) * h) for x in range(0, w + 40, 40)] + [(w, h)]
        d.polygon(pts, fill=tuple(rng.randint(20, 140) for _ in range(3)))
        noise = Image.effect_noise((w, h), rng.uniform(20, 60)).convert("RGB")
        img = Image.blend(img, noise, rng.uniform(0.15, 0.35))
        return img.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 3)))
    img = Image.new("RGB", (w, h), rng.choice(["white", "#f5f5f5", "#1e1e1e"]))
    corner = img.getpixel((0, 0))  # an RGB image: a tuple
    ink = "black" if isinstance(corner, tuple) and corner[0] > 128 else "#dddddd"
    d = ImageDraw.Draw(img)
    size = max(9, h // rng.randint(12, 30))
    f = ImageFont.truetype(str(FONT_DIR / rng.choice(["DejaVuSerif.ttf", "DejaVuSansMono.ttf"])), size)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(h // size))
    d.multiline_text((rng.randint(4, 20), rng.randint(4, 20)), text, fill=ink, font=f)
    return img
