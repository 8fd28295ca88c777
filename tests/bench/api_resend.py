"""What the OpenAI-compatible API costs over typing in the window, measured in one run.

A client of the API re-sends the whole conversation, pictures included (as base64 data URLs),
every turn; the window sends only a conversation id. Both reach the same engine, which finds
the API client's session by prefix, so turn 3 should cost about the same either way:

- turn 3 of a re-sent picture conversation through the API (the real `openai` client in its own
  process, non-streaming and streaming; the server in the engine's process, as in the app) ÷ the
  same turn typed through the engine directly (`ask(engine, cid, messages)`, as the window does);
  goal ≤ 1.1.
Each repeat is a fresh conversation (its own opening words), the same through every path (the
replies are checked equal, so all do the same work); the order of the three paths rotates, and
the figure is the median of the per-conversation ratios (the machine may be shared).

    python tests/bench/api_resend.py [--repeats 12] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import time

from _common import build_big_tower_model, parse_args, ratio_line, workdir

from engine.api import ApiServer
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

NEW = 16
FOLLOW_UPS = ["What colours do you see?", "Which shape is the largest?"]

CLIENT = r"""
import json, sys, time
import openai

client = None
for line in sys.stdin:
    job = json.loads(line)
    client = client or openai.OpenAI(base_url=job["base_url"], api_key="unused", max_retries=0)
    convo = [{"role": "user", "content": [{"type": "text", "text": job["opening"]},
                                          {"type": "image_url", "image_url": {"url": job["url"]}}]}]
    for q in job["follow_ups"] + [None]:
        t0 = time.perf_counter()
        kw = dict(model=job["model"], messages=convo, max_tokens=job["new"], temperature=0)
        if job["stream"]:
            parts, usage = [], None
            for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                if ch.choices:
                    parts.append(ch.choices[0].delta.content or "")
                if ch.usage:
                    usage = ch.usage
            reply = "".join(parts)
        else:
            resp = client.chat.completions.create(**kw)
            reply, usage = resp.choices[0].message.content, resp.usage
        t = time.perf_counter() - t0
        if q is not None:
            convo += [{"role": "assistant", "content": reply}, {"role": "user", "content": q}]
    print(json.dumps({"t": t, "reply": reply, "usage": usage.model_dump()}), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=12, help="conversations per path")
    args = parse_args(ap, quick={"repeats": 3})
    d = workdir("api")
    model_dir = build_big_tower_model(d / "model", quick=args.quick)
    pic = make_picture(d / "p.png", 1, size=(640, 480))
    url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
    engine = open_engine(model_dir, d / "data", elastic=True, elastic_idle_s=3600)
    server = ApiServer(engine, "127.0.0.1", 0).start()

    def window(opening: str):
        """The window's way: the engine keeps the conversation under its id."""
        msgs = [Message("user", opening, pics(pic))]
        for q in FOLLOW_UPS + [None]:
            t0 = time.perf_counter()
            done = expect_done(ask(engine, opening, msgs, NEW))
            t = time.perf_counter() - t0
            if q is not None:
                msgs += [Message("assistant", done.reply), Message("user", q)]
        return t, done.reply, len(done.token_ids)

    # the API client is another program, as it would be: its own process, talking HTTP
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )

    def api(opening: str, stream: bool):
        """An API client's way: the whole conversation, picture included, every turn."""
        child.stdin.write(
            json.dumps(
                {
                    "base_url": server.url,
                    "model": engine.loaded.name,
                    "url": url,
                    "opening": opening,
                    "stream": stream,
                    "follow_ups": FOLLOW_UPS,
                    "new": NEW,
                }
            )
            + "\n"
        )
        out = json.loads(child.stdout.readline())
        return out["t"], out["reply"], out["usage"], engine.last_turn_stats

    times = {"window": [], "api": [], "stream": []}
    cached, prefill, loads = [], [], 0
    try:
        window("warm up")
        api("warm up", False)
        for r in range(args.repeats):
            opening = f"Conversation {r}: what is in this picture?"
            order = ["window", "api", "stream"]
            order = order[r % 3 :] + order[: r % 3]  # rotate, so drift in machine load hits all three alike
            got = {}
            for kind in order:
                got[kind] = window(opening) if kind == "window" else api(opening, kind == "stream")
                times[kind].append(got[kind][0])
            _, want, n = got["window"]
            for kind in ("api", "stream"):
                _, reply, usage, stats = got[kind]
                # the same conversation as the window's, so the same work: the same reply
                assert reply == want and usage["completion_tokens"] == n, (kind, reply, want)
                cached.append(usage["prompt_tokens_details"]["cached_tokens"])
                prefill.append(stats.prefill_tokens)
                loads += stats.encoder_loads
    finally:
        child.stdin.close()
        child.wait(30)
        server.stop()
        engine.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = {
        k: statistics.median(a / w for a, w in zip(times[k], times["window"], strict=True)) for k in ("api", "stream")
    }
    print(
        f"picture 640×480 PNG ({pic.stat().st_size // 1024} KiB, re-sent as base64 each turn); "
        f"{NEW} new tokens; {args.repeats} conversations"
    )
    print(
        f"turn 3 medians: window {med['window'] * 1000:.1f} ms | API {med['api'] * 1000:.1f} ms | "
        f"API streaming {med['stream'] * 1000:.1f} ms; API cached tokens {statistics.median(cached):.0f}, "
        f"prefilled {statistics.median(prefill):.0f}, encoder loads {loads}"
    )
    print(ratio_line("API turn 3 / window turn 3 (median of paired ratios)", paired["api"], at_most=1.1))
    print(ratio_line("API streaming turn 3 / window turn 3 (median of paired ratios)", paired["stream"], at_most=1.1))
    print(
        f"best of each: API / window {min(times['api']) / min(times['window']):.3f}, "
        f"streaming / window {min(times['stream']) / min(times['window']):.3f}"
    )


if __name__ == "__main__":
    main()
