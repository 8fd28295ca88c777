"""A day of picture chats, Parley against llama-server, turn by turn: the waiting a person has
over a whole day of use, beside the server that LM Studio, Jan and Ollama run.

The day (DAY below; --quick: QUICK_DAY) is four conversations and 42 turns with 12 pictures and a
4-page PDF (its pages are pictures: 16 in all), eight of them re-sent in later turns or other chats,
33 switches between chats, three idle gaps and two restarts. Every turn re-sends the whole
conversation, pictures included, as the apps do. Replies are greedy and exactly `--new` tokens on
both sides (the random weights never pick an end token in Parley, and llama-server is asked to
ignore it); the model is the same: Qwen2-VL-2B-Instruct's published shape with seeded random
weights, and on llama.cpp's side its bf16 GGUF and f16 mmproj from llama.cpp's own converter
(tests/bench/_llamacpp.py). Both run on `--threads` (default: torch's, i.e. Parley's) threads.
Random weights give random token ids, whose text does not come back as the same tokens when sent
again (on either side), so the history carries a scripted reply of `--new` words in place of what
was generated: both sides then see the same prompt every turn (the table shows both counts).

Parley runs as the window runs it: an `Engine` (engine/local/engine.py) in this process, the
model loaded with `load_blocking`, each turn a `Turn` holding the whole conversation (pictures as
PictureRefs, PDF pages as PageRefs, each hashed where it came in) submitted with `run_blocking`,
as app/connection/bridge.py and `main.py replay` submit theirs; a switch to another chat calls
`open_chat`, as the window does when a chat is selected (it keeps the open chat out of the idle
spill and restores a chat on the SSD ahead of its turn when there is time, which there is not
here: every turn is sent the moment the previous one ends). A restart is what quitting and
starting the app does: `shutdown` (the exit spills what is hot) and a new `Engine` on the same
data folder, with the model loaded again. Parley's settings are the shipped ones but for: bf16
(the figures' precision), prompt-lookup drafts off (random weights repeat themselves, which
drafts would turn into a speed no real reply gets; llama-server has none), and the idle timers
shortened with the day: `spill_idle_s` is `--idle` (120 s shipped) and `elastic_idle_s` half of
it (60 s shipped), so a chat left for a couple of turns is spilled, and the encoder unloaded, as
with real pauses between turns. An idle gap lasts until the engine reports every chat but the open
one on the SSD and the encoder unloaded: the idle spill happens as it would, on its own timer.

llama-server (`make bench-tools` builds it from the pinned llama-cpp-python sdist) runs twice:
- as shipped: only model, mmproj, threads and port given (logs at trace level, to count pictures
  encoded and see its caches at work): automatic slots (4) over a unified KV cache, `cache_prompt`
  on, the 8 GiB host-memory prompt cache; a restart keeps nothing.
- tuned, as a careful user could script it: a slot per chat (`-np` chats of 8,192 tokens each, each
  request sent with its chat's `id_slot`), `--cache-reuse 256` (the server turns it off for multimodal models, and the
  report says so), and `--slot-save-path` with every slot saved before a restart and restored
  after it (these are timed and shown, not counted as waiting: the script does them while nobody
  waits for a reply).
Its idle gaps change nothing (it has no idle work) and are skipped. Restarts and model loads are
shown but counted on neither side; Parley's restores from the SSD happen inside its turns and are.

A turn's time to first token is its wall time (request sent -> reply over) less the time from the
first reply token to the last, which both report (Parley `TurnStats.decode_s`, llama-server
`timings.predicted_ms`); the whole turn is the wall time. Goals (issue 44): Parley's summed time
to first token over the day ≤ 0.5× llama-server as shipped and ≤ 0.8× tuned; no turn slower than
1.5× as shipped; the whole day (first tokens + replies) ≤ 0.8× as shipped. Each turn Parley loses
against as shipped is listed with why.

--quick: 2 text layers and 3 vision blocks at the published widths, 224×168 pictures, a shorter day
(3 chats, 9 turns, one idle gap and one restart), 8-token replies; it prints the same goal lines.

    python tests/bench/day_of_chats.py [--new 32] [--idle 20] [--threads 2] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _common import distinct_words, parse_args, precision, ratio_line, workdir
from _llamacpp import LLAMA_CPP_PYTHON, PEER_SHAPE, LlamaCpp, Unavailable, ensure

IDLE, RESTART = "idle", "restart"
# (chat, what the person writes, pictures: "p<n>", "pdf" (every page) or "pdf:<page>")
DAY: list = [
    ("A", "Here are two photos from the trip. Which one is sharper?", ["p0", "p1"]),
    ("A", "What stands out in the second one?", []),
    ("B", "This is the quarterly report. Summarise it for me.", ["pdf"]),
    ("B", "What does the second page say?", []),
    ("A", "And this one, taken the next day?", ["p2"]),
    ("C", "Can you describe this room?", ["p3"]),
    ("C", "Is this the same place? My brother sent it.", ["p0"]),
    ("B", "List the figures in the report as bullet points.", []),
    ("D", "Which of these two logos reads better?", ["p4", "p5"]),
    ("D", "Suggest a colour for the first one.", []),
    IDLE,
    ("A", "One more from the trip.", ["p6"]),
    ("C", "What would you change in the room?", []),
    ("B", "Does this photo match what the report says?", ["p3"]),
    ("D", "Here is a third version.", ["p7"]),
    ("D", "Is it better than the first two?", []),
    RESTART,
    ("A", "Back again: which photo of the trip would you print?", []),
    ("B", "Write a two-line summary of the report for an email.", []),
    ("C", "Here is the room after the changes.", ["p8"]),
    ("D", "Compare the third version with this photo from the trip.", ["p1"]),
    ("A", "And this one?", ["p9"]),
    ("A", "Put the trip photos in the order you would show them.", []),
    ("B", "Look at page three again.", ["pdf:3"]),
    ("C", "Is it brighter now?", []),
    IDLE,
    ("D", "A fourth version.", ["p10"]),
    ("A", "Write captions for the trip photos.", []),
    ("B", "Is this chart from the report?", ["p2"]),
    ("C", "One more corner of the room.", ["p11"]),
    ("C", "What furniture would fit there?", []),
    RESTART,
    ("D", "Which version should I send to the client?", []),
    ("C", "Summarise what we said about the room.", []),
    ("B", "Which page of the report matters most?", []),
    ("A", "Here is the trip photo from the morning again.", ["p6"]),
    ("D", "Make the case for the fourth version in one paragraph.", []),
    ("C", "Compare the room with this one.", ["p5"]),
    ("B", "Draft three questions for the meeting.", []),
    ("A", "Anything I missed in the trip photos?", []),
    IDLE,
    ("D", "And against this picture?", ["p11"]),
    ("C", "Last question about the room: what colour for the walls?", []),
    ("B", "Thanks. One last summary of the report, please.", []),
    ("A", "Which photo would make the best cover?", []),
    ("A", "And the best one to end the album with?", []),
    ("D", "Thanks, that settles it.", []),
]
QUICK_DAY: list = [
    ("A", "Here is a photo from the trip. What is in it?", ["p0"]),
    ("B", "This is the report. Summarise it for me.", ["pdf"]),
    ("A", "What stands out?", []),
    ("C", "Is this the same place? My brother sent it.", ["p0"]),
    IDLE,
    ("B", "Does this photo match the report?", ["p1"]),
    RESTART,
    ("A", "Back again: would you print it?", []),
    ("C", "And this one?", ["p2"]),
    ("B", "One last summary, please.", []),
    ("A", "Thanks.", []),
]
PDF_NAME = "report.pdf"
PAGE_PT, QUICK_PAGE_PT = (200, 260), (100, 130)  # points: 400x520 and 200x260 pixels at the 144-dpi render
CACHE_REUSE = 256
# tuned: a slot per chat of this many tokens (the day's longest chat needs about 3,000), so its KV
# cache holds as many tokens as the shipped one's 4 slots share (32,768, the model's context)
SLOT_TOKENS = 8192


# ---------------------------------------------------------------------------- the day's pictures


@dataclass
class Media:
    """The day's pictures as each side gets them: PictureRefs for Parley, PNG data URLs for
    llama-server (a PDF page: the PNG Parley renders it to, which is what Parley sends a server)."""

    refs: dict[str, list] = field(default_factory=dict)  # "p3" / "pdf" / "pdf:2" -> PictureRefs
    urls: dict[str, str] = field(default_factory=dict)  # a PictureRef's digest -> data URL
    page_px: str = ""  # a PDF page's size as rendered


def make_media(d: Path, day: list, size: tuple[int, int], pdf_pages: int, page_pt: tuple[int, int]) -> Media:
    from engine.pictures.document import Document
    from tests.fixtures.documents import make_pdf
    from tests.fixtures.pictures import make_picture, pics

    media = Media()
    names = sorted({n for step in day if isinstance(step, tuple) for n in step[2]})
    doc = Document.of_file(make_pdf(d / PDF_NAME, pdf_pages, size=page_pt, seed=3))
    pages = doc.page_refs(name=PDF_NAME)
    media.page_px = "x".join(map(str, pages[0].picture().size))
    for name in names:
        if name == "pdf":
            media.refs[name] = pages
        elif name.startswith("pdf:"):
            media.refs[name] = [pages[int(name[4:]) - 1]]
        else:
            n = int(name[1:])
            shape = size if n % 3 else (size[1], size[0])  # every third one upright
            media.refs[name] = pics(make_picture(d / f"{name}.png", 100 + n, size=shape))
    for refs in media.refs.values():
        for ref in refs:
            if ref.digest not in media.urls:
                media.urls[ref.digest] = "data:image/png;base64," + base64.b64encode(ref.read_checked()).decode()
    return media


def distinct_pictures(day: list, media: Media) -> int:
    return len({r.digest for step in day if isinstance(step, tuple) for n in step[2] for r in media.refs[n]})


# ---------------------------------------------------------------------------- one turn's figures


@dataclass
class TurnTime:
    wall_s: float  # request sent -> reply over
    reply_s: float  # first reply token -> last
    prompt_tokens: int
    pictures_encoded: int
    detail: dict = field(default_factory=dict)

    @property
    def ttft_s(self) -> float:
        return self.wall_s - self.reply_s


@dataclass
class DayRun:
    name: str
    turns: list[TurnTime] = field(default_factory=list)
    restarts_s: list[float] = field(default_factory=list)  # shown, not counted as waiting
    around_restart_s: list[float] = field(default_factory=list)  # tuned: slot saves and restores
    notes: list[str] = field(default_factory=list)

    def total(self, what: str) -> float:
        return sum(getattr(t, what) for t in self.turns)


class OtherWork:
    """How many cores the machine gave to work other than the side being timed (its process and
    live children: this one for Parley, with its PDF reader; the server for llama-server) over one
    turn, steal time included: a turn slowed by other work says so in the report."""

    def __init__(self, pid: int):
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process(pid)
        self._t0 = self._wall0 = 0.0

    def _other_s(self) -> float:
        m = self._psutil.cpu_times()
        busy = sum(getattr(m, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        own = 0.0
        for p in (self._proc, *self._proc.children(recursive=True)):
            try:
                t = p.cpu_times()
            except self._psutil.NoSuchProcess:
                continue
            own += t.user + t.system
        return busy - own

    def start(self) -> None:
        self._t0, self._wall0 = self._other_s(), time.perf_counter()

    def cores(self) -> float:
        return max(0.0, self._other_s() - self._t0) / max(1e-9, time.perf_counter() - self._wall0)


def progress(run: DayRun, i: int, chat: str) -> None:
    t = run.turns[-1]
    print(
        f"  {run.name} turn {i + 1} (chat {chat}): {t.ttft_s:.2f} s to first token, {t.wall_s:.2f} s whole", flush=True
    )


def turn_steps(day: list):
    """(turn index, chat, text, picture names, what came before it: switch / idle / restart)."""
    i, last, before = 0, None, set()
    for step in day:
        if step in (IDLE, RESTART):
            before.add(step)
            continue
        chat, text, names = step
        if last is not None and chat != last:
            before.add("switch")
        yield i, chat, text, names, sorted(before)
        i, last, before = i + 1, chat, set()


# ---------------------------------------------------------------------------- Parley


class Watch:
    """The engine's latest word on where each chat's KV is and whether the encoder is loaded."""

    def __init__(self, engine):
        from engine.protocol.events import ChatMemoryReport, EncoderState, EncoderStatus, MemoryReport

        self._kinds = (ChatMemoryReport, EncoderState, MemoryReport)
        self._unloaded = EncoderStatus.UNLOADED
        self.places: dict[str, str] = {}
        self.encoder = ""
        self._cv = threading.Condition()
        engine.add_listener(self._on)

    def _on(self, ev) -> None:
        from engine.protocol.events import ChatMemoryReport, EncoderState

        if not isinstance(ev, self._kinds):
            return
        with self._cv:
            if isinstance(ev, ChatMemoryReport):
                self.places = {c.conversation_id: str(c.place) for c in ev.chats}
            elif isinstance(ev, EncoderState):
                self.encoder = str(ev.state)
            else:
                self.encoder = str(ev.encoder_state)
            self._cv.notify_all()

    def wait_idle(self, chats: set[str], open_chat: str, timeout: float) -> bool:
        """Until every chat but the open one is on the SSD and the encoder is unloaded."""
        from engine.protocol.events import KVPlace

        def done() -> bool:
            others = all(self.places.get(c) == str(KVPlace.ON_SSD) for c in chats - {open_chat})
            return others and self.encoder == str(self._unloaded)

        with self._cv:
            return self._cv.wait_for(done, timeout)


def parley_day(
    model_dir: Path, day: list, media: Media, replies: list[str], new: int, idle_s: float, quick: bool, d: Path
) -> DayRun:
    from engine.local.engine import Engine
    from engine.protocol.client import load_blocking, run_blocking
    from engine.protocol.events import Message, Sampling, Turn, TurnDone
    from engine.protocol.settings import EngineSettings

    settings = EngineSettings().with_changes(
        dict(**precision(quick), lookup_decoding=False, spill_idle_s=idle_s, elastic_idle_s=idle_s / 2)
    )
    data = d / "parley-data"

    def start():
        engine = Engine(settings, data).start()
        load_blocking(engine, str(model_dir))
        return engine, Watch(engine)

    run = DayRun("Parley")
    other = OtherWork(os.getpid())
    engine, watch = start()
    history: dict[str, list[Message]] = {}
    open_chat = None
    try:
        i = 0
        for step in day:
            if step == RESTART:
                t0 = time.perf_counter()
                engine.shutdown()
                engine, watch = start()
                run.restarts_s.append(time.perf_counter() - t0)
                open_chat = None
                continue
            if step == IDLE:
                t0 = time.perf_counter()
                engine.request_memory_report()
                if not watch.wait_idle(set(history), open_chat or "", timeout=20 * idle_s + 120):
                    run.notes.append(f"an idle gap ended before the idle spill did: {watch.places}")
                run.notes.append(f"idle gap: {time.perf_counter() - t0:.1f} s until spilled and unloaded")
                continue
            chat, text, names = step
            if chat != open_chat:
                engine.open_chat(chat)  # what selecting the chat in the sidebar does
                open_chat = chat
            msgs = history.setdefault(chat, [])
            msgs.append(Message("user", text, [r for n in names for r in media.refs[n]]))
            t0 = time.perf_counter()
            other.start()
            done = run_blocking(engine, Turn(chat, list(msgs), Sampling(greedy=True, max_new_tokens=new)))
            wall = time.perf_counter() - t0
            if not isinstance(done, TurnDone):
                raise RuntimeError(f"Parley's turn {i + 1} failed: {done.message}")
            s = done.stats
            if s.generated_tokens != new:
                raise RuntimeError(f"Parley's turn {i + 1} gave {s.generated_tokens} tokens, not {new}")
            keep = (
                "first_token_s",
                "reused_tokens",
                "restored_tokens",
                "prefill_tokens",
                "prefill_s",
                "restore_s",
                "encode_s",
                "encoder_loads",
                "encoder_load_s",
                "image_cache_hits",
                "image_cache_disk_hits",
            )
            detail = {k: getattr(s, k) for k in keep} | {"other_cores": other.cores()}
            run.turns.append(TurnTime(wall, s.decode_s, s.prompt_tokens, s.pictures_encoded, detail))
            msgs.append(Message("assistant", replies[i]))
            progress(run, i, chat)
            i += 1
    finally:
        engine.shutdown()
    return run


# ---------------------------------------------------------------------------- llama-server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One llama-server configuration, started and stopped as a person's app would."""

    def __init__(self, llama: LlamaCpp, lm: Path, mmproj: Path, threads: int, extra: list[str], logs: Path):
        self.cmd = [
            str(llama.tool("llama-server")),
            "-m",
            str(lm),
            "--mmproj",
            str(mmproj),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--host",
            "127.0.0.1",
            "-lv",
            "4",  # trace: the lines that say which pictures were encoded and what the caches did
            *extra,
        ]
        self.logs = logs
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.started = 0

    def start(self) -> float:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        with open(self.logs / f"server-{self.started}.log", "w") as log:
            self.proc = subprocess.Popen(
                [*self.cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started += 1
        while True:  # no event to wait on: the server says it is ready only through /health
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.log_text()[-800:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def other_work(self) -> OtherWork:
        if self.proc is None:
            raise RuntimeError("llama-server is not running")
        return OtherWork(self.proc.pid)

    def log_text(self, which: int | None = None) -> str:
        n = self.started - 1 if which is None else which
        return (self.logs / f"server-{n}.log").read_text(errors="replace")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())

    def chat(self, messages: list[dict], new: int, slot: int | None) -> tuple[float, dict]:
        """A streamed chat completion, as the apps send it: (wall seconds, the server's timings)."""
        body = {"messages": messages, "max_tokens": new, "temperature": 0, "stream": True, "ignore_eos": True}
        if slot is not None:
            body["id_slot"] = slot
        req = urllib.request.Request(
            self.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        timings: dict = {}
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    timings = json.loads(line[6:]).get("timings") or timings
        return time.perf_counter() - t0, timings


ENCODED = re.compile(r"encoding mtmd batch from idx = \d+, n_chunks = (\d+)")


def server_turns(log: str) -> list[dict]:
    """What the server's log says of each completion, in order: pictures encoded, and whether its
    host-memory prompt cache gave the slot a saved prompt."""
    parts = re.split(r"\| processing task, is_child = 0", log)[1:]
    return [
        {
            "encoded": sum(int(n) for n in ENCODED.findall(p)),
            "from_host_cache": "found better prompt" in p,
        }
        for p in parts
    ]


def openai_messages(msgs: list[tuple[str, str, list]], media: Media) -> list[dict]:
    out = []
    for role, text, refs in msgs:
        if role == "assistant":
            out.append({"role": role, "content": text})
            continue
        parts: list[dict] = []
        for r in refs:  # a page is named just before it, as Parley's prompt names it
            if r.prompt_caption:
                parts.append({"type": "text", "text": r.prompt_caption + " "})
            parts.append({"type": "image_url", "image_url": {"url": media.urls[r.digest]}})
        parts.append({"type": "text", "text": text})
        out.append({"role": role, "content": parts})
    return out


def llama_day(name: str, server: Server, tuned: bool, day: list, media: Media, replies: list[str], new: int) -> DayRun:
    chats = sorted({s[0] for s in day if isinstance(s, tuple)})
    slot_of = {c: k for k, c in enumerate(chats)}
    run = DayRun(name)
    history: dict[str, list] = {}
    segments: list[int] = []  # turns per server process, to read its log back
    server.start()
    segments.append(0)
    try:
        i = 0
        for step in day:
            if step == IDLE:
                continue
            if step == RESTART:
                t0 = time.perf_counter()
                if tuned:
                    for c in history:
                        server.post(f"/slots/{slot_of[c]}?action=save", {"filename": f"chat-{slot_of[c]}.bin"})
                saved = time.perf_counter() - t0
                server.stop()
                t1 = time.perf_counter()
                server.start()
                run.restarts_s.append(time.perf_counter() - t1)
                segments.append(0)
                if tuned:
                    t2 = time.perf_counter()
                    for c in history:
                        server.post(f"/slots/{slot_of[c]}?action=restore", {"filename": f"chat-{slot_of[c]}.bin"})
                    run.around_restart_s.append(saved + time.perf_counter() - t2)
                continue
            chat, text, names = step
            msgs = history.setdefault(chat, [])
            msgs.append(("user", text, [r for n in names for r in media.refs[n]]))
            other = server.other_work()
            other.start()
            wall, tm = server.chat(openai_messages(msgs, media), new, slot_of[chat] if tuned else None)
            if tm.get("predicted_n") != new:
                raise RuntimeError(f"{name}'s turn {i + 1} gave {tm.get('predicted_n')} tokens, not {new}")
            prompt = tm.get("prompt_n", 0) + tm.get("cache_n", 0)
            detail = {"prompt_n": tm.get("prompt_n", 0), "other_cores": other.cores()}
            run.turns.append(TurnTime(wall, tm["predicted_ms"] / 1000, prompt, 0, detail))
            segments[-1] += 1
            msgs.append(("assistant", replies[i], []))
            progress(run, i, chat)
            i += 1
    finally:
        server.stop()
    # the logs, whole now that each server has stopped: pictures encoded per turn
    k = 0
    for n_proc, n_turns in enumerate(segments):
        log = server.log_text(n_proc)
        seen = server_turns(log)
        if len(seen) != n_turns:
            raise RuntimeError(f"{name}: the server's log {n_proc} shows {len(seen)} completions, not {n_turns}")
        if tuned and n_proc == 0 and "cache_reuse is not supported by multimodal" in log:
            run.notes.append(
                f"--cache-reuse {CACHE_REUSE}: the server turned it off "
                "(its log: cache_reuse is not supported by multimodal)"
            )
        if n_proc == 0:
            m = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'", log)
            if m:
                run.notes.append(f"{m[1]} slots of {m[2]} tokens, unified KV {m[3]}")
        for t in seen:
            run.turns[k].pictures_encoded = t["encoded"]
            run.turns[k].detail["from_host_cache"] = t["from_host_cache"]
            k += 1
    return run


# ---------------------------------------------------------------------------- the report


def why_lost(p: TurnTime, s: TurnTime) -> str:
    """Why Parley's turn took longer than llama-server's (as shipped), in its own figures."""
    d = p.detail
    reply = f"reply {p.reply_s:.1f} s vs {s.reply_s:.1f} s"
    if d["other_cores"] >= 0.25:
        reply += f"; other work on the machine held {d['other_cores']:.1f} cores during Parley's turn"
    if p.ttft_s <= s.ttft_s:
        return f"reply speed alone ({reply}; first token {p.ttft_s:.1f} s vs {s.ttft_s:.1f} s): the CPU-kernel issue's"
    parts = {
        "vision encoder load": d["encoder_load_s"],
        f"encoding {p.pictures_encoded} picture(s) (llama-server: {s.pictures_encoded})": d["encode_s"],
        f"restore of {d['restored_tokens']} tokens from the SSD": d["restore_s"],
        f"prefill of {d['prefill_tokens']} tokens (llama-server: {s.detail['prompt_n']})": d["prefill_s"],
        "waiting before the turn started (idle work in progress)": p.ttft_s - d["first_token_s"],
    }
    main = max(parts, key=lambda k: parts[k])
    listed = ", ".join(f"{k} {v:.1f} s" for k, v in parts.items() if v >= 0.05)
    return f"first token {p.ttft_s:.1f} s vs {s.ttft_s:.1f} s, most of it {main} ({listed}); {reply}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=32, help="reply tokens per turn, on both sides")
    ap.add_argument("--idle", type=float, default=20.0, help="Parley's spill_idle_s for the day (shipped: 120)")
    ap.add_argument("--picture", default="448x336", help="picture size (every third one upright)")
    ap.add_argument("--threads", type=int, default=0, help="threads on both sides (default: torch's, i.e. Parley's)")
    ap.add_argument("--json", default=None, help="write the per-turn series here (for the report's chart)")
    args = parse_args(ap, {"new": 8, "idle": 2.0, "picture": "224x168"})
    try:
        llama = ensure(build=os.environ.get("PARLEY_BENCH_NO_BUILD") != "1", need=("llama-server",))
    except Unavailable as exc:
        print(f"skipped: {exc}")
        return
    import torch

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    day = QUICK_DAY if args.quick else DAY
    t_start = time.perf_counter()
    model_dir, lm, mmproj = llama.picture_model(args.quick, "day")
    d = workdir("day-of-chats")
    size = tuple(int(x) for x in args.picture.split("x"))
    media = make_media(d, day, size, 2 if args.quick else 4, QUICK_PAGE_PT if args.quick else PAGE_PT)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    n_turns = sum(isinstance(s, tuple) for s in day)
    words = distinct_words(tok, n_turns * args.new, seed=44)
    replies = [" ".join(words[i * args.new : (i + 1) * args.new]) for i in range(n_turns)]
    runs = [parley_day(model_dir, day, media, replies, args.new, args.idle, args.quick, d)]
    logs = d / "llama-logs"
    n_chats = len({s[0] for s in day if isinstance(s, tuple)})
    for name, tuned, extra in (
        ("llama-server as shipped", False, []),
        (
            "llama-server tuned",
            True,
            [
                *("-np", str(n_chats), "-c", str(SLOT_TOKENS * n_chats)),
                *("--cache-reuse", str(CACHE_REUSE)),
            ],
        ),
    ):
        folder = logs / ("tuned" if tuned else "shipped")
        folder.mkdir(parents=True)
        if tuned:
            extra = [*extra, "--slot-save-path", str(folder / "slots")]
            (folder / "slots").mkdir()
        runs.append(
            llama_day(name, Server(llama, lm, mmproj, threads, extra, folder), tuned, day, media, replies, args.new)
        )
    report(args, day, media, runs, threads, llama, time.perf_counter() - t_start)


def report(args, day, media, runs: list[DayRun], threads: int, llama: LlamaCpp, seconds: float) -> None:
    from _common import cpu_flags

    parley, shipped, tuned = runs
    steps = list(turn_steps(day))
    switches = sum("switch" in s[4] for s in steps)
    chats = len({s[1] for s in steps})
    shape = (
        "quick: 2 text layers, 3 vision blocks, vocabulary 4096" if args.quick else "28 text layers, 32 vision blocks"
    )
    print(
        f"{PEER_SHAPE} shape ({shape}), random weights, bf16 (llama.cpp: bf16 GGUF + f16 mmproj); llama-server from "
        f"llama-cpp-python {LLAMA_CPP_PYTHON} ({llama.info.get('commit', '?')}); {threads} threads both; "
        f"{args.new}-token replies; {seconds:.0f} s"
    )
    print(
        f"the day: {chats} chats, {len(steps)} turns, {distinct_pictures(day, media)} distinct pictures "
        f"({args.picture}; {PDF_NAME}'s pages {media.page_px}), {switches} switches, {day.count(IDLE)} idle gaps "
        f"(Parley spill_idle_s {args.idle:g} s, elastic_idle_s {args.idle / 2:g} s), {day.count(RESTART)} restarts"
    )
    print(f"CPU: {' '.join(sorted(f for f in cpu_flags() if f.startswith(('avx', 'amx', 'fma', 'f16c'))))}")
    for r in runs:
        for n in r.notes:
            if not n.startswith("idle gap:"):
                print(f"{r.name}: {n}")
    idle_notes = [n for n in parley.notes if n.startswith("idle gap:")]
    if idle_notes:
        print("Parley: " + "; ".join(idle_notes))
    hdr = f"{'turn':>4} {'chat':>4} {'before':>14} | {'prompt P/S/T':>16} | {'pics P/S/T':>10} |"
    print(hdr + f" {'first token s: P / shipped / tuned':>36} | {'whole turn s: P / shipped / tuned':>34}")
    for (i, chat, _text, _names, before), p, s, t in zip(steps, parley.turns, shipped.turns, tuned.turns, strict=True):
        print(
            f"{i + 1:>4} {chat:>4} {','.join(before) or '-':>14} | "
            f"{p.prompt_tokens:>5}/{s.prompt_tokens:>5}/{t.prompt_tokens:>4} | "
            f"{p.pictures_encoded:>2}/{s.pictures_encoded:>3}/{t.pictures_encoded:>3} | "
            f"{p.ttft_s:>10.2f} / {s.ttft_s:>8.2f} / {t.ttft_s:>8.2f}   | "
            f"{p.wall_s:>9.2f} / {s.wall_s:>8.2f} / {t.wall_s:>8.2f}"
        )
    for r in runs:
        extra = (
            f"; slot saves and restores around restarts {sum(r.around_restart_s):.1f} s" if r.around_restart_s else ""
        )
        print(
            f"{r.name}: first tokens {r.total('ttft_s'):.1f} s, whole turns {r.total('wall_s'):.1f} s, "
            f"pictures encoded {sum(t.pictures_encoded for t in r.turns)}; restarts "
            f"{', '.join(f'{x:.1f}' for x in r.restarts_s)} s (not counted){extra}"
        )
    for r in runs:
        busy = [t.detail["other_cores"] for t in r.turns]
        k = max(range(len(busy)), key=lambda j: busy[j])
        print(
            f"{r.name}: other work on the machine during its turns: {sum(busy) / len(busy):.2f} cores on average, "
            f"{busy[k]:.2f} at most (turn {k + 1})"
        )
    host = sum(bool(t.detail.get("from_host_cache")) for t in shipped.turns)
    print(
        f"llama-server as shipped: its host-memory prompt cache (--cache-ram, 8 GiB by default) gave {host} of "
        f"{len(steps)} turns, every one a prompt with pictures, a saved prompt"
        + (": this version keeps multimodal prompts there too (llama.cpp issue #17821 does not apply)" if host else "")
    )
    for r in runs:
        print(ratio_line(f"summed time to first token over the day, {r.name}", r.total("ttft_s"), unit="s", digits=1))
    for r in runs:
        print(ratio_line(f"whole turns summed over the day, {r.name}", r.total("wall_s"), unit="s", digits=1))
    for r in runs:
        print(
            ratio_line(f"pictures encoded over the day, {r.name}", sum(t.pictures_encoded for t in r.turns), digits=0)
        )
    ratios = [p.wall_s / s.wall_s for p, s in zip(parley.turns, shipped.turns, strict=True)]
    worst = max(range(len(ratios)), key=lambda k: ratios[k])
    lost = [k for k in range(len(ratios)) if ratios[k] > 1.0]
    print(f"Parley's turns slower than llama-server as shipped: {len(lost)} of {len(ratios)}")
    for k in lost:
        i, chat, _t, _n, before = steps[k]
        print(
            f"  turn {i + 1} (chat {chat}{', after ' + ' and '.join(before) if before else ''}): "
            f"{parley.turns[k].wall_s:.1f} s vs {shipped.turns[k].wall_s:.1f} s: "
            f"{why_lost(parley.turns[k], shipped.turns[k])}"
        )
    print(
        ratio_line(
            "day's summed time to first token Parley / llama-server as shipped",
            parley.total("ttft_s") / shipped.total("ttft_s"),
            at_most=0.5,
        )
    )
    print(
        ratio_line(
            "day's summed time to first token Parley / llama-server tuned",
            parley.total("ttft_s") / tuned.total("ttft_s"),
            at_most=0.8,
        )
    )
    print(ratio_line(f"slowest turn Parley / llama-server as shipped (turn {worst + 1})", ratios[worst], at_most=1.5))
    print(
        ratio_line(
            "whole day (first tokens + replies) Parley / llama-server as shipped",
            parley.total("wall_s") / shipped.total("wall_s"),
            at_most=0.8,
        )
    )
    if args.json:
        series = {
            "shape": PEER_SHAPE,
            "quick": args.quick,
            "new_tokens": args.new,
            "turns": [
                {
                    "turn": i + 1,
                    "chat": chat,
                    "before": before,
                    **{r.name: {**asdict(t), "ttft_s": t.ttft_s} for r, t in zip(runs, ts, strict=True)},
                }
                for (i, chat, _x, _n, before), *ts in zip(steps, parley.turns, shipped.turns, tuned.turns, strict=True)
            ],
            "sides": [r.name for r in runs],
        }
        with open(args.json, "w") as f:
            json.dump(series, f, indent=1)


if __name__ == "__main__":
    main()
