"""What the OpenAI-compatible API costs over typing in the window, measured in one run.

A client of the API re-sends the whole conversation, pictures included (as base64 data URLs),
every turn; the window sends only a conversation id. Both reach the same engine, which finds
the API client's session by prefix, so turn 3 should cost about the same either way:

- turn 3 of a re-sent picture conversation through the API (real `openai` client, non-streaming
  and streaming) ÷ the same turn typed through the engine directly (`ask(engine, cid, messages)`,
  as the window does); goal ≤ 1.1.
Each repeat is a fresh conversation (its own opening words), the same through both paths (the
replies are checked equal, so both do the same work), interleaved window / API / API streaming.
"""
from __future__ import annotations

import base64
import statistics
import time

from _common import ratio_line, workdir

import openai

from engine.api import ApiServer
from engine.events import Message
from tests.engine_helpers import ask, expect_done, open_engine
from tests.fixtures.pictures import make_picture
from tests.fixtures.tiny_models import build_tiny_model

REPEATS = 9
NEW = 16
FOLLOW_UPS = ["What colours do you see?", "Which shape is the largest?"]


def main() -> None:
    d = workdir("api")
    model_dir = build_tiny_model(
        "llava", d / "model", image_size=224, patch_size=14,
        vision={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        text={"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4},
    )
    pic = make_picture(d / "p.png", 1, size=(640, 480))
    url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
    engine = open_engine(model_dir, d / "data", elastic=True, elastic_idle_s=3600)
    server = ApiServer(engine, "127.0.0.1", 0).start()
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    api_t, stream_t, win_t, cached, prefill, loads = [], [], [], [], [], 0
    try:
        expect_done(ask(engine, "warm", [Message("user", "warm up", [str(pic)])], NEW))
        for r in range(REPEATS):
            opening = f"Conversation {r}: what is in this picture?"
            # ---- the window: the engine keeps the conversation under its id
            msgs = [Message("user", opening, [str(pic)])]
            for i, q in enumerate(FOLLOW_UPS + [None]):
                t0 = time.perf_counter()
                done = expect_done(ask(engine, f"win{r}", msgs, NEW))
                t = time.perf_counter() - t0
                if q is None:
                    win_t.append(t)
                    win_reply, win_n = done.reply, len(done.token_ids)
                else:
                    msgs += [Message("assistant", done.reply), Message("user", q)]
            # ---- an API client: re-sends everything each turn
            for mode, times in (("plain", api_t), ("stream", stream_t)):
                convo = [{"role": "user", "content": [{"type": "text", "text": opening},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]
                for q in FOLLOW_UPS + [None]:
                    t0 = time.perf_counter()
                    if mode == "plain":
                        resp = client.chat.completions.create(model="m", messages=convo, max_tokens=NEW,
                                                              temperature=0)
                        reply, usage = resp.choices[0].message.content, resp.usage
                    else:
                        parts, usage = [], None
                        for ch in client.chat.completions.create(model="m", messages=convo, max_tokens=NEW,
                                                                 temperature=0, stream=True,
                                                                 stream_options={"include_usage": True}):
                            if ch.choices:
                                parts.append(ch.choices[0].delta.content or "")
                            if ch.usage:
                                usage = ch.usage
                        reply = "".join(parts)
                    t = time.perf_counter() - t0
                    if q is None:
                        # the same conversation as the window's, so the same work: same reply
                        assert reply == win_reply and usage.completion_tokens == win_n, (reply, win_reply)
                        times.append(t)
                        s = engine.last_turn_stats
                        cached.append(usage.prompt_tokens_details.cached_tokens)
                        prefill.append(s["prefill_tokens"])
                        loads += s["encoder_loads"]
                    else:
                        convo += [{"role": "assistant", "content": reply}, {"role": "user", "content": q}]
    finally:
        server.stop()
        engine.shutdown()
    a, s, w = statistics.median(api_t), statistics.median(stream_t), statistics.median(win_t)
    print(f"picture 640×480 PNG ({pic.stat().st_size // 1024} KiB, re-sent as base64 each turn); "
          f"{NEW} new tokens; medians of {REPEATS}")
    print(f"turn 3: window {w * 1000:.1f} ms | API {a * 1000:.1f} ms | API streaming {s * 1000:.1f} ms | "
          f"API cached tokens {statistics.median(cached):.0f}, prefilled {statistics.median(prefill):.0f}, "
          f"encoder loads {loads}")
    print(ratio_line("API turn 3 / window turn 3", a / w, "<= 1.1"))
    print(ratio_line("API streaming turn 3 / window turn 3", s / w, "<= 1.1"))


if __name__ == "__main__":
    main()
