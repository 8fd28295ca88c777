"""The demo model's training script is reproducible and writes a folder the app can load.

Two short runs of packaging/demo_model/train_shapes.py with the same seed must write byte-identical
weights (the README promises a rerun gives the shipped weights), from scratch and as a
fine-tune (--init) of a folder, and the folder must load through the standard AutoProcessor /
AutoModelForImageTextToText path. The training pictures (any size, noise, blur, JPEG, photos and
screenshots) must come out pixel for pixel the same from the same seed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.side_by_side import ChildRun, SideBySide

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging" / "demo_model"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def train_run(out: Path, *extra: str) -> ChildRun:
    argv = [
        sys.executable,
        str(ROOT / "packaging" / "demo_model" / "train_shapes.py"),
        *("--vision-steps", "6", "--steps", "6", "--batch", "4", "--vision-batch", "8", "--threads", "1"),
        *("--out", str(out), *extra),
    ]
    return ChildRun(out.name, argv, ROOT, dict(os.environ))


def train_side_by_side(tmp_path: Path, runs: list[ChildRun]) -> None:
    """Each run a process of its own (one thread each), two at a time: a same-seed pair must agree
    across processes, and two cores train two of them at once."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    pool = SideBySide(runs, tmp_path / "logs", width=2, timeout_s=240)
    try:
        for r in runs:
            done = pool.result(r.key)
            assert done.returncode == 0, f"{r.key}: {done.stderr[-2000:]}"
    finally:
        pool.close()


def test_same_seed_gives_the_same_weights_and_a_loadable_folder(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    train_side_by_side(tmp_path, [train_run(tmp_path / "a"), train_run(tmp_path / "b")])
    # a fine-tune of that folder, twice, beside a run with another seed
    a = str(tmp_path / "a")
    runs = [train_run(tmp_path / "ft1", "--init", a), train_run(tmp_path / "ft2", "--init", a)]
    sized = ("--lm-layers", "2", "--lm-width", "64", "--lm-ffn", "96", "--lm-heads", "2")  # issue 43: a chosen size
    train_side_by_side(tmp_path, [*runs, train_run(tmp_path / "c", "--seed", "7"), train_run(tmp_path / "d", *sized)])
    weights = lambda name: (tmp_path / name / "model.safetensors").read_bytes()  # noqa: E731
    assert weights("a") == weights("b")
    assert weights("a") != weights("c"), "the seed should matter"
    processor = AutoProcessor.from_pretrained(tmp_path / "a")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "a")
    assert model.config.model_type == "llava"
    assert processor.tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert (model.config.text_config.num_hidden_layers, model.config.text_config.hidden_size) == (4, 192)
    text = AutoModelForImageTextToText.from_pretrained(tmp_path / "d").config.text_config
    shape = (text.num_hidden_layers, text.hidden_size, text.intermediate_size, text.num_attention_heads)
    assert shape == (2, 64, 96, 2)

    # the fine-tunes: the same bytes again, and not the folder they started from
    assert weights("ft1") == weights("ft2")
    assert weights("ft1") != weights("a")


def test_training_pictures_are_the_same_pixels_from_the_same_seed():
    import random

    import shapes_data as sd
    import shapes_world as world

    def pictures(seed):
        rng = random.Random(seed)
        scenes = [world.random_scene(rng) for _ in range(12)] + [sd.random_unknown(rng) for _ in range(3)]
        return [world.render(sc, rng).tobytes() for sc in scenes], scenes

    first, scenes = pictures(11)
    again, _ = pictures(11)
    assert first == again
    assert pictures(12)[0] != first
    sizes = {sc.size for sc in scenes}
    assert len(sizes) > 5, "pictures come at many sizes"
    for sc in scenes:
        for o in sc.objects:  # the position named in answers is the cell the centre falls in
            assert o.cell == world.cell_of(o.cx, o.cy)


def test_a_photo_or_a_screenshot_gets_the_one_line_answer():
    import random

    import shapes_data as sd

    conv = sd.eval_conversation(random.Random(3), "unknown")
    assert conv.messages[-1]["content"][0]["text"] == (
        "I can only describe simple shapes \u2014 load a bigger model from the Models page."
    )
    assert conv.images[0].size == conv.scenes[0].size


