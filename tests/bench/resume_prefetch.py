"""Resume before the person asks, at the published Qwen2-VL-2B shape (bf16 on CPU): after a
restart, select a chat whose KV is on the SSD, wait until its mark says "in memory", then send.

- first-token time of that turn ÷ the same turn on a chat that was never spilled (hot all along),
  measured side by side in one run: goal ≤ 1.15;
- the resume estimate the window showed before the restore (ChatMemoryReport.resume_s: the chat's
  bytes at the restore rate measured on this machine) ÷ the restore's measured time: goal within
  0.5–2.

The first pair runs right after the restart, its estimate from the one-blob probe the engine makes
when no restore was timed yet; later pairs spill the chat again (Spill now), open another chat and
come back, each with a new follow-up question of the same length (so each turn prefills only its
question, as after a real pause). The chats hold a picture and distinct filler words (no repeated
text for prompt-lookup drafts to find); the never-spilled chat has its own picture and words of
the same length, so it shares no KV block with the spilled one.

    python tests/bench/resume_prefetch.py [--tokens 2048] [--repeats 5] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from _common import distinct_words, parse_args, precision, ratio_line, workdir

from engine.local.prompt import render
from engine.protocol.events import ChatMemoryReport, KVPlace, Message
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.published_configs import build_published, spec_for
from tests.helpers.engine_helpers import ask, expect_done, open_engine

SHAPE = "Qwen2-VL-2B-Instruct"
QUICK = {"layers": 2, "vision_layers": 2, "vocab_size": 4096}
NEW = 8
QUESTION_WORDS = 12
# the same reply text in both chats, so their follow-ups prefill the same tokens (a generated one
# would differ between the chats, and so would how it tokenizes once sent back)
REPLY = "I see the picture and I have read your notes."


class Places:
    """The engine's latest word on where each chat's KV is (what the sidebar's marks show)."""

    def __init__(self, engine):
        self.last: ChatMemoryReport | None = None
        self._cv = threading.Condition()
        engine.add_listener(self._on)

    def _on(self, ev) -> None:
        if isinstance(ev, ChatMemoryReport):
            with self._cv:
                self.last = ev
                self._cv.notify_all()

    def wait(self, cid: str, place: KVPlace, timeout: float = 600.0):
        with self._cv:
            ok = self._cv.wait_for(lambda: self.last is not None and self.last.of(cid).place == place, timeout)
        if not ok:
            raise RuntimeError(f"{cid} never reached {place}: {self.last}")
        return self.last.of(cid)


def opening(engine, words: list[str], picture, n_tokens: int) -> list[Message]:
    """A first message (a picture and filler words) whose prompt is about `n_tokens` long."""
    processor = engine.loaded.processor
    text, used = "Here is a picture and my notes about it:", 0
    msgs = [Message("user", text, pics(picture))]
    per = max(1, len(processor.tokenizer(render(processor, msgs, None))["input_ids"]))
    while per < n_tokens and used < len(words):
        step = max(1, min(len(words) - used, (n_tokens - per) // 2))
        text += " " + " ".join(words[used : used + step])
        used += step
        msgs = [Message("user", text, pics(picture))]
        per = len(processor.tokenizer(render(processor, msgs, None))["input_ids"])
    return msgs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="the chats' length before the follow-up")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = parse_args(ap, quick={"tokens": 300, "repeats": 1})
    reduce = QUICK if args.quick else {}
    spec = spec_for(SHAPE, **reduce)
    model_dir = build_published(SHAPE, **reduce)
    d = workdir("resume-prefetch")
    data = d / "data"
    settings = dict(**precision(args.quick), spill_idle_s=86400, elastic_idle_s=86400)

    # the chat to be spilled, built before the restart; the exit writes its KV to the SSD
    engine = open_engine(model_dir, data, **settings)
    try:
        tok = engine.loaded.processor.tokenizer
        words = distinct_words(tok, 2 * args.tokens + 4 * QUESTION_WORDS * (args.repeats + 1), seed=1)
        questions = [" ".join(words[-QUESTION_WORDS * (i + 1) :][:QUESTION_WORDS]) + "?" for i in range(args.repeats)]
        spilled_msgs = opening(engine, words[: args.tokens], make_picture(d / "a.png", 1, size=(448, 336)), args.tokens)
        expect_done(ask(engine, "spilled", spilled_msgs, NEW))
        spilled_msgs.append(Message("assistant", REPLY))
    finally:
        engine.shutdown()

    # the restart
    engine = open_engine(model_dir, data, **settings)
    places = Places(engine)
    rows = []
    try:
        hot_msgs = opening(
            engine, words[args.tokens : 2 * args.tokens], make_picture(d / "b.png", 2, size=(448, 336)), args.tokens
        )
        expect_done(ask(engine, "hot", hot_msgs, NEW))  # never spilled: hot from here on
        hot_msgs.append(Message("assistant", REPLY))
        for r, question in enumerate(questions):
            engine.open_chat("hot")
            engine.request_memory_report()
            before = places.wait("spilled", KVPlace.ON_SSD)  # the estimate the window shows now
            t0 = time.perf_counter()
            engine.open_chat("spilled")  # selected: restored in the background
            places.wait("spilled", KVPlace.HOT)
            in_memory_s = time.perf_counter() - t0
            s = expect_done(ask(engine, "spilled", spilled_msgs + [Message("user", question)], NEW)).stats
            restore_s = s.restore_ahead_s + s.restore_s
            engine.open_chat("hot")
            h = expect_done(ask(engine, "hot", hot_msgs + [Message("user", question)], NEW)).stats
            rows.append(
                {
                    "repeat": r + 1,
                    "after_restart": r == 0,
                    "estimate_s": before.resume_s,
                    "restore_s": restore_s,
                    "select_to_hot_s": in_memory_s,
                    "kv_bytes": before.kv_bytes,
                    "tokens": before.tokens,
                    "ttft_resumed_s": s.first_token_s,
                    "ttft_hot_s": h.first_token_s,
                    "restored_tokens": s.restored_tokens,
                    "prefill_tokens": s.prefill_tokens,
                    "hot_prefill_tokens": h.prefill_tokens,
                    "prefill_resumed_s": s.prefill_s,
                    "prefill_hot_s": h.prefill_s,
                }
            )
            engine.spill_now("spilled")  # for the next pair: on the SSD again
            places.wait("spilled", KVPlace.ON_SSD)
    finally:
        engine.shutdown()

    t = spec["text"]
    ratio = statistics.median(x["ttft_resumed_s"] / x["ttft_hot_s"] for x in rows)
    est = [x["estimate_s"] / x["restore_s"] for x in rows if x["estimate_s"]]
    print(
        f"shape {SHAPE}{' (quick: ' + str(reduce) + ')' if reduce else ''}: {t['num_hidden_layers']}-layer "
        f"{t['hidden_size']}-wide LM, bf16 on CPU"
    )
    print(
        f"chats of {rows[0]['tokens']:,} tokens ({rows[0]['kv_bytes'] / (1 << 20):.1f} MiB of KV on the SSD), "
        f"a picture each; {len(rows)} follow-up{'s' if len(rows) != 1 else ''} of {QUESTION_WORDS} words, "
        f"{NEW} new tokens; pair 1 right "
        "after the restart"
    )
    for x in rows:
        print(
            f"  pair {x['repeat']}: selected -> in memory {x['select_to_hot_s']:.2f} s "
            f"(restore {x['restore_s']:.3f} s,"
            f" estimate shown {x['estimate_s'] if x['estimate_s'] is None else round(x['estimate_s'], 3)} s); "
            f"first token {x['ttft_resumed_s']:.2f} s resumed vs {x['ttft_hot_s']:.2f} s never spilled "
            f"(prefilled {x['prefill_tokens']} vs {x['hot_prefill_tokens']} tokens "
            f"in {x['prefill_resumed_s']:.2f} vs "
            f"{x['prefill_hot_s']:.2f} s; {x['restored_tokens']:,} restored)"
        )
    print(ratio_line("first token after select-and-restore / never spilled (median)", ratio, at_most=1.15))
    if est:
        print(
            ratio_line("resume estimate shown / measured restore, after the restart", est[0], at_least=0.5, at_most=2.0)
        )
        print(
            ratio_line(
                "resume estimate shown / measured restore, median of all pairs",
                statistics.median(est),
                at_least=0.5,
                at_most=2.0,
            )
        )
        print(
            ratio_line(
                "resume estimate shown / measured restore, lowest",
                min(est),
                note=f"highest {max(est):.3f}; the same restore took "
                f"{min(x['restore_s'] for x in rows):.3f}-{max(x['restore_s'] for x in rows):.3f} s",
            )
        )
        times = [x["ttft_resumed_s"] / x["ttft_hot_s"] for x in rows]
        print(
            ratio_line("first token resumed / never spilled, lowest pair", min(times), note=f"highest {max(times):.3f}")
        )
    else:
        print("resume estimate shown / measured restore: 0.000  (goal within 0.5-2: no)  [no estimate was shown]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": SHAPE, "quick": bool(args.quick), "pairs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
