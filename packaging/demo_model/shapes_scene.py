"""A "Parley Shapes" picture as data: its shapes (Obj) and its look (Scene), drawn by
shapes_world.render (and shapes_unknown.render for the pictures that are not shapes). A leaf both
of them import, so neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Obj:
    kind: str
    colour: str
    cell: int  # 0..8, row-major in the 3x3 grid: where the centre is
    cx: float  # centre, as a fraction of width / height
    cy: float
    half: float  # half-size, as a fraction of the picture's shorter side
    angle: float = 0.0
    outline: bool = False  # drawn as an outline only (kept for hand-built scenes)
    style: str = "fill"  # one of shapes_world.STYLES
    rgb: tuple[int, int, int] | None = None  # None: a typical shade of the colour
    form: float = 0.0  # -1..1: how this hand draws the kind (a star's inner radius, a diamond's width...)
    stretch: float = 0.0  # log of width / height: a shape drawn a little wide or tall


@dataclass
class Scene:
    objects: list[Obj]
    background: list[str]  # one name, or two for a two-tone background
    split: str = "none"  # "none" | "vertical" (left | right) | "horizontal" (top / bottom)
    size: tuple[int, int] | None = None  # None: render picks one
    noise: float = 0.0  # std of per-pixel noise, in grey levels
    blur: float = 0.0  # Gaussian blur radius, as a fraction of the shorter side
    jpeg: int = 0  # JPEG quality the picture went through; 0: none
    unknown: str = ""  # not shapes at all: "photo" | "screen" (see shapes_unknown.py)

    def pixels(self) -> tuple[int, int]:
        """(width, height) of a scene whose size was chosen (every scene drawn at its own size)."""
        if self.size is None:
            raise ValueError("this scene has no size: render() picks one, a drawer cannot")
        return self.size

    def sorted_objects(self) -> list[Obj]:
        return sorted(self.objects, key=lambda o: o.cell)
