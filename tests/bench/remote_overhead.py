"""What Parley's remote engine costs over a bare `openai` client, measured side by side in one run.

Parley's own `serve` runs in a second process on a tiny model. Each repeat opens a fresh
conversation (its own opening words and picture), sends it once to warm the server (so both
timed requests meet the same cached prefix), then sends the identical turn through both paths,
in alternating order:

- the remote engine (`RemoteEngine.submit`, reply streamed as Token events to a listener, as the
  window and `main.py ask --remote` get it), and
- the bare client (`client.chat.completions.create(stream=True)`, chunks read in a loop).

Figures: median over repeats of (remote ÷ bare) for the whole turn and for the time to first
token; goal ≤ 1.05 each. `--quick`: fewer repeats and tokens.
"""
from __future__ import annotations

import argparse
import base64
import statistics
import threading
import time

from _common import ratio_line, workdir

from engine.events import Message, Sampling, Token, Turn, TurnDone, TurnFailed
from engine.remote import RemoteConfig, RemoteEngine
from engine.remote.messages import chat_messages
from tests.fixtures.pictures import make_picture
from tests.fixtures.tiny_models import build_tiny_model
from tests.remote_servers import ParleyServe

GOAL = 1.05


def through_engine(engine: RemoteEngine, turn: Turn) -> tuple[float, float, str, float]:
    """(turn seconds, first-token seconds, reply, seconds queued before the worker thread took
    the turn) for one turn through the remote engine."""
    done = threading.Event()
    box: dict = {}

    def listen(ev):
        if getattr(ev, "turn_id", None) != turn.turn_id:
            return
        if isinstance(ev, Token) and "first" not in box:
            box["first"] = time.perf_counter()
        elif isinstance(ev, (TurnDone, TurnFailed)):
            box["end"], box["ev"] = time.perf_counter(), ev
            done.set()

    engine.add_listener(listen)
    try:
        turn.turn_id = engine.new_turn_id()
        t0 = time.perf_counter()
        engine.submit(turn)
        done.wait(600)
    finally:
        engine.remove_listener(listen)
    ev = box["ev"]
    if isinstance(ev, TurnFailed):
        raise SystemExit(f"remote engine failed: {ev.message}")
    return box["end"] - t0, box["first"] - t0, ev.reply, ev.stats.get("queue_s", 0.0)


def through_client(client, model: str, messages: list[dict], n: int) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    first, parts = None, []
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=n, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                parts.append(choice.delta.content)
    end = time.perf_counter()
    return end - t0, (first or end) - t0, "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and tokens (a smoke run)")
    args = ap.parse_args()
    repeats, n = (5, 8) if args.quick else (21, 32)
    import openai

    root = workdir("remote")
    model_dir = build_tiny_model("llava", root / "model")
    server = ParleyServe(model_dir, root / "server-data")
    engine = RemoteEngine(RemoteConfig.make(server.url)).start()
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600)
    try:
        name = client.models.list().data[0].id
        turn_ratios, ttft_ratios, handoffs = [], [], []
        for i in range(repeats):
            pic = make_picture(root / f"p{i}.png", seed=100 + i)
            history = [Message("user", f"Conversation {i}: what is in this picture?", [str(pic)])]
            turn = Turn(f"b{i}", history, Sampling(greedy=True, max_new_tokens=n))
            messages = chat_messages(turn)
            through_client(client, name, messages, n)  # warm: both timed runs meet the same cache
            if i % 2:
                c = through_client(client, name, messages, n)
                e = through_engine(engine, Turn(turn.conversation_id, history, turn.sampling))
            else:
                e = through_engine(engine, Turn(turn.conversation_id, history, turn.sampling))
                c = through_client(client, name, messages, n)
            if e[2] != c[2]:
                raise SystemExit(f"repeat {i}: the two paths got different replies ({e[2]!r} vs {c[2]!r})")
            turn_ratios.append(e[0] / c[0])
            ttft_ratios.append(e[1] / c[1])
            handoffs.append(e[3])
            print(f"repeat {i}: remote {e[0] * 1000:.1f} ms (first token {e[1] * 1000:.1f} ms), "
                  f"bare client {c[0] * 1000:.1f} ms (first token {c[1] * 1000:.1f} ms)", flush=True)
    finally:
        engine.shutdown()
        client.close()
        server.close()
    turn_ratio, ttft_ratio = statistics.median(turn_ratios), statistics.median(ttft_ratios)
    print(f"{repeats} paired runs, {n} tokens per reply, Parley serve on a tiny LLaVA in a second process")
    print(f"remote engine: submit -> its worker thread sends the request, median {statistics.median(handoffs) * 1000:.2f} ms "
          f"(part of its time to first token)")
    print(ratio_line("turn latency, remote engine ÷ bare openai client (median)", turn_ratio, f"≤ {GOAL}"))
    print(ratio_line("time to first token, remote engine ÷ bare openai client (median)", ttft_ratio, f"≤ {GOAL}"))
    print(f"goal turn latency ≤ {GOAL}: {'yes' if turn_ratio <= GOAL else 'no'}")
    print(f"goal time to first token ≤ {GOAL}: {'yes' if ttft_ratio <= GOAL else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
