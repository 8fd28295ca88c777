"""The questions about one picture of "Parley Shapes" and their exact answers.

visual_question(rng, scene, picref, n_pictures) draws a templated question of a type (colour,
shape, count, where, side, describe, yes/no, background, list, absent) about a Scene of
shapes_world.py and gives the one answer the model must learn; describe(scene) is the
whole-picture answer. Used by shapes_data.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from shapes_replies import UNKNOWN_REPLY, style
from shapes_world import COLOUR_NAMES, SHAPES, Obj, Scene, random_scene

NOT_THERE = "is not in the picture."

# 3x3 grid cells, row-major; the phrase used in answers
POSITIONS = [
    "at the top left",
    "at the top",
    "at the top right",
    "on the left",
    "in the middle",
    "on the right",
    "at the bottom left",
    "at the bottom",
    "at the bottom right",
]
NUMBER_WORDS = {1: "one", 2: "two", 3: "three"}
ORDINALS = {1: "first", 2: "second", 3: "third"}


def a_(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def join_words(parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def describe(scene: Scene) -> str:
    parts = [f"{a_(o.colour)} {o.colour} {o.kind} {POSITIONS[o.cell]}" for o in scene.sorted_objects()]
    s = join_words(parts)
    return s[0].upper() + s[1:] + "."


def count_answer(scene: Scene) -> str:
    n = len(scene.objects)
    return "There is one shape." if n == 1 else f"There are {NUMBER_WORDS[n]} shapes."


def background_answer(scene: Scene) -> str:
    return "The background is " + " and ".join(scene.background) + "."


# {P}: a picture noun phrase ("the picture", "the second picture"); {IN}: a suffix ("", " in the
# second picture"). Templates without either are only used for the latest picture.
DESCRIBE_T = [
    "What is in {P}",
    "Describe {P}.",
    "What do you see in {P}",
    "What's in {P}",
    "What can you see in {P}",
    "Tell me what is in {P}.",
    "What does {P} show",
    "Can you describe {P}",
    "What is shown in {P}",
    "Describe what you see in {P}.",
]
DESCRIBE_LATEST = [
    "What do you see",
    "What is this",
    "Describe it.",
    "What's this",
    "Tell me what you see.",
    "What is it",
    "Describe this.",
    "What is here",
    "And this one",
    "What about this one",
    "And this picture",
    "What about this",
    "And now",
    "How about this one",
]
PICTURE_WORDS = ["picture", "image", "photo", "picture", "picture"]
COUNT_T = [
    "How many shapes are there{IN}",
    "How many shapes do you see{IN}",
    "How many shapes are in {P}",
    "Count the shapes{IN}.",
    "How many objects are there{IN}",
    "How many shapes can you see{IN}",
    "What is the number of shapes{IN}",
    "How many{IN}",
]
COLOUR_ONE_T = [
    "What colour is it",
    "What color is it",
    "What colour is the shape{IN}",
    "What color is the shape{IN}",
    "Which colour is the shape{IN}",
    "What colour is this",
    "What color is this shape",
    "What is the colour of the shape{IN}",
    "What color is the object{IN}",
    "Which color is it",
    "What colour",
    "Colour",
]
COLOUR_KIND_T = [
    "What colour is the {K}{IN}",
    "What color is the {K}{IN}",
    "Which colour is the {K}{IN}",
    "What is the colour of the {K}{IN}",
    "What color does the {K} have{IN}",
    "The {K}{IN}: what colour is it",
]
SHAPE_ONE_T = [
    "What shape is it",
    "What shape is this",
    "What shape is in {P}",
    "Which shape is in {P}",
    "What kind of shape is it",
    "What shape do you see{IN}",
    "What is the shape{IN}",
    "Which shape is it",
    "What shape is shown{IN}",
    "Which shape",
    "What shape",
]
SHAPE_COLOUR_T = [
    "What shape is the {C} one{IN}",
    "What is the {C} shape{IN}",
    "Which shape is {C}{IN}",
    "What kind of shape is the {C} one{IN}",
    "What is the {C} thing{IN}",
    "The {C} shape{IN}: what is it",
]
WHERE_T = [
    "Where is the {R}{IN}",
    "Where is the {R} located{IN}",
    "Where can I find the {R}{IN}",
    "In which part of {P} is the {R}",
    "Where's the {R}{IN}",
]
WHERE_ONE_T = ["Where is the shape{IN}", "Where is it", "Where is the shape located{IN}"]
YESNO_T = ["Is there {R}{IN}", "Do you see {R}{IN}", "Is there {R} in {P}", "Can you see {R}{IN}", "Does {P} have {R}"]
IS_COLOUR_T = ["Is the {K} {C}{IN}", "Is the {K}{IN} {C}"]
BACKGROUND_T = [
    "What colour is the background{IN}",
    "What color is the background{IN}",
    "Which colour is the background{IN}",
    "What is the background colour{IN}",
    "What color is the background of {P}",
]
# "What shape is on the left?" about two or three shapes: the one farthest that way, asked only
# where one shape is (its column or row alone is the farthest); {D}: "on the left", "at the top"...
SIDE_T = [
    "What shape is {D}{IN}",
    "Which shape is {D}{IN}",
    "What is {D}{IN}",
    "What's {D}{IN}",
    "What is the shape {D}{IN}",
    "Which one is {D}{IN}",
    "What do you see {D}{IN}",
    "What kind of shape is {D}{IN}",
    "What is the {W} shape{IN}",
    "Which shape is the {W} one{IN}",
]
SIDES = {  # direction word -> (answer phrase, question phrases, axis: 0 column / 1 row, farthest: -1 min / +1 max)
    "left": ("on the left", ["on the left", "on the left", "on the left side", "at the left"], 0, -1),
    "right": ("on the right", ["on the right", "on the right", "on the right side", "at the right"], 0, 1),
    "top": ("at the top", ["at the top", "at the top", "on top", "on the top"], 1, -1),
    "bottom": ("at the bottom", ["at the bottom", "at the bottom", "on the bottom", "at the bottom side"], 1, 1),
}
LIST_SHAPES_T = [
    "What shapes are there{IN}",
    "Which shapes are in {P}",
    "What shapes do you see{IN}",
    "Which shapes can you see{IN}",
    "List the shapes{IN}.",
]
LIST_COLOURS_T = [
    "What colours are there{IN}",
    "What colors are in {P}",
    "Which colours do you see{IN}",
    "Which colors are used{IN}",
    "List the colours{IN}.",
]


def side_of(scene: Scene, direction: str) -> Obj | None:
    """The one shape farthest `direction` ("left", "top"...): alone in the outermost occupied column
    (or row) that way, with another shape in a different one; None where no one shape is."""
    _, _, axis, sign = SIDES[direction]
    line = [divmod(o.cell, 3)[1 - axis] for o in scene.objects]  # column (axis 0) or row (axis 1)
    if len(set(line)) < 2:
        return None
    far = min(line) if sign < 0 else max(line)
    ones = [o for o, v in zip(scene.objects, line, strict=True) if v == far]
    return ones[0] if len(ones) == 1 else None


def side_answer(obj: Obj, direction: str) -> str:
    return f"The shape {SIDES[direction][0]} is {a_(obj.colour)} {obj.colour} {obj.kind}."


def _fill(t: str, picref: int, n_pictures: int, rng: random.Random, **kw) -> str | None:
    """Fill a template. picref: 0 = latest picture (unnamed), k >= 1 = the k-th picture by name."""
    word = rng.choice(PICTURE_WORDS)
    if picref == 0:
        P = rng.choice([f"the {word}", f"this {word}", f"the {word}", "it"]) if "{P}" in t else ""
        if P == "it" and not (t.endswith("{P}") or "in {P}" in t):
            P = f"the {word}"
        IN = ""
    else:
        if "{P}" not in t and "{IN}" not in t:
            return None
        if rng.random() < 0.15:
            P = f"{word} {picref}"
        else:
            P = f"the {ORDINALS[picref]} {word}"
        if rng.random() < 0.1 and picref == n_pictures and n_pictures > 1:
            P = f"the last {word}"
        IN = f" in {P}"
    q = t.replace("{P}", P).replace("{IN}", IN)
    for k, v in kw.items():
        q = q.replace("{" + k + "}", v)
    if q.endswith("."):
        return style(rng, q[:-1], question_mark=False)
    return style(rng, q)


@dataclass(frozen=True)
class _Attribute:
    """One attribute asked by the other: "What colour is the square?" (colour by kind) or
    "What shape is the red one?" (kind by colour)."""

    one_chance: float  # with a lone shape, how often the question doesn't name it ("What colour is it?")
    one_t: list[str]
    keyed_t: list[str]
    slot: str  # the template slot the key fills
    key: Callable[[Obj], str]  # what the question names
    key_pool: list[str]  # keys to draw an absent one from
    ref: Callable[[str], str]  # the key as the answer names it
    value: Callable[[Obj], str]  # what the answer gives


ATTRIBUTE_QUESTIONS = {
    "colour": _Attribute(
        0.4, COLOUR_ONE_T, COLOUR_KIND_T, "K", lambda o: o.kind, SHAPES, lambda kind: kind, lambda o: o.colour
    ),
    "shape": _Attribute(
        0.6,
        SHAPE_ONE_T,
        SHAPE_COLOUR_T,
        "C",
        lambda o: o.colour,
        COLOUR_NAMES,
        lambda colour: f"{colour} shape",
        lambda o: f"{a_(o.kind)} {o.kind}",
    ),
}


def _attribute_question(
    rng: random.Random, at: _Attribute, objs: list[Obj], picref: int, n_pictures: int, qtype: str
) -> tuple[str | None, str, str]:
    """(question, answer, type); the type becomes "absent" when it asks about a shape not there."""
    if len(objs) == 1 and rng.random() < at.one_chance:
        return _fill(rng.choice(at.one_t), picref, n_pictures, rng), f"It is {at.value(objs[0])}.", qtype
    if rng.random() < 0.8:
        o = rng.choice(objs)
        q = _fill(rng.choice(at.keyed_t), picref, n_pictures, rng, **{at.slot: at.key(o)})
        return q, f"The {at.ref(at.key(o))} is {at.value(o)}.", qtype
    key = rng.choice([k for k in at.key_pool if k not in {at.key(o) for o in objs}])
    q = _fill(rng.choice(at.keyed_t), picref, n_pictures, rng, **{at.slot: key})
    return q, f"The {at.ref(key)} {NOT_THERE}", "absent"


# How often each type is asked when none is given (train_shapes.py --weight changes them).
# Colour-by-shape questions ("what colour is the square?") are weighted up: looking a picture
# token up by its shape is the skill a small model learns last (colour is the louder feature);
# with an even mix it stalled near 75% on those in several-shape scenes. "side" (of two or three
# shapes; of one it becomes "where") is 0 here, as in the runs before it; the fine-tune that
# taught it sets its own mix (model README).
WEIGHTS = {
    "describe": 0.11,
    "count": 0.06,
    "colour": 0.36,
    "shape": 0.13,
    "where": 0.13,
    "side": 0.0,
    "yesno": 0.11,
    "background": 0.04,
    "list": 0.06,
}


def parse_weights(given: list[str]) -> dict[str, float]:
    """WEIGHTS with "TYPE=W" items applied (train_shapes.py --weight); ValueError names a bad one."""
    weights = dict(WEIGHTS)
    for item in given:
        name, _, value = item.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = -1.0
        if name not in weights or not (0 <= w < math.inf):
            raise ValueError(f"--weight {item!r}: want TYPE=W, TYPE one of {', '.join(weights)}, W >= 0")
        weights[name] = w
    if sum(weights.values()) <= 0:
        raise ValueError("--weight: at least one question type needs a weight above 0")
    return weights


def visual_question(
    rng: random.Random,
    scene: Scene,
    picref: int,
    n_pictures: int,
    qtype: str | None = None,
    weights: dict[str, float] | None = None,
) -> tuple[str, str, str]:
    """One (type, question, answer) about `scene`; the type drawn by `weights` (WEIGHTS) if not given."""
    if scene.unknown:  # any question about a photo or a screenshot gets the same one line
        _, question, _ = visual_question(rng, random_scene(rng), picref, n_pictures, qtype, weights)
        return "unknown", question, UNKNOWN_REPLY
    n = len(scene.objects)
    objs = scene.objects
    if qtype is None:
        w = weights or WEIGHTS
        qtype = rng.choices(list(w), weights=list(w.values()))[0]
    if qtype == "side" and n < 2:
        qtype = "where"
    while True:
        q = None
        if qtype == "describe":
            pool = DESCRIBE_T + (DESCRIBE_LATEST if picref == 0 else [])
            q, a = _fill(rng.choice(pool), picref, n_pictures, rng), describe(scene)
        elif qtype == "count":
            q, a = _fill(rng.choice(COUNT_T), picref, n_pictures, rng), count_answer(scene)
        elif qtype in ATTRIBUTE_QUESTIONS:
            q, a, qtype = _attribute_question(rng, ATTRIBUTE_QUESTIONS[qtype], objs, picref, n_pictures, qtype)
        elif qtype == "where":
            o = rng.choice(objs)
            if n == 1 and rng.random() < 0.3:
                q = _fill(rng.choice(WHERE_ONE_T), picref, n_pictures, rng)
                a = f"It is {POSITIONS[o.cell]}."
            elif rng.random() < 0.85:
                ref = rng.choice([o.kind, f"{o.colour} shape", f"{o.colour} {o.kind}", o.kind])
                q = _fill(rng.choice(WHERE_T), picref, n_pictures, rng, R=ref)
                a = f"The {ref} is {POSITIONS[o.cell]}."
            else:
                kind = rng.choice([k for k in SHAPES if k not in {x.kind for x in objs}])
                ref = rng.choice([kind, f"{o.colour} {kind}"])
                q = _fill(rng.choice(WHERE_T), picref, n_pictures, rng, R=ref)
                a, qtype = f"The {ref} {NOT_THERE}", "absent"
        elif qtype == "side":
            ones = {d: one for d in SIDES if (one := side_of(scene, d)) is not None}
            d = rng.choice(list(ones))
            q = _fill(rng.choice(SIDE_T), picref, n_pictures, rng, D=rng.choice(SIDES[d][1]), W=d)
            a = side_answer(ones[d], d)
        elif qtype == "yesno":
            # answered by naming the shape first, then where it is, what colour it is, or that it is
            # not there: "Is there a blue star?" -> "The blue star is at the top." A bare "Yes."
            # or "No." must be decided on the first token, before the shape is named, and was
            # answered "No." almost always (52%, chance); "The heart is not in the picture." was
            # right 91% of the time.
            o = rng.choice(objs)
            if rng.random() < 0.25:
                c = o.colour if rng.random() < 0.5 else rng.choice([c for c in COLOUR_NAMES if c != o.colour])
                q = _fill(rng.choice(IS_COLOUR_T), picref, n_pictures, rng, K=o.kind, C=c)
                a = f"The {o.kind} is {o.colour}."
            else:
                yes = rng.random() < 0.5
                kind = o.kind if yes else rng.choice([k for k in SHAPES if k not in {x.kind for x in objs}])
                colour = o.colour if yes else rng.choice(COLOUR_NAMES)
                style = rng.randrange(3)
                if style == 0:
                    ref = kind
                elif style == 1:
                    ref = f"{colour} shape"
                    if not yes:
                        colour = rng.choice([c for c in COLOUR_NAMES if c not in {x.colour for x in objs}])
                        ref = f"{colour} shape"
                else:
                    if not yes and rng.random() < 0.5:  # both words present, but not together
                        others = [x for x in objs if x is not o]
                        if others:
                            kind, colour = o.kind, rng.choice(others).colour
                    ref = f"{colour} {kind}"
                found = [x for x in objs if ref in (x.kind, f"{x.colour} shape", f"{x.colour} {x.kind}")]
                q = _fill(rng.choice(YESNO_T), picref, n_pictures, rng, R=f"{a_(ref)} {ref}")
                a = f"The {ref} is {POSITIONS[found[0].cell]}." if found else f"The {ref} {NOT_THERE}"
        elif qtype == "background":
            q, a = _fill(rng.choice(BACKGROUND_T), picref, n_pictures, rng), background_answer(scene)
        elif qtype == "list":
            so = scene.sorted_objects()
            if rng.random() < 0.5:
                q = _fill(rng.choice(LIST_SHAPES_T), picref, n_pictures, rng)
                s = join_words([f"{a_(o.kind)} {o.kind}" for o in so])
            else:
                q = _fill(rng.choice(LIST_COLOURS_T), picref, n_pictures, rng)
                s = join_words([o.colour for o in so])
            a = s[0].upper() + s[1:] + "."
        else:
            raise ValueError(qtype)
        if q is not None:
            if picref and n_pictures > 1 and qtype != "list":
                # name the picture first: the rest of the answer is then about it
                if qtype == "describe":
                    a = f"Picture {picref} shows {a[0].lower()}{a[1:]}"
                else:
                    a = f"In picture {picref}, {a[0].lower()}{a[1:]}"
            return qtype, q, a


def focus_of(scene: Scene, qtype: str, answer: str) -> Obj | None:
    """The one shape an answer about `scene` reads its words from ("Where is the red circle?" ->
    the red circle; "What shape is on the left?" -> the shape on the left), or None where the
    answer reads none or several (describe, count, list, a shape not there). Training only: it
    points the language model's attention at that shape's picture tokens (train_shapes.py --point)."""
    if qtype not in ("where", "side", "yesno", "colour", "shape", "picture_ref") or scene.unknown:
        return None
    if answer.startswith("In picture "):  # "In picture 2, the circle is red."
        answer = answer.split(", ", 1)[1]
    objs = scene.objects
    if answer.startswith("It is ") and len(objs) == 1:
        return objs[0]
    found = [
        o
        for o in objs
        if answer.endswith(f" {POSITIONS[o.cell]}.")  # where, yes/no found
        or answer.endswith(f" {o.colour} {o.kind}.")  # side
        or answer == f"the {o.kind} is {o.colour}."  # colour by kind (after "In picture k, ")
        or answer == f"The {o.kind} is {o.colour}."
        or answer.lower() == f"the {o.colour} shape is {a_(o.kind)} {o.kind}."  # kind by colour
    ]
    return found[0] if len(found) == 1 else None
