"""The shipped demo model (resources/models/parley-shapes) loads the standard way and really sees.

Most tests use the folder the standard transformers way (AutoProcessor +
AutoModelForImageTextToText, apply_chat_template, greedy decoding until EOS), as any other tool
would; one goes through Parley's own engine, the path the window takes.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

from engine.platform.paths import DEMO_MODEL as MODEL_DIR
from tests.fixtures.pictures import pics

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def demo():
    from transformers import AutoModelForImageTextToText, AutoProcessor

    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    model = AutoModelForImageTextToText.from_pretrained(MODEL_DIR)
    model.eval()
    yield processor, model
    torch.set_num_threads(threads)  # leave the rest of the test run as it was


def ask(demo, messages, images=()):
    processor, model = demo
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=list(images) or None, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=40)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert new[-1].item() == model.generation_config.eos_token_id, "the reply should end with EOS"
    return processor.tokenizer.decode(new, skip_special_tokens=True)


def user(text, n_images=0):
    return {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}


def picture(kind, colour, size=128, box=(0.25, 0.25, 0.75, 0.75), background="white"):
    im = Image.new("RGB", (size, size), background)
    d = ImageDraw.Draw(im)
    x0, y0, x1, y1 = (round(v * size) for v in box)
    if kind == "circle":
        d.ellipse([x0, y0, x1, y1], fill=colour)
    elif kind == "square":
        d.rectangle([x0, y0, x1, y1], fill=colour)
    else:
        raise ValueError(kind)
    return im


def test_folder_is_small_and_complete():
    names = {p.name for p in MODEL_DIR.iterdir()}
    for need in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "processor_config.json",
        "chat_template.jinja",
        "README.md",
    ):
        assert need in names
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total <= 40 * 10**6  # issue 43's budget


def test_loads_as_llava(demo):
    processor, model = demo
    assert model.config.model_type == "llava"
    assert model.generation_config.eos_token_id == processor.tokenizer.eos_token_id
    assert processor.image_token_id == model.config.image_token_id


def test_template_history_is_a_prefix(demo):
    """A turn's prompt + reply + EOS is exactly how that turn renders in the next turn's history."""
    processor, _ = demo
    first = [user("What is in the picture?", 1)]
    prompt = processor.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    both = first + [
        {"role": "assistant", "content": [{"type": "text", "text": "A red circle in the middle."}]},
        user("What colour is it?"),
    ]
    full = processor.apply_chat_template(both, add_generation_prompt=True, tokenize=False)
    assert full.startswith(prompt + "A red circle in the middle." + processor.tokenizer.eos_token)


def test_red_circle(demo):
    im = picture("circle", "red")
    described = ask(demo, [user("What is in the picture?", 1)], [im]).lower()
    assert "red" in described and "circle" in described, described
    assert "red" in ask(demo, [user("What colour is it?", 1)], [im]).lower()
    assert "circle" in ask(demo, [user("What shape is it?", 1)], [im]).lower()


def test_blue_square_on_grey(demo):
    im = picture("square", "blue", size=96, background=(150, 150, 150))
    described = ask(demo, [user("Describe the picture.", 1)], [im]).lower()
    assert "blue" in described and "square" in described, described


def test_the_drawing_from_issue_17(demo):
    """A 320x240 drawing made in a paint program: a red circle and a blue square on white, neither
    on a grid. The first shipped model said "The circle is not in the picture." and called the
    square red; the next two answered "No." to every yes/no question about it."""
    im = Image.new("RGB", (320, 240), "white")
    d = ImageDraw.Draw(im)
    d.ellipse([40, 80, 120, 160], fill="red")
    d.rectangle([200, 70, 290, 160], fill="blue")
    assert ask(demo, [user("What colour is the circle?", 1)], [im]) == "The circle is red."
    assert ask(demo, [user("What colour is the square?", 1)], [im]) == "The square is blue."
    assert ask(demo, [user("Describe the picture.", 1)], [im]) == (
        "A red circle on the left and a blue square on the right."
    )
    # yes/no questions name the shape first: what there is, or that it is not there
    assert ask(demo, [user("Is the square red?", 1)], [im]) == "The square is blue."
    assert ask(demo, [user("Is there a green star?", 1)], [im]) == "The green star is not in the picture."


def test_the_first_screens_example_questions(demo):
    """Issue 43: the three questions the first screen offers with the demo, asked of the example
    drawing a click puts with them, and the ones a person asks next, are answered word for word."""
    from app.shell.empty_chat import EXAMPLE_QUESTIONS, example_picture

    im = Image.open(example_picture()).convert("RGB")
    answers = [ask(demo, [user(q, 1)], [im]) for q in EXAMPLE_QUESTIONS]
    assert answers == [
        "A blue square at the top right and a red circle at the bottom left.",
        "The red circle is at the bottom left.",
        "The shape on the right is a blue square.",
    ]
    # the questions around them, as a person goes on asking
    assert ask(demo, [user("What shape is on the left?", 1)], [im]) == "The shape on the left is a red circle."
    assert ask(demo, [user("Which shape is at the top?", 1)], [im]) == "The shape at the top is a blue square."
    assert ask(demo, [user("What colour is the square?", 1)], [im]) == "The square is blue."


def test_second_picture_and_follow_up(demo):
    a, b = picture("circle", "red"), picture("square", "blue")
    second = ask(demo, [user("What is in the second picture?", 2)], [a, b]).lower()
    assert "blue" in second and "square" in second, second
    # two turns, each with a picture; the app re-sends the whole conversation
    history = [
        user("What is in the picture?", 1),
        {"role": "assistant", "content": [{"type": "text", "text": "A red circle in the middle."}]},
        user("And this one?", 1),
    ]
    reply = ask(demo, history, [a, b]).lower()
    assert "blue" in reply and "square" in reply, reply


def test_hello_text_only(demo):
    reply = ask(demo, [user("hello")])
    assert reply == "Hello! Send me a picture of shapes and I'll describe it."


def test_red_circle_through_the_engine(tmp_path):
    """The window's path: a picture file in a user message, the engine's prompt, cache and decode."""
    from engine.protocol.events import Message
    from tests.helpers.engine_helpers import ask as engine_ask, expect_done, open_engine

    path = tmp_path / "circle.png"
    picture("circle", "red").save(path)
    engine = open_engine(MODEL_DIR, tmp_path / "data")
    try:
        first = [Message("user", "What is in the picture?", pics(path))]
        reply = expect_done(engine_ask(engine, "c", first, 40)).reply
        assert "red circle" in reply.lower(), reply
        follow_up = first + [Message("assistant", reply), Message("user", "What shape is it?")]
        assert "circle" in expect_done(engine_ask(engine, "c", follow_up, 40)).reply.lower()
    finally:
        engine.shutdown()
