"""A chat's name: its first question at once, then (once the first reply is in) what the reply found.

Four chats that all began "What is in this picture?" were four identical names. The reply's
content words tell them apart: "Red circle, blue square, green triangle"; a specific question keeps
its words and gains the answer's: "Where is the red circle? Top left". No model call: words of the
question and the reply, function words and picture words left out.
"""

from __future__ import annotations

import re

from .history import DEFAULT_TITLE

MAX_CHARS = 48  # a question's own name
MAX_REPLY_TITLE_CHARS = 40  # about what a 260 px sidebar shows in bold
MAX_QUESTION_CHARS = 34  # a longer question names its chat well enough alone

# words that say nothing about what a picture holds
STOP = set(
    """
a an the this that these those it its it's there here is are was were be been being am do does did
has have had can could would should will shall may might must i me my we our you your he she they them
his her their what which who whom whose where when why how whether if then than so such and or but nor
of in on at to from by with without into onto over under above below near beside besides behind between
next about around across along through up down out off for as also too very just only really quite
some any each every all both either neither several many much more most few little no not
image images picture pictures photo photos photograph pic scene shown shows show showing see seen sees
looks look looking appears appear appearing depicts depicted contains containing visible there's
please describe tell explain one ones thing things kind sort
""".split()
)
# place words: an answer to "where", but not what a description is about
PLACE = set(
    "top bottom left right middle centre center corner side upper lower front back background foreground edge".split()
)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*|[^\sA-Za-z0-9]")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")


def title_from(text: str, pictures: int) -> str:
    """The name a chat gets from its first question, before any reply."""
    line = re.sub(r"\s+", " ", text).strip()
    if not line:
        return "Picture" if pictures == 1 else ("Pictures" if pictures else DEFAULT_TITLE)
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1].rstrip() + "…"


def _phrases(text: str) -> list[list[str]]:
    """Runs of content words, in order; a function word or punctuation ends a run."""
    out: list[list[str]] = []
    run: list[str] = []
    for token in _TOKEN.findall(text):
        word = token.lower()
        if _WORD.fullmatch(token) and word not in STOP:
            run.append(word)
        elif run:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return out


def title_from_reply(question: str, reply: str) -> str | None:
    """The chat's name once its first reply is in, or None when the reply adds nothing nameable."""
    asked = {w for phrase in _phrases(question) for w in phrase}
    wants_place = bool(asked & PLACE) or "where" in question.lower().split()
    found: list[str] = []
    for phrase in _phrases(reply):
        words = [w for w in phrase if w not in asked]
        if not words or (not wants_place and set(words) <= PLACE):
            continue
        text = " ".join(words)
        if text not in found:
            found.append(text)
    if not found:
        return None
    head = re.sub(r"\s+", " ", question).strip() if asked else ""
    if len(head) > MAX_QUESTION_CHARS:
        return None
    if head and head[-1] not in "?:.!":
        head += ":"
    title = head
    for text in found:
        piece = text if not title else (f"{title} {text}" if title == head else f"{title}, {text}")
        if len(piece) > MAX_REPLY_TITLE_CHARS:
            break
        title = piece
    if title == head:  # not even one finding fits beside the question
        return None
    title = title if head else title[0].upper() + title[1:]
    if head:
        rest = title[len(head) + 1 :]
        title = f"{head} {rest[0].upper()}{rest[1:]}"
    return title
