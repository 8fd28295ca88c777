"""The conversations of "Parley Shapes", the demo model that ships with Parley.

Templated questions and answers about the synthetic pictures of shapes_world.py, in
the message format the app sends:

    [{"role": "system", "content": "..."}?,
     {"role": "user", "content": [{"type": "image"}, ..., {"type": "text", "text": question}]},
     {"role": "assistant", "content": [{"type": "text", "text": answer}]}, ...]

Used by train_shapes.py (training), eval_shapes.py (held-out evaluation)
and packaging/screenshots.py. The questions and their answers are in shapes_questions.py, the
fixed replies in shapes_replies.py. Pure Python + Pillow; no torch here.

Rules of the world (the answers are exact strings):
- Pictures hold 1-3 shapes, each of a different kind and a different colour, each in its own
  cell of a 3x3 grid; positions are named from that cell ("at the top left", "in the middle").
- A question is about the latest picture of the conversation unless it names one
  ("... in the first picture", "the second picture"); an answer about a named picture says so
  ("Picture 2 shows ...", "In picture 1, the circle is red.").
- Answers about one shape name it first ("The circle is red.", "The red shape is a star.",
  "The star is not in the picture."): a small model finds the shape more easily that way.
- Text-only small talk gets fixed replies; a picture question with no picture asks for one.
- A picture that is not simple shapes (a photo, a screenshot: shapes_unknown.py) gets
  one line, whatever the question: UNKNOWN_REPLY.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PIL import Image
from shapes_questions import visual_question
from shapes_replies import (
    NO_PICTURE_REPLY,
    OFF_TOPIC_FIXED,
    OFF_TOPIC_REPLY,
    ONE_PICTURE_REPLY,
    SMALLTALK,
    SYSTEM_PROMPTS,
    smalltalk,
)
from shapes_unknown import random_unknown
from shapes_world import Scene, random_scene, render

UNKNOWN_SHARE = 0.07  # of the pictures in training conversations


def random_picture(rng: random.Random) -> Scene:
    """A training picture: mostly shapes, sometimes a photo or a screenshot."""
    return random_unknown(rng) if rng.random() < UNKNOWN_SHARE else random_scene(rng)


# ---------------------------------------------------------------- conversations


@dataclass
class Conversation:
    messages: list[dict]
    images: list[Image.Image]
    scenes: list[Scene] = field(default_factory=list)  # what each picture shows
    # for each assistant message, in order: (question type, answer)
    answers: list[tuple[str, str]] = field(default_factory=list)
    # for each assistant message: the index in `scenes` of the picture it is about (None: no picture)
    about: list[int | None] = field(default_factory=list)


def _user(text: str, n_images: int = 0) -> dict:
    return {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


class _Builder:
    def __init__(
        self, rng: random.Random, system: bool, draw: Callable = render, weights: dict[str, float] | None = None
    ):
        self.rng = rng
        self.draw = draw  # Scene, rng -> picture
        self.weights = weights  # of the question types (shapes_questions.WEIGHTS if None)
        self.conv = Conversation([], [])
        self.scenes: list[Scene] = []
        if system:
            self.conv.messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})

    def ask(self, qtype: str, question: str, answer: str, new_scenes: Sequence[Scene] = (), about: int | None = None):
        for s in new_scenes:
            self.scenes.append(s)
            self.conv.scenes.append(s)
            self.conv.images.append(self.draw(s, self.rng))
        self.conv.messages.append(_user(question, len(new_scenes)))
        self.conv.messages.append(_assistant(answer))
        self.conv.answers.append((qtype, answer))
        self.conv.about.append(about)

    def visual(self, new_scenes: Sequence[Scene] = (), qtype: str | None = None, refer: bool | None = None):
        rng = self.rng
        n_pic = len(self.scenes) + len(new_scenes)
        if n_pic == 0:
            t, q, _ = visual_question(rng, random_scene(rng), 0, 1, qtype, self.weights)
            self.ask("nopicture", q, NO_PICTURE_REPLY)
            return
        if refer is None:
            refer = n_pic > 1 and rng.random() < 0.6
        if len(new_scenes) > 1:
            refer = True  # several pictures at once: always say which
        picref = rng.randint(1, n_pic) if refer else 0
        scene = (self.scenes + list(new_scenes))[picref - 1 if picref else -1]
        t, q, a = visual_question(rng, scene, picref, n_pic, qtype, self.weights)
        if picref and n_pic > 1:
            t = "picture_ref"
        self.ask(t, q, a, new_scenes, about=picref - 1 if picref else n_pic - 1)


def random_conversation(
    rng: random.Random, draw: Callable = render, weights: dict[str, float] | None = None
) -> Conversation:
    """One training conversation (a mix of the kinds the app sends); `draw` renders its pictures,
    `weights` draws the question types (shapes_questions.WEIGHTS if None)."""
    b = _Builder(rng, system=rng.random() < 0.2, draw=draw, weights=weights)
    kind = rng.choices(
        ["one", "two_at_once", "two_turns", "talk", "talk_then_picture", "edge"],
        weights=[0.3, 0.25, 0.3, 0.04, 0.06, 0.05],
    )[0]
    if kind == "one":
        b.visual([random_picture(rng)])
        for _ in range(rng.choice([0, 1, 2, 2, 3, 4])):
            if rng.random() < 0.1:
                b.ask(*smalltalk(rng))
            else:
                b.visual()
    elif kind == "two_at_once":
        b.visual([random_picture(rng), random_scene(rng)])
        for _ in range(rng.choice([0, 1, 2])):
            b.visual(refer=True)
    elif kind == "two_turns":
        b.visual([random_picture(rng)])
        if rng.random() < 0.3:
            b.visual()
        b.visual([random_picture(rng)], refer=rng.random() < 0.3)
        for _ in range(rng.choice([0, 1, 2])):
            b.visual()
        if rng.random() < 0.15:
            b.visual([random_picture(rng)])
    elif kind == "talk":
        for _ in range(rng.choice([1, 1, 2])):
            b.ask(*smalltalk(rng))
    elif kind == "talk_then_picture":
        b.ask(*smalltalk(rng))
        b.visual([random_picture(rng)])
        if rng.random() < 0.5:
            b.visual()
    else:  # edge cases: a picture question with no picture; "the second picture" with one
        if rng.random() < 0.5:
            b.visual([])
            if rng.random() < 0.5:
                b.visual([random_picture(rng)])
        else:
            scene = random_scene(rng)
            _, q, _ = visual_question(rng, scene, 2, 2, rng.choice(["describe", "count", "colour"]))
            if rng.random() < 0.5:
                b.ask("onepicture", q, ONE_PICTURE_REPLY, [scene])
            else:
                b.visual([scene])
                b.ask("onepicture", q, ONE_PICTURE_REPLY)
    return b.conv


def eval_conversation(
    rng: random.Random,
    qtype: str,
    new_scene: Callable = random_scene,
    draw: Callable = render,
    new_unknown: Callable = random_unknown,
) -> Conversation:
    """A held-out single question of one type (the answer to check is the last one); pictures
    come from new_scene(rng) (photos and screenshots from new_unknown(rng)), drawn by draw(scene, rng)."""
    random_scene = new_scene  # noqa: F811 (the evaluation's own scenes below)
    if qtype in ("smalltalk", "offtopic"):
        while True:
            t, q, a = smalltalk(rng)
            if t == qtype:
                b = _Builder(rng, system=False, draw=draw)
                b.ask(t, q, a)
                return b.conv
    b = _Builder(rng, system=rng.random() < 0.2, draw=draw)
    if qtype == "second_picture":  # two pictures in one message, ask about a named one
        b.visual([random_scene(rng), random_scene(rng)], qtype="describe", refer=True)
    elif qtype == "two_turns":  # a picture turn, then a new picture; ask about the new one
        b.visual([random_scene(rng)])
        b.visual([random_scene(rng)], qtype=rng.choice(["describe", "colour", "shape", "count"]), refer=False)
    elif qtype == "followup":  # text-only follow-up about the same picture
        b.visual([random_scene(rng)])
        b.visual(qtype=rng.choice(["colour", "shape", "count", "where"]))
    elif qtype == "nopicture":
        b.visual([])
    elif qtype == "unknown":  # a photo or a screenshot, any question
        b.visual([new_unknown(rng)])
    else:
        while True:
            b2 = _Builder(rng, system=b.conv.messages != [], draw=draw)
            ask = rng.choice(["colour", "shape", "where"]) if qtype == "absent" else qtype
            b2.visual([random_scene(rng)], qtype=ask)
            if b2.conv.answers[-1][0] == qtype:
                return b2.conv
    return b.conv


EVAL_TYPES = [
    "colour",
    "shape",
    "count",
    "where",
    "side",
    "describe",
    "yesno",
    "background",
    "list",
    "absent",
    "second_picture",
    "two_turns",
    "followup",
    "smalltalk",
    "offtopic",
    "nopicture",
    "unknown",
]


# ---------------------------------------------------------------- chat template

# Each picture is announced by its number in the conversation ("Picture 2:<image>"), which helps
# with "the second picture". Every message ends at a special token, so a rendering tokenizes the
# same whether it is cut at a message boundary or not (the engine's prefix reuse relies on that).
# Assistant messages end with the EOS token, which is what the model generates.
CHAT_TEMPLATE = (
    "{%- set pictures = namespace(n=0) -%}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "{% set pictures.n = pictures.n + 1 %}{{ 'Picture ' ~ pictures.n ~ ':<image>' }}{% endif %}{% endfor %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '<|end|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<image>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def tokenizer_corpus(rng: random.Random, n: int = 20000) -> list[str]:
    """Text for training the tokenizer: questions, answers, small talk, system prompts."""
    out = list(SYSTEM_PROMPTS) + OFF_TOPIC_FIXED + [OFF_TOPIC_REPLY, NO_PICTURE_REPLY, ONE_PICTURE_REPLY]
    out += [f"Picture {i}:" for i in range(1, 10)] * 100
    for prompts, reply in SMALLTALK:
        out += prompts + [reply]
    for _ in range(n):
        scene = random_scene(rng)
        n_pic = rng.choice([1, 2, 3])
        _, q, a = visual_question(rng, scene, rng.choice([0] + list(range(1, n_pic + 1))), n_pic)
        out += [q, a]
    return out
