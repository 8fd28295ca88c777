"""The conversations of "Parley Shapes", the demo model that ships with Parley.

Templated questions and answers about the synthetic pictures of shapes_world.py, in
the message format the app sends:

    [{"role": "system", "content": "..."}?,
     {"role": "user", "content": [{"type": "image"}, ..., {"type": "text", "text": question}]},
     {"role": "assistant", "content": [{"type": "text", "text": answer}]}, ...]

Used by train_shapes.py (training), eval_shapes.py (held-out evaluation)
and packaging/screenshots.py. Pure Python + Pillow; no torch here.

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
from dataclasses import dataclass, field
from typing import Callable

from PIL import Image

from shapes_unknown import random_unknown
from shapes_world import COLOUR_NAMES, SHAPES, Obj, Scene, random_scene, render



# ---------------------------------------------------------------- answers

# 3x3 grid cells, row-major; the phrase used in answers
POSITIONS = [
    "at the top left", "at the top", "at the top right",
    "on the left", "in the middle", "on the right",
    "at the bottom left", "at the bottom", "at the bottom right",
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


# ---------------------------------------------------------------- smalltalk

SMALLTALK: list[tuple[list[str], str]] = [
    (["hello", "hi", "hey", "hello there", "hi there", "good morning", "good evening", "hey there",
      "greetings", "hallo", "yo", "good afternoon"],
     "Hello! Send me a picture of shapes and I'll describe it."),
    (["who are you", "what are you", "what is your name", "what's your name", "are you a bot",
      "introduce yourself", "which model are you"],
     "I am Parley Shapes, a tiny demo model. I can only talk about simple shapes in pictures."),
    (["what can you do", "help", "how does this work", "how do i use you", "what do you know",
      "what should i ask", "what can i ask you"],
     "Send me a picture of shapes and ask me about their colours, kinds, number or positions."),
    (["thanks", "thank you", "great", "cool", "nice", "thank you very much", "perfect", "awesome",
      "well done", "good job"],
     "You're welcome!"),
    (["how are you", "how are you doing", "how is it going", "what's up"],
     "I'm fine, thanks! Send me a picture of shapes."),
    (["bye", "goodbye", "see you", "good night", "see you later"],
     "Goodbye!"),
]
OFF_TOPIC_FIXED = [
    "what is the capital of france", "write a poem about the sea", "tell me a joke",
    "what is 2 + 2", "translate this into german", "who won the world cup",
    "explain quantum physics", "what's the weather like today", "can you write python code",
    "summarize this article", "what time is it", "recommend a good book",
    "how do i bake bread", "what is the meaning of life", "who is the president",
    "solve x squared equals four", "write an email to my boss",
]
_OFF_WORDS = ("apple music river computer history science football dinner money weather train "
              "city phone garden doctor movie song language planet ocean mountain school coffee "
              "email code price news game dog cat car house friend work travel law health").split()
_OFF_STARTS = ["what is", "tell me about", "how do i", "why is", "can you explain", "write about",
               "who invented", "where can i find", "give me", "what about", "is there a good",
               "how much is"]
OFF_TOPIC_REPLY = "Sorry, I only know about shapes in pictures."
NO_PICTURE_REPLY = "Please send me a picture first."
NOT_THERE = "is not in the picture."
ONE_PICTURE_REPLY = "There is only one picture."
UNKNOWN_REPLY = "I can only describe simple shapes \u2014 load a bigger model from the Models page."
UNKNOWN_SHARE = 0.07  # of the pictures in training conversations


def random_picture(rng: random.Random) -> Scene:
    """A training picture: mostly shapes, sometimes a photo or a screenshot."""
    return random_unknown(rng) if rng.random() < UNKNOWN_SHARE else random_scene(rng)

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are Parley, a friendly assistant that looks at pictures.",
    "Answer briefly.",
    "You are a helpful assistant. Answer the user's questions about their pictures.",
    "Be concise and accurate.",
    "You are a vision assistant.",
]


def _style(rng: random.Random, q: str, question_mark: bool = True) -> str:
    """Vary case and punctuation the way people type."""
    q = q.strip()
    end = ""
    if question_mark:
        end = rng.choice(["?", "?", "?", "", "?"])
    else:
        end = rng.choice([".", "", "!", "."]) if not q.endswith((".", "!", "?")) else ""
    u = rng.random()
    if u < 0.6:
        q = q[0].upper() + q[1:]
    elif u < 0.65:
        q = q.upper()
    return q + end


def smalltalk(rng: random.Random) -> tuple[str, str, str]:
    if rng.random() < 0.2:
        if rng.random() < 0.4:
            q = rng.choice(OFF_TOPIC_FIXED)
        else:
            q = rng.choice(_OFF_STARTS) + " " + " ".join(rng.sample(_OFF_WORDS, rng.randint(1, 3)))
        return "offtopic", _style(rng, q), OFF_TOPIC_REPLY
    prompts, reply = rng.choice(SMALLTALK)
    q = rng.choice(prompts)
    is_question = q.split()[0] in ("who", "what", "how", "are", "what's", "which")
    return "smalltalk", _style(rng, q, question_mark=is_question), reply


# ---------------------------------------------------------------- questions

# {P}: a picture noun phrase ("the picture", "the second picture"); {IN}: a suffix ("", " in the
# second picture"). Templates without either are only used for the latest picture.
DESCRIBE_T = ["What is in {P}", "Describe {P}.", "What do you see in {P}", "What's in {P}",
              "What can you see in {P}", "Tell me what is in {P}.", "What does {P} show",
              "Can you describe {P}", "What is shown in {P}", "Describe what you see in {P}."]
DESCRIBE_LATEST = ["What do you see", "What is this", "Describe it.", "What's this",
                   "Tell me what you see.", "What is it", "Describe this.", "What is here",
                   "And this one", "What about this one", "And this picture", "What about this",
                   "And now", "How about this one"]
PICTURE_WORDS = ["picture", "image", "photo", "picture", "picture"]
COUNT_T = ["How many shapes are there{IN}", "How many shapes do you see{IN}",
           "How many shapes are in {P}", "Count the shapes{IN}.", "How many objects are there{IN}",
           "How many shapes can you see{IN}", "What is the number of shapes{IN}", "How many{IN}"]
COLOUR_ONE_T = ["What colour is it", "What color is it", "What colour is the shape{IN}",
                "What color is the shape{IN}", "Which colour is the shape{IN}", "What colour is this",
                "What color is this shape", "What is the colour of the shape{IN}",
                "What color is the object{IN}", "Which color is it", "What colour", "Colour"]
COLOUR_KIND_T = ["What colour is the {K}{IN}", "What color is the {K}{IN}",
                 "Which colour is the {K}{IN}", "What is the colour of the {K}{IN}",
                 "What color does the {K} have{IN}", "The {K}{IN}: what colour is it"]
SHAPE_ONE_T = ["What shape is it", "What shape is this", "What shape is in {P}",
               "Which shape is in {P}", "What kind of shape is it", "What shape do you see{IN}",
               "What is the shape{IN}", "Which shape is it", "What shape is shown{IN}", "Which shape",
               "What shape"]
SHAPE_COLOUR_T = ["What shape is the {C} one{IN}", "What is the {C} shape{IN}",
                  "Which shape is {C}{IN}", "What kind of shape is the {C} one{IN}",
                  "What is the {C} thing{IN}", "The {C} shape{IN}: what is it"]
WHERE_T = ["Where is the {R}{IN}", "Where is the {R} located{IN}", "Where can I find the {R}{IN}",
           "In which part of {P} is the {R}", "Where's the {R}{IN}"]
WHERE_ONE_T = ["Where is the shape{IN}", "Where is it", "Where is the shape located{IN}"]
YESNO_T = ["Is there a {R}{IN}", "Do you see a {R}{IN}", "Is there a {R} in {P}",
           "Can you see a {R}{IN}", "Does {P} have a {R}"]
IS_COLOUR_T = ["Is the {K} {C}{IN}", "Is the {K}{IN} {C}"]
BACKGROUND_T = ["What colour is the background{IN}", "What color is the background{IN}",
                "Which colour is the background{IN}", "What is the background colour{IN}",
                "What color is the background of {P}"]
LIST_SHAPES_T = ["What shapes are there{IN}", "Which shapes are in {P}", "What shapes do you see{IN}",
                 "Which shapes can you see{IN}", "List the shapes{IN}."]
LIST_COLOURS_T = ["What colours are there{IN}", "What colors are in {P}",
                  "Which colours do you see{IN}", "Which colors are used{IN}", "List the colours{IN}."]


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
        return _style(rng, q[:-1], question_mark=False)
    return _style(rng, q)


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
    "colour": _Attribute(0.4, COLOUR_ONE_T, COLOUR_KIND_T, "K", lambda o: o.kind, SHAPES,
                         lambda kind: kind, lambda o: o.colour),
    "shape": _Attribute(0.6, SHAPE_ONE_T, SHAPE_COLOUR_T, "C", lambda o: o.colour, COLOUR_NAMES,
                        lambda colour: f"{colour} shape", lambda o: f"{a_(o.kind)} {o.kind}"),
}


def _attribute_question(rng: random.Random, at: _Attribute, objs: list[Obj], picref: int, n_pictures: int,
                        qtype: str) -> tuple[str | None, str, str]:
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


def visual_question(rng: random.Random, scene: Scene, picref: int, n_pictures: int,
                    qtype: str | None = None) -> tuple[str, str, str]:
    """One (type, question, answer) about `scene`."""
    if scene.unknown:  # any question about a photo or a screenshot gets the same one line
        _, q, _ = visual_question(rng, random_scene(rng), picref, n_pictures, qtype)
        return "unknown", q, UNKNOWN_REPLY
    n = len(scene.objects)
    objs = scene.objects
    if qtype is None:
        # colour-by-shape questions ("what colour is the square?") are weighted up: looking a
        # picture token up by its shape is the skill a small model learns last (colour is the
        # louder feature); with an even mix it stalled near 75% on those in several-shape scenes
        qtype = rng.choices(
            ["describe", "count", "colour", "shape", "where", "yesno", "background", "list"],
            weights=[0.11, 0.06, 0.36, 0.13, 0.13, 0.11, 0.04, 0.06])[0]
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
        elif qtype == "yesno":
            o = rng.choice(objs)
            if rng.random() < 0.25:
                c = o.colour if rng.random() < 0.5 else rng.choice([c for c in COLOUR_NAMES if c != o.colour])
                q = _fill(rng.choice(IS_COLOUR_T), picref, n_pictures, rng, K=o.kind, C=c)
                a = "Yes." if c == o.colour else "No."
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
                    yes = any(x.kind == kind and x.colour == colour for x in objs)
                q = _fill(rng.choice(YESNO_T), picref, n_pictures, rng, R=ref)
                a = "Yes." if yes else "No."
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
            if picref and n_pictures > 1 and qtype not in ("yesno", "list"):
                # name the picture first: the rest of the answer is then about it
                if qtype == "describe":
                    a = f"Picture {picref} shows {a[0].lower()}{a[1:]}"
                else:
                    a = f"In picture {picref}, {a[0].lower()}{a[1:]}"
            return qtype, q, a


# ---------------------------------------------------------------- conversations

@dataclass
class Conversation:
    messages: list[dict]
    images: list[Image.Image]
    scenes: list[Scene] = field(default_factory=list)  # what each picture shows
    # for each assistant message, in order: (question type, answer)
    answers: list[tuple[str, str]] = field(default_factory=list)


def _user(text: str, n_images: int = 0) -> dict:
    return {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


class _Builder:
    def __init__(self, rng: random.Random, system: bool, draw: Callable = render):
        self.rng = rng
        self.draw = draw  # Scene, rng -> picture
        self.conv = Conversation([], [])
        self.scenes: list[Scene] = []
        if system:
            self.conv.messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})

    def ask(self, qtype: str, question: str, answer: str, new_scenes: list[Scene] = ()):
        for s in new_scenes:
            self.scenes.append(s)
            self.conv.scenes.append(s)
            self.conv.images.append(self.draw(s, self.rng))
        self.conv.messages.append(_user(question, len(new_scenes)))
        self.conv.messages.append(_assistant(answer))
        self.conv.answers.append((qtype, answer))

    def visual(self, new_scenes: list[Scene] = (), qtype: str | None = None, refer: bool | None = None):
        rng = self.rng
        n_pic = len(self.scenes) + len(new_scenes)
        if n_pic == 0:
            t, q, _ = visual_question(rng, random_scene(rng), 0, 1, qtype)
            self.ask("nopicture", q, NO_PICTURE_REPLY)
            return
        if refer is None:
            refer = n_pic > 1 and rng.random() < 0.6
        if len(new_scenes) > 1:
            refer = True  # several pictures at once: always say which
        picref = rng.randint(1, n_pic) if refer else 0
        scene = (self.scenes + list(new_scenes))[picref - 1 if picref else -1]
        t, q, a = visual_question(rng, scene, picref, n_pic, qtype)
        if picref and n_pic > 1:
            t = "picture_ref"
        self.ask(t, q, a, new_scenes)


def random_conversation(rng: random.Random) -> Conversation:
    """One training conversation (a mix of the kinds the app sends)."""
    b = _Builder(rng, system=rng.random() < 0.2)
    kind = rng.choices(["one", "two_at_once", "two_turns", "talk", "talk_then_picture", "edge"],
                       weights=[0.3, 0.25, 0.3, 0.04, 0.06, 0.05])[0]
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


def eval_conversation(rng: random.Random, qtype: str, new_scene: Callable = random_scene,
                      draw: Callable = render, new_unknown: Callable = random_unknown) -> Conversation:
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
        b.visual([random_scene(rng)], qtype=rng.choice(["describe", "colour", "shape", "count"]),
                 refer=False)
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


EVAL_TYPES = ["colour", "shape", "count", "where", "describe", "yesno", "background", "list",
              "absent", "second_picture", "two_turns", "followup", "smalltalk", "offtopic",
              "nopicture", "unknown"]


# ---------------------------------------------------------------- chat template

# Each picture is announced by its number in the conversation ("Picture 2:<image>"), which helps
# with "the second picture". Every message ends at a special token, so a rendering tokenizes the same whether it is cut at a
# message boundary or not (the engine's prefix reuse relies on that). Assistant messages end with
# the EOS token, which is what the model generates.
CHAT_TEMPLATE = (
    "{%- set pictures = namespace(n=0) -%}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{% set pictures.n = pictures.n + 1 %}{{ 'Picture ' ~ pictures.n ~ ':<image>' }}{% endif %}{% endfor %}"
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
