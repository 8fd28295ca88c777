"""Whether a request's text can fit the loaded model's context, decided before the engine sees it.

The engine tokenizes a turn on its model thread, so a huge text would stall every other client
there. Two checks run first, on an API worker thread:
1. a character bound, free: no token of the vocabulary spells more than `longest` characters, so
   a text longer than context x longest cannot fit;
2. for a text long enough that tokenizing it matters, a count with a private copy of the
   tokenizer (never the one the model thread uses), piece by piece, stopping as soon as the count
   passes the context: the work per request is bounded by the context, not by the body.
Whatever passes is checked exactly by the engine, whose tokenizing is then bounded too.
"""

from __future__ import annotations

import threading
import weakref

from ..protocol.events import Message
from .errors import bad

PIECE_CHARS = 1 << 16  # tokenized one at a time: other threads get the interpreter in between
CHEAP_CHARS_PER_TOKEN = 4  # below context x this many characters the engine's own check is cheap


def _pieces(text: str):
    """`text` in pieces of about PIECE_CHARS, cut before a space where possible (where the
    tokenizers' pre-tokenizers cut too, so the pieces' counts add up to the whole's)."""
    start = 0
    while start < len(text):
        end = min(len(text), start + PIECE_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + PIECE_CHARS // 2, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


class PromptMeter:
    """`max_chars(loaded)`: the character bound; `check(messages, loaded)`: refuses (400
    context_length_exceeded) a text that cannot fit. Call both off the event loop."""

    def __init__(self):
        self._lock = threading.Lock()
        self._model = None  # weak reference to the LoadedModel the copy below belongs to
        self._tokenizer = None
        self._longest = None

    def _for(self, loaded):
        with self._lock:
            if self._model is None or self._model() is not loaded:
                backend = getattr(loaded.tokenizer, "backend_tokenizer", None)
                if backend is not None:
                    from tokenizers import Tokenizer

                    tok = Tokenizer.from_str(backend.to_str())  # its own copy: no state shared across threads
                    self._longest = max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=1)
                    self._tokenizer = tok
                else:
                    self._tokenizer, self._longest = None, None
                self._model = weakref.ref(loaded)  # weak: a replaced model must still be freed
            return self._tokenizer, self._longest

    def max_chars(self, loaded) -> int | None:
        context = loaded.context_tokens
        _, longest = self._for(loaded)
        if not context or not longest:
            return None
        return context * longest

    def check(self, messages: list[Message], loaded) -> int | None:
        """Counts tokens (a lower bound of the prompt's: the template and pictures only add) when
        the text is long; refuses it once the count passes the context. -> tokens counted, or None
        when the text is short enough to leave to the engine."""
        context = loaded.context_tokens
        tok, _ = self._for(loaded)
        n_chars = sum(len(m.text) for m in messages)
        if not context or tok is None or n_chars <= context * CHEAP_CHARS_PER_TOKEN:
            return None
        counted = slack = 0
        for m in messages:
            for piece in _pieces(m.text):
                counted += len(tok.encode(piece, add_special_tokens=False).ids)
                slack += 1  # a cut between pieces may split one token in two: never refuse on that
                if counted - slack >= context:
                    raise bad(
                        f"The messages are more than {context} tokens long, more than the model's context "
                        f"of {context} tokens.",
                        "messages",
                        "context_length_exceeded",
                    )
        return counted