def test_picture_order_probe_targets_follow_the_pictures():
    from shapes_probes import PictureOrderProbe

    probe = PictureOrderProbe(dim=8, image_token_id=9, tokens_per_picture=2)
    # text, picture 1 (2 tokens), text, picture 2, picture 3, picture 4 (clamped to the last class)
    ids = torch.tensor([[1, 9, 9, 2, 9, 9, 9, 9, 9, 9, 3]])
    is_pic, target = probe.targets(ids)
    assert is_pic.tolist() == [[False, True, True, False, True, True, True, True, True, True, False]]
    assert target.tolist() == [0, 0, 1, 1, 2, 2, 2, 2]
    hidden = torch.zeros(1, ids.shape[1], 8, requires_grad=True)
    probe.loss(hidden, ids).backward()
    assert hidden.grad[0, 0].abs().sum() == 0 and hidden.grad[0, 1].abs().sum() > 0, "only picture tokens are read"
    assert probe.loss(hidden, torch.tensor([[1, 2, 3]])).item() == 0.0, "no pictures, no loss"


def test_word_probe_names_a_shape_on_every_token_it_covers():
    """A shape centred just right of the left third's line also covers tokens in the left third;
    they are taught the shape's place ("at the top", the middle column), not their own."""
    import shapes_world as world
    from shapes_probes import centre_token, covered_tokens

    big = world.Obj("circle", "red", world.cell_of(0.36, 0.15), 0.36, 0.15, half=0.2)
    small = world.Obj("star", "blue", world.cell_of(0.85, 0.85), 0.85, 0.85, half=0.04)
    scene = world.Scene([big, small], ["white"], size=(96, 96))
    tokens = covered_tokens(scene, grid=6)
    assert big.cell == 1 and centre_token(big, 6) == 2  # row 0, token column 2: the middle third
    assert tokens[1] is big, "the token left of the line (column 1, the left third) names the big circle"
    assert tokens[2] is big and tokens[8] is big and 0 not in tokens and 7 not in tokens
    assert [t for t, o in tokens.items() if o is small] == [35], "a small shape: its centre token only"
    assert all(o is big for t, o in tokens.items() if t != 35)

    # where two shapes reach one token, it belongs to the nearer one; a centre token to its own shape
    left = world.Obj("square", "green", world.cell_of(0.30, 0.5), 0.30, 0.5, half=0.3)
    right = world.Obj("heart", "purple", world.cell_of(0.42, 0.5), 0.42, 0.5, half=0.2)
    tokens = covered_tokens(world.Scene([left, right], ["grey"], size=(96, 96)), grid=6)
    assert tokens[centre_token(right, 6)] is right and tokens[centre_token(left, 6)] is left
    assert tokens[13] is left, "row 2, column 1: out of the heart's reach"
    assert tokens[14] is right, "row 2, column 2: both reach it, the heart is nearer"


