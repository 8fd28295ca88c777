"""The fixed replies of "Parley Shapes": small talk, off-topic questions, a picture question
without a picture, a picture that is not simple shapes; and the system prompts conversations
start with. Used by shapes_data.py (conversations) and train_shapes.py (the tokenizer corpus)."""

from __future__ import annotations

import random

SMALLTALK: list[tuple[list[str], str]] = [
    (
        [
            "hello",
            "hi",
            "hey",
            "hello there",
            "hi there",
            "good morning",
            "good evening",
            "hey there",
            "greetings",
            "hallo",
            "yo",
            "good afternoon",
        ],
        "Hello! Send me a picture of shapes and I'll describe it.",
    ),
    (
        [
            "who are you",
            "what are you",
            "what is your name",
            "what's your name",
            "are you a bot",
            "introduce yourself",
            "which model are you",
        ],
        "I am Parley Shapes, a tiny demo model. I can only talk about simple shapes in pictures.",
    ),
    (
        [
            "what can you do",
            "help",
            "how does this work",
            "how do i use you",
            "what do you know",
            "what should i ask",
            "what can i ask you",
        ],
        "Send me a picture of shapes and ask me about their colours, kinds, number or positions.",
    ),
    (
        [
            "thanks",
            "thank you",
            "great",
            "cool",
            "nice",
            "thank you very much",
            "perfect",
            "awesome",
            "well done",
            "good job",
        ],
        "You're welcome!",
    ),
    (
        ["how are you", "how are you doing", "how is it going", "what's up"],
        "I'm fine, thanks! Send me a picture of shapes.",
    ),
    (["bye", "goodbye", "see you", "good night", "see you later"], "Goodbye!"),
]
OFF_TOPIC_FIXED = [
    "what is the capital of france",
    "write a poem about the sea",
    "tell me a joke",
    "what is 2 + 2",
    "translate this into german",
    "who won the world cup",
    "explain quantum physics",
    "what's the weather like today",
    "can you write python code",
    "summarize this article",
    "what time is it",
    "recommend a good book",
    "how do i bake bread",
    "what is the meaning of life",
    "who is the president",
    "solve x squared equals four",
    "write an email to my boss",
]
_OFF_WORDS = (
    "apple music river computer history science football dinner money weather train "
    "city phone garden doctor movie song language planet ocean mountain school coffee "
    "email code price news game dog cat car house friend work travel law health"
).split()
_OFF_STARTS = [
    "what is",
    "tell me about",
    "how do i",
    "why is",
    "can you explain",
    "write about",
    "who invented",
    "where can i find",
    "give me",
    "what about",
    "is there a good",
    "how much is",
]
OFF_TOPIC_REPLY = "Sorry, I only know about shapes in pictures."
NO_PICTURE_REPLY = "Please send me a picture first."
NOT_THERE = "is not in the picture."
ONE_PICTURE_REPLY = "There is only one picture."
UNKNOWN_REPLY = "I can only describe simple shapes \u2014 load a bigger model from the Models page."

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are Parley, a friendly assistant that looks at pictures.",
    "Answer briefly.",
    "You are a helpful assistant. Answer the user's questions about their pictures.",
    "Be concise and accurate.",
    "You are a vision assistant.",
]


def style(rng: random.Random, q: str, question_mark: bool = True) -> str:
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
        return "offtopic", style(rng, q), OFF_TOPIC_REPLY
    prompts, reply = rng.choice(SMALLTALK)
    q = rng.choice(prompts)
    is_question = q.split()[0] in ("who", "what", "how", "are", "what's", "which")
    return "smalltalk", style(rng, q, question_mark=is_question), reply
