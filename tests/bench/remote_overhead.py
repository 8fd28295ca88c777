"""What Parley's remote engine costs over a bare `openai` client, measured side by side in one run.

Parley's own `serve` runs in a second process on a tiny model. Each repeat opens a fresh
conversation (its own opening words and picture), sends it once to warm the server (so both
timed requests meet the same cached prefix), then sends the identical turn twice through each
path, in the order A B B A (B A A B on odd repeats):

- the remote engine (`RemoteEngine.submit`, reply streamed as Token events to a listener, as the
  window and `main.py ask --remote` get it), and
- the bare client (`client.chat.completions.create(stream=True)`, chunks read in a loop).

Also the remote engine's own cost in milliseconds, against an in-process stub server that
answers at once (so nothing else is left in the time): median time to first token, both paths.

Figures: median over repeats of (remote ÷ bare) for the whole turn and for the time to first
token; goal ≤ 1.05 each. `--quick`: fewer repeats and tokens.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import sys
import threading
import time

from _common import ROOT, ratio_line, workdir

from engine.protocol.events import Message, Sampling, Token, Turn, TurnDone, TurnFailed
from engine.remote import RemoteConfig, RemoteEngine
from engine.remote.messages import chat_messages
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.remote_servers import Instant, ParleyServe, StubServer

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
    return box["end"] - t0, box["first"] - t0, ev.reply, ev.stats.queue_s


def bare_messages(text: str | None, picture) -> list[dict]:
    """What a bare client sends: the picture file's bytes as a data URL, then the text."""
    if picture is None:
        return [{"role": "user", "content": "hi"}]
    url = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def through_client(client, model: str, text: str, picture, n: int) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    messages = bare_messages(text, picture)  # a bare client builds its request too
    first, parts = None, []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=n, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                parts.append(choice.delta.content)
    end = time.perf_counter()
    return end - t0, (first or end) - t0, "".join(parts)


def own_cost_ms(runs: int) -> tuple[float, float]:
    """Median time to first token (ms) through the remote engine and the bare client against a
    server that answers at once."""
    import openai

    stub = StubServer(Instant)
    engine = RemoteEngine(RemoteConfig.make(stub.root, "big-vlm")).start()
    client = openai.OpenAI(base_url=stub.root + "/v1", api_key="x", max_retries=0)
    turn = Turn("stub", [Message("user", "hi")], Sampling(max_new_tokens=4))
    e_ttft, c_ttft = [], []
    try:
        for i in range(runs):
            pair = [
                lambda: e_ttft.append(through_engine(engine, Turn("stub", turn.messages, turn.sampling))[1]),
                lambda: c_ttft.append(through_client(client, "big-vlm", None, None, 4)[1]),
            ]
            for run in pair if i % 2 == 0 else pair[::-1]:
                run()
    finally:
        engine.shutdown()
        client.close()
        stub.close()
    return statistics.median(e_ttft) * 1000, statistics.median(c_ttft) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and tokens (a smoke run)")
    args = ap.parse_args()
    repeats, n = (5, 8) if args.quick else (21, 32)
    import openai

    root = workdir("remote")
    model_dir = root / "model"
    # built in a child process: this one stays a lean client (no torch), as `ask --remote` is
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests.fixtures.tiny_models import build_tiny_model; "
            "build_tiny_model('llava', sys.argv[1])",
            str(model_dir),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    server = ParleyServe(model_dir, root / "server-data")
    engine = RemoteEngine(RemoteConfig.make(server.url)).start()
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600)
    warmer = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600)  # its own connection
    try:
        name = client.models.list().data[0].id
        turn_ratios, ttft_ratios, handoffs = [], [], []
        for i in range(repeats):
            pic = make_picture(root / f"p{i}.png", seed=100 + i)
            text = f"Conversation {i}: what is in this picture?"
            history = [Message("user", text, pics(pic))]
            turn = Turn(f"b{i}", history, Sampling(greedy=True, max_new_tokens=n))
            assert chat_messages(turn) == bare_messages(text, pic)  # the very same request
            through_client(warmer, name, text, pic, n)  # warm: both timed paths meet the same cache
            runs = {"e": [], "c": []}
            # A B B A (B A A B on odd repeats): a drift in the shared machine's load hits both
            for path in "ecce" if i % 2 == 0 else "ceec":
                if path == "e":
                    runs["e"].append(through_engine(engine, Turn(turn.conversation_id, history, turn.sampling)))
                else:
                    runs["c"].append(through_client(client, name, text, pic, n))
            e = tuple(statistics.fmean(r[k] for r in runs["e"]) for k in (0, 1)) + (runs["e"][0][2], runs["e"][0][3])
            c = tuple(statistics.fmean(r[k] for r in runs["c"]) for k in (0, 1)) + (runs["c"][0][2],)
            if len({r[2] for r in runs["e"] + runs["c"]}) != 1:
                raise SystemExit(f"repeat {i}: the paths got different replies")
            if e[2] != c[2]:
                raise SystemExit(f"repeat {i}: the two paths got different replies ({e[2]!r} vs {c[2]!r})")
            turn_ratios.append(e[0] / c[0])
            ttft_ratios.append(e[1] / c[1])
            handoffs.append(e[3])
            print(
                f"repeat {i}: remote {e[0] * 1000:.1f} ms (first token {e[1] * 1000:.1f} ms, "
                f"queued {e[3] * 1000:.2f} ms), "
                f"bare client {c[0] * 1000:.1f} ms (first token {c[1] * 1000:.1f} ms)",
                flush=True,
            )
    finally:
        engine.shutdown()
        client.close()
        warmer.close()
        server.close()
    own_e, own_c = own_cost_ms(40 if args.quick else 200)
    turn_ratio, ttft_ratio = statistics.median(turn_ratios), statistics.median(ttft_ratios)
    print(
        f"{repeats} repeats of paired runs (A B B A), {n} tokens per reply, "
        "Parley serve on a tiny LLaVA in a second process"
    )
    print(
        "remote engine: submit -> its worker thread sends the request, "
        f"median {statistics.median(handoffs) * 1000:.2f} ms "
        f"(part of its time to first token)"
    )
    print(
        f"against a server that answers at once: first token {own_e:.2f} ms through the remote engine, "
        f"{own_c:.2f} ms bare (the engine's own cost: {own_e - own_c:+.2f} ms)"
    )
    print(ratio_line("turn latency, remote engine ÷ bare openai client (median)", turn_ratio, at_most=GOAL))
    print(ratio_line("time to first token, remote engine ÷ bare openai client (median)", ttft_ratio, at_most=GOAL))
    print(f"goal turn latency ≤ {GOAL}: {'yes' if turn_ratio <= GOAL else 'no'}")
    print(f"goal time to first token ≤ {GOAL}: {'yes' if ttft_ratio <= GOAL else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