def test_side_questions_name_the_one_shape_farthest_that_way():
    """ "What shape is on the left?" names the shape alone in the leftmost occupied column; where no
    one shape is (two in that column, or all in one column) the direction is not asked."""
    import random

    import eval_shapes
    import shapes_world as world
    from shapes_questions import side_of, visual_question

    def scene(*cells):
        kinds, colours = ["circle", "square", "star"][: len(cells)], ["red", "blue", "green"][: len(cells)]
        objs = [
            world.Obj(k, c, cell, (cell % 3 + 0.5) / 3, (cell // 3 + 0.5) / 3, 0.1)
            for k, c, cell in zip(kinds, colours, cells, strict=True)
        ]
        return world.Scene(objs, ["white"], size=(96, 96))

    two = scene(3, 5)  # a red circle on the left, a blue square on the right: issue 27's drawing
    assert side_of(two, "left").kind == "circle" and side_of(two, "right").kind == "square"
    assert side_of(two, "top") is None and side_of(two, "bottom") is None, "one row: neither is higher"
    three = scene(0, 6, 5)  # top left, bottom left, right
    assert side_of(three, "left") is None, "two shapes share the left column"
    assert side_of(three, "right").kind == "star" and side_of(three, "top").kind == "circle"
    assert side_of(three, "bottom").kind == "square"

    rng = random.Random(5)
    for _ in range(200):
        t, q, a = visual_question(rng, three, 0, 1, "side")
        assert t == "side" and a in (
            "The shape on the right is a green star.",
            "The shape at the top is a red circle.",
            "The shape at the bottom is a blue square.",
        ), (q, a)
    assert visual_question(rng, scene(4), 0, 1, "side")[0] == "where", "one shape: asked where it is"

    # the drawn set asks both of two and three shapes, the answer checked against its own scene
    for qtype in ("where", "side"):
        for _ in range(20):
            conv = eval_shapes.conversation(rng, qtype, "drawn")
            assert len(conv.scenes[0].objects) in (2, 3) and conv.answers[-1][0] == qtype


def test_question_mix_is_checked_where_it_enters():
    import shapes_questions as questions

    mix = questions.parse_weights(["side=0.18", "where=0.22"])
    assert mix["side"] == 0.18 and mix["colour"] == questions.WEIGHTS["colour"]
    for bad in (["sides=1"], ["side=-1"], ["side=nan"], ["side"], [f"{t}=0" for t in questions.WEIGHTS]):
        with pytest.raises(ValueError, match="--weight"):
            questions.parse_weights(bad)


def test_a_wrong_where_answer_that_read_another_shape_is_told_apart():
    import eval_shapes
    import shapes_world as world

    circle = world.Obj("circle", "red", 3, 0.2, 0.5, 0.1)
    square = world.Obj("square", "blue", 5, 0.8, 0.5, 0.1)
    scene = world.Scene([circle, square], ["white"], size=(320, 240))
    want = "The red circle is on the left."
    assert eval_shapes.names_another_place("The red circle is on the right.", want, scene)
    assert not eval_shapes.names_another_place("The red circle is at the top left.", want, scene)
    assert not eval_shapes.names_another_place("A red circle on the left.", want, scene)


def test_pointing_loss_asks_for_the_shape_the_answer_is_about():
    """--point: while "The red circle is on the left." is written, the taught heads should look at
    the red circle's picture tokens, not the blue square's (the shipped weights' wrong "where"
    answers mostly read another shape)."""
    import shapes_data as sd
    import shapes_world as world
    from shapes_probes import covered_tokens, pointing_loss
    from shapes_questions import focus_of

    circle = world.Obj("circle", "red", 3, 0.2, 0.5, 0.15)
    square = world.Obj("square", "blue", 5, 0.8, 0.5, 0.15)
    scene = world.Scene([circle, square], ["white"], size=(96, 96))
    assert focus_of(scene, "where", "The red circle is on the left.") is circle
    assert focus_of(scene, "side", "The shape on the right is a blue square.") is square
    assert focus_of(scene, "colour", "The square is blue.") is square
    assert focus_of(scene, "picture_ref", "In picture 2, the red shape is a circle.") is circle
    assert focus_of(scene, "yesno", "The blue square is at the top.") is None, "no shape is there"
    assert focus_of(scene, "describe", "A red circle on the left and a blue square on the right.") is None

    # one conversation: a picture (36 tokens), a question, the answer about the circle
    conv = sd.Conversation([], [], scenes=[scene], answers=[("where", "The red circle is on the left.")], about=[0])
    pic = 9
    ids = torch.tensor([[1] + [pic] * 36 + [2, 3, 5, 6, 7, 4]])
    labels = torch.tensor([[-100] * 39 + [5, 6, 7, 4]])  # the answer: 3 tokens and EOS
    batch = {"input_ids": ids, "labels": labels}
    owner = covered_tokens(scene, grid=6)
    on_circle = [1 + t for t, o in owner.items() if o is circle]
    on_square = [1 + t for t, o in owner.items() if o is square]
    assert on_circle and on_square

    def looking_at(keys):
        att = torch.zeros(1, ids.shape[1], ids.shape[1])
        att[0, :, keys] = 1 / len(keys)
        return att

    right = pointing_loss([looking_at(on_circle)], batch, [conv], pic, grid=6).item()
    wrong = pointing_loss([looking_at(on_square)], batch, [conv], pic, grid=6).item()
    assert right < 1e-3 < 5 < wrong
    # only the positions that predict the answer are taught: the question's own positions are free
    att = looking_at(on_square)
    att[0, 38:42] = looking_at(on_circle)[0, 38:42]
    assert pointing_loss([att], batch, [conv], pic, grid=6).item() < 1e-3
    # an answer about no one shape asks for nothing
    conv.answers = [("describe", "A red circle on the left and a blue square on the right.")]
    assert pointing_loss([looking_at(on_square)], batch, [conv], pic, grid=6).item() == 0.0
