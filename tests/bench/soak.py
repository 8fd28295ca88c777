"""A month of use in minutes: a seeded random walk over real operations, with kills, full disks,
damaged blobs and restarts, checking as it goes that nothing is lost and no reply is wrong.

The app under test runs in a child process (tests/bench/_soak_child.py): the engine and the history
database as the window uses them, on a data folder that lives on a 48 MiB tmpfs of the run's own
(where `mount -t tmpfs` is allowed; elsewhere a plain folder, and no full-disk windows). The model
is a tiny Qwen2-VL with seeded weights (tests/fixtures/tiny_models), so thousands of steps fit in
minutes. Each step is drawn from a `random.Random(--seed)`:

- a turn, in a new chat or one of the others, with a new picture, a re-sent one (from this chat or
  another), or none; replies are greedy, `--new` tokens;
- a chat deleted once it has --retire messages (its KV forgotten), a new one in its place;
- a chat switch (the window's open_chat), a spill now, an idle pause (the spill timer shortened
  through the settings, as the Settings dialog does), a clean restart;
- a kill: the child is armed to SIGKILL itself at the k-th write event of the next operation
  (a KV blob's or a picture's rename or fsync, the image cache's, a history write statement) or
  at the k-th read of KV blobs in a restore, then started again on the same folder;
- a full-disk window: the tmpfs is filled to the last byte for a few steps (writes are refused,
  spills fail, the app carries on), then freed;
- a flipped byte in a stored KV blob;
- a second process opening the same data folder (it must get one clear line).

Checked as it goes (each broken one is printed with its step):
- a sampled reply (`--check` of turns, and the first turns after every start or damage) equals the
  greedy reply of a fresh full prefill of the same history, token for token (`model.generate` on
  the model loaded afresh in this process);
- every message the child said was committed is in the history, complete, after every step and
  every kill;
- after every start, no temp file and no file the sweeps should have removed (a KV blob the
  manifest does not name, a picture no message names);
- the KV store within its quota (`--cap`) after every step (blobs a read in flight holds, deleted
  when it ends, not counted);
- a damaged blob is never used (the sampled replies stay exact; the store counts it bad);
- nothing the app does fails outside a full-disk window (an unrecovered state otherwise).

Goal lines: wrong replies 0, lost messages 0, steps over quota 0, unrecovered states 0; and the
counts of kills (by where they struck), full-disk windows and damaged blobs survived.

    python tests/bench/soak.py [--seed 7] [--steps 5000] [--cap BYTES] [--check 0.25] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _common import parse_args, ratio_line, workdir  # noqa: E402  (puts the project root on sys.path)

from tests.fixtures.full_disk import SmallDisk, mount_small_disk, unmount  # noqa: E402

CHILD = Path(__file__).resolve().parent / "_soak_child.py"
WORDS = (
    "boat river stone cloud apple lamp garden window paper violin coffee winter bridge forest "
    "engine silver candle market ladder mirror harbor pencil meadow orange rocket saddle tunnel"
).split()


@dataclass
class Committed:
    """A message the app said was saved: it must be in the history, complete, from then on."""

    id: int
    role: str
    text: str


@dataclass
class Chat:
    id: str
    pictures: list[str] = field(default_factory=list)  # source files sent in it
    committed: list[Committed] = field(default_factory=list)
    length: int = 0  # messages in its history
    waiting: bool = False  # its last message is a user message with no reply (a kill came between)


@dataclass
class Tally:
    steps: int = 0
    turns: int = 0
    checked: int = 0
    wrong: int = 0
    lost: int = 0
    over_quota: int = 0
    unrecovered: int = 0
    restarts: int = 0
    kills: Counter = field(default_factory=Counter)
    disk_windows: int = 0
    refused_in_window: int = 0
    unclear_refusals: int = 0
    refused_starts: int = 0  # starts on a full disk (each must be one clear line)
    leftovers: int = 0  # starts that found files the sweeps should have removed
    flips: int = 0
    deleted: int = 0  # chats deleted
    sent: Counter = field(default_factory=Counter)  # what the turns attached
    probes: int = 0
    clear_probes: int = 0
    spills: Counter = field(default_factory=Counter)
    counted: Counter = field(default_factory=Counter)  # the store's counters, summed over lives
    peak_bytes: int = 0  # the most the store held after a step
    restored_turns: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, step: int, what: str) -> None:
        self.problems.append(f"step {step}: {what}")
        print(f"  PROBLEM at step {step}: {what}", flush=True)


class Died(Exception):
    """The child process ended (killed, or crashed)."""


class Zygote:
    """The process that imported everything once and forks each life (tests/bench/_soak_child.py)."""

    def __init__(self, model: Path, log: Path):
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        with open(log, "ab") as err:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), "--model", str(model)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.call({})  # its "ready"

    def call(self, cmd: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        raise RuntimeError("the soak's zygote process ended")

    def fork(self, **cmd) -> int:
        return self.call({"op": "fork", **cmd})["pid"]

    def reap(self, pid: int) -> int:
        return self.call({"op": "reap", "pid": pid})["code"]

    def close(self) -> None:
        """The end of its stdin ends it (and a life it forked ends with the end of its own)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(60)


class Child:
    """One life of the app: a process forked by the zygote, and its command pipes (FIFOs)."""

    def __init__(self, zygote: Zygote, data: Path, model: Path, block: int, cap: int, work: Path):
        self.zygote = zygote
        self.log = work / "child.log"
        self.log_from = self.log.stat().st_size if self.log.exists() else 0  # lives share the log
        fifo_in, fifo_out = work / "to-child", work / "from-child"
        for f in (fifo_in, fifo_out):
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        args = {"data": str(data), "model": str(model), "block": block, "cap": cap}
        self.pid = zygote.fork(args=args, log=str(self.log), **{"in": str(fifo_in), "out": str(fifo_out)})
        self.returncode: int | None = None
        # the same order the child opens them in: its stdin first
        self.stdin = open(fifo_in, "w")  # noqa: SIM115  (closed when the life ends)
        self.stdout = open(fifo_out)  # noqa: SIM115
        self.committed: list[dict] = []
        first = self._answer()
        self.start_error = first.get("start_failed")

    def wait(self) -> int:
        if self.returncode is None:
            for f in (self.stdin, self.stdout):
                try:
                    f.close()
                except BrokenPipeError:
                    pass
            self.returncode = self.zygote.reap(self.pid)
        return self.returncode

    def _answer(self) -> dict:
        for line in self.stdout:
            if not line.startswith("@@ "):
                continue
            msg = json.loads(line[3:])
            if "committed" in msg:
                self.committed.append(msg)
                continue
            return msg
        self.wait()
        raise Died()

    def call(self, op: str, **args) -> dict:
        try:
            self.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.stdin.flush()
        except BrokenPipeError:
            self.wait()
            raise Died() from None
        return self._answer()

    def take_committed(self) -> list[dict]:
        out, self.committed = self.committed, []
        return out

    def where_killed(self) -> str:
        with open(self.log, "rb") as f:
            f.seek(self.log_from)
            text = f.read().decode(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith("killed at ")]
        return lines[-1][len("killed at ") :] if lines else ""

    def quit(self) -> None:
        try:
            self.call("quit")
        except Died:
            pass
        self.wait()


def kill_place(where: str) -> str:
    """Where a kill struck, in the words of the report."""
    if where.startswith("read"):
        return "KV restore read"
    if where.startswith("history"):
        return "history write"
    if "kv-store" in where:
        return "KV spill write"
    if "/pictures/" in where:
        return "picture-store write"
    if "image-cache" in where:
        return "image-cache write"
    return "other write"


def orphans(data: Path) -> list[str]:
    """Files a start's sweeps should have removed: temp files; KV blobs the manifest does not
    name; pictures no message names."""
    found = []
    blobs = data / "kv-store" / "blobs"
    manifest = data / "kv-store" / "manifest.sqlite"
    known: set[str] = set()
    if manifest.exists():
        db = sqlite3.connect(f"file:{manifest}?mode=ro", uri=True)
        try:
            known = {bytes(k).hex() for (k,) in db.execute("SELECT key FROM blobs")}
        finally:
            db.close()
    for path in blobs.rglob("*") if blobs.is_dir() else []:
        if path.is_file() and (path.name.startswith(".") or path.stem not in known):
            found.append(str(path.relative_to(data)))
    hist = data / "history.sqlite3"
    named: set[str] = set()
    if hist.exists():
        db = sqlite3.connect(f"file:{hist}?mode=ro", uri=True)
        try:
            for (refs,) in db.execute("SELECT pictures FROM messages"):
                named.update(r.split("#")[0] for r in json.loads(refs))
        finally:
            db.close()
    pics = data / "pictures"
    for path in pics.rglob("*") if pics.is_dir() else []:
        if path.is_file() and (path.name.startswith(".") or path.name not in named):
            found.append(str(path.relative_to(data)))
    return found


class Soak:
    def __init__(self, args, model: Path, work: Path, data: Path, disk: SmallDisk | None):
        from tests.fixtures.documents import make_pdf
        from tests.fixtures.pictures import make_picture
        from tests.helpers.engine_helpers import Reference

        self.args = args
        self.rng = random.Random(args.seed)
        self.model, self.work, self.data, self.disk = model, work, data, disk
        self.make_picture, self.make_pdf = make_picture, make_pdf
        (work / "pictures").mkdir(exist_ok=True)
        self.reference = Reference(model, dtype="float32", weights="fp32")
        self.t = Tally()
        self.chats: list[Chat] = []
        self.open: Chat | None = None
        self.life_counters: dict = {}  # the store's counters in this life, as of the last step
        self.window_left = 0  # steps left in a full-disk window
        self.check_all = 0  # turns left that are all checked (after a kill, restart or damage)
        self.next_picture = 0
        self.zygote = Zygote(model, work / "zygote.log")
        self.child = self.start(0)

    # ------------------------------------------------------------ lives

    def start(self, step: int) -> Child:
        """A new life; a refusal on a full disk ends the window and starts again."""
        child = Child(self.zygote, self.data, self.model, self.args.block, self.args.cap, self.work)
        if child.start_error:
            if self.window_left and self.disk is not None:
                self.t.refused_in_window += 1
                bare = child.start_error.split(":")[0] in ("OperationalError", "DatabaseError", "OSError")
                self.t.refused_starts += 1
                if bare or "\n" in child.start_error:  # SQLite's or the OS's words: not a line a person can act on
                    self.t.unclear_refusals += 1
                    self.t.problem(step, f"start on a full disk, no clear line: {child.start_error}")
                child.wait()
                self.end_window()
                return self.start(step)
            self.t.unrecovered += 1
            raise SystemExit(f"step {step}: the app does not start: {child.start_error} (log {child.log})")
        found = orphans(self.data)
        if found:
            self.t.leftovers += 1
            self.t.problem(step, f"left behind after a start: {found[:5]}")
        self.tidy(child, step)
        self.check_all = max(self.check_all, 2)
        return child

    def tidy(self, child: Child, step: int) -> None:
        answer = child.call("tidy")
        if "error" in answer and not self.window_left:
            self.t.unrecovered += 1
            self.t.problem(step, f"tidy failed: {answer['error']}")
        self.check_history(child.call("state"), step)

    def restart(self, step: int) -> None:
        self.child.quit()
        self.t.restarts += 1
        self.child = self.start(step)

    def after_death(self, step: int) -> None:
        where = self.child.where_killed()
        code = self.child.wait()
        if code != -9 or not where:
            self.t.unrecovered += 1
            self.t.problem(step, f"the app died on its own (exit {code}); see {self.child.log}")
        else:
            self.t.kills[kill_place(where)] += 1
        self.record(self.child.take_committed())
        self.child = self.start(step)

    # ------------------------------------------------------------ what the app said

    def record(self, committed: list[dict]) -> None:
        for c in committed:
            chat = next(ch for ch in self.chats if ch.id == c["chat"])
            chat.committed.append(Committed(c["committed"], c["role"], c["text"]))
            chat.waiting = c["role"] == "user"

    def check_history(self, state: dict, step: int) -> None:
        history = state["history"]
        for chat in self.chats:
            rows = {r[0]: r for r in history.get(chat.id, [])}
            for m in chat.committed:
                row = rows.get(m.id)
                if row is None or row[1] != m.role or row[2] != m.text or row[3] != "complete":
                    self.t.lost += 1
                    self.t.problem(step, f"committed message {m.id} of chat {chat.id[:8]} is {row}")
            path = history.get(chat.id, [])
            chat.waiting = bool(path) and path[-1][1] == "user"
            chat.length = len(path)
        store = state.get("store")
        if store is not None:
            # blobs a read in flight holds (resume-ahead reading a chat evicted meanwhile) go when it
            # ends (tests/engine/kvstore/test_kvstore.py): the cap is on what the store keeps
            kept = store["bytes_on_disk"] - store["held_bytes"]
            if kept > self.args.cap:
                self.t.over_quota += 1
                self.t.problem(
                    step, f"store keeps {kept} bytes ({store['bytes_on_disk']} on disk), cap {self.args.cap}"
                )
            self.life_counters = store
            self.t.peak_bytes = max(self.t.peak_bytes, store["bytes_on_disk"])

    # ------------------------------------------------------------ steps

    def step(self, step: int) -> None:
        r = self.rng.random()
        if r < 0.50:
            self.turn(step)
        elif r < 0.58:
            self.switch()
        elif r < 0.66:
            self.spill(step)
        elif r < 0.71:
            self.idle(step)
        elif r < 0.75:
            self.restart(step)
        elif r < 0.85:
            self.kill(step)
        elif r < 0.89 and self.disk is not None and not self.window_left:
            self.begin_window()
        elif r < 0.95:
            self.flip()
        elif r < 0.97:
            self.probe(step)
        else:
            self.turn(step)

    def pick_chat(self, step: int) -> Chat | None:
        """A chat for the next turn. One grown past --retire messages is deleted first (as people
        delete old chats; its KV is forgotten) and a new one takes its place: a month of use is
        many chats, not a few endless ones (and one larger than the store quota cannot spill)."""
        chat = self.rng.choice(self.chats) if self.chats else None
        if chat is not None and chat.length >= self.args.retire:
            answer = self.child.call("delete", chat=chat.id)
            if "error" in answer:  # kept (a full disk): it goes on a while longer
                self.refused(step, f"delete a chat: {answer['error']}")
                return chat
            self.chats.remove(chat)
            self.t.deleted += 1
            if self.open is chat:
                self.open = None
            chat = None
        if chat is None or (len(self.chats) < self.args.chats and self.rng.random() < 0.12):
            answer = self.child.call("new_chat")
            if "error" in answer:
                self.refused(step, f"new chat: {answer['error']}")
                return self.chats[0] if self.chats else None
            self.chats.append(Chat(answer["chat"]))
            return self.chats[-1]
        return chat

    def refused(self, step: int, what: str) -> None:
        """Something the app could not do: expected in a full-disk window, a problem elsewhere."""
        if self.window_left:
            self.t.refused_in_window += 1
        else:
            self.t.unrecovered += 1
            self.t.problem(step, f"refused outside a full disk: {what}")

    def picture(self, chat: Chat) -> list[str]:
        r = self.rng.random()
        if r < 0.04:  # a PDF: one or two of its pages
            self.next_picture += 1
            pdf = self.make_pdf(self.work / "pictures" / f"d{self.next_picture}.pdf", 3, seed=self.next_picture)
            pages = sorted(self.rng.sample(range(3), self.rng.randrange(1, 3)))
            self.t.sent["PDF pages"] += len(pages)
            return [f"{pdf}#p={i}@72" for i in pages]
        if r < 0.25:
            self.next_picture += 1
            size = self.rng.choice([(64, 48), (48, 64), (56, 56)])
            path = self.make_picture(self.work / "pictures" / f"p{self.next_picture}.png", self.next_picture, size)
            self.t.sent["new pictures"] += 1
            return [str(path)]
        seen = chat.pictures or [p for c in self.chats for p in c.pictures]
        if r < 0.5 and seen:
            self.t.sent["re-sent pictures or pages"] += 1
            return [self.rng.choice(seen)]  # re-sent: this chat's, or another's
        return []

    def turn(self, step: int, chat: Chat | None = None) -> None:
        from engine.pictures import parts
        from engine.protocol.events import Message

        chat = chat or self.pick_chat(step)
        if chat is None:
            return
        if chat.waiting and self.rng.random() < 0.7:
            text, pictures = None, []  # the person asks again for the reply a kill cut off
        else:
            n = self.rng.randrange(3, 9)
            text = " ".join(self.rng.choice(WORDS) for _ in range(n)) + "?"
            pictures = self.picture(chat)
        if self.open is not chat and self.rng.random() < 0.5:
            self.child.call("open", chat=chat.id)
            self.open = chat
        answer = self.child.call("turn", chat=chat.id, text=text, pictures=pictures, new=self.args.new)
        self.record(self.child.take_committed())
        if "error" in answer or "failed" in answer:
            self.refused(step, f"a turn: {answer}")
            return
        self.t.turns += 1
        chat.pictures.extend(p for p in pictures if p not in chat.pictures)
        if answer["restored"]:
            self.t.restored_turns += 1
        if self.check_all > 0 or self.rng.random() < self.args.check:
            self.check_all = max(0, self.check_all - 1)
            messages = [
                Message(role, text, [parts.ref_at(*p) for p in pics]) for role, text, pics in answer["messages"]
            ]
            want = self.reference.reply_ids(messages, self.args.new)
            self.t.checked += 1
            if answer["token_ids"] != want:
                self.t.wrong += 1
                self.t.problem(step, f"reply {answer['token_ids']} != fresh prefill {want} (chat {chat.id[:8]})")

    def switch(self) -> None:
        if self.chats:
            self.open = self.rng.choice(self.chats)
            self.child.call("open", chat=self.open.id)

    def spill(self, step: int) -> None:
        if not self.chats:
            return
        chat = self.rng.choice(self.chats)
        answer = self.child.call("spill", chat=chat.id)
        state = answer.get("state", "error")
        self.t.spills[state] += 1
        if state == "failed" and "more than the store cap" in answer.get("detail", ""):
            self.t.spills["larger than the quota: stays in memory"] += 1  # the store's rule, said
        elif state == "failed" and not self.window_left:
            self.t.unrecovered += 1
            self.t.problem(step, f"a spill failed outside a full disk: {answer.get('detail')}")

    def idle(self, step: int) -> None:
        answer = self.child.call("idle", open=self.open.id if self.open else None)
        if "error" in answer and not self.window_left:
            self.t.unrecovered += 1
            self.t.problem(step, f"idle: {answer['error']}")

    def kill(self, step: int) -> None:
        """SIGKILL at the k-th write of the next operation, or at the k-th KV read of a restore."""
        try:
            if self.chats and self.rng.random() < 0.25:
                chat = self.rng.choice(self.chats)
                self.child.call("spill", chat=chat.id)  # cold, so its next turn restores
                self.child.call("arm", k=self.rng.randrange(1, 4), reads=True)
                self.turn(step, chat)
            else:
                self.child.call("arm", k=self.rng.randrange(1, 16))
                self.rng.choice([self.turn, self.spill, self.idle, self.turn])(step)
            self.child.call("disarm")
        except Died:
            self.after_death(step)

    def begin_window(self) -> None:
        assert self.disk is not None
        self.disk.fill()
        self.window_left = self.rng.randrange(2, 6)
        self.t.disk_windows += 1

    def end_window(self) -> None:
        if self.disk is not None:
            self.disk.free()
        self.window_left = 0

    def flip(self) -> None:
        blobs = sorted(p for p in (self.data / "kv-store" / "blobs").rglob("*.kvb"))
        if not blobs:
            return
        path = self.rng.choice(blobs)
        data = bytearray(path.read_bytes())
        at = self.rng.randrange(len(data))
        data[at] ^= 1 << self.rng.randrange(8)
        with open(path, "r+b") as f:  # in place, as a failing disk would: same size, one bit off
            f.seek(at)
            f.write(data[at : at + 1])
        self.t.flips += 1
        self.check_all = max(self.check_all, 3)

    def probe(self, step: int) -> None:
        out = self.work / "probe.out"
        args = {"data": str(self.data), "model": str(self.model)}
        code = self.zygote.reap(self.zygote.fork(probe=True, args=args, out=str(out)))
        lines = [ln for ln in out.read_text(errors="replace").splitlines() if ln.startswith("notice:")]
        self.t.probes += 1
        in_use = [ln for ln in lines if "in use by another process" in ln]
        # a full disk is news of its own (e.g. the picture cache cannot be written): allowed in a window
        others = [ln for ln in lines if ln not in in_use and not (self.window_left and "full" in ln)]
        if code == 0 and len(in_use) == 1 and not others:
            self.t.clear_probes += 1
        else:
            self.t.problem(step, f"second process: exit {code}, {lines or out.read_text()[-300:]}")

    def run(self) -> None:
        seen: dict[str, int] = {}
        for step in range(1, self.args.steps + 1):
            self.t.steps = step
            try:
                self.step(step)
                if self.window_left:
                    self.window_left -= 1
                    if not self.window_left:
                        self.end_window()
                self.check_history(self.child.call("state"), step)
            except Died:
                self.after_death(step)
            for name in ("bad_blobs", "evicted_sessions"):  # each life counts from 0
                now = self.life_counters.get(name, 0)
                self.t.counted[name] += now - seen.get(name, 0) if now >= seen.get(name, 0) else now
                seen[name] = now
            if step % 100 == 0:
                print(
                    f"  step {step}: {self.t.turns} turns, {sum(self.t.kills.values())} kills, "
                    f"{self.t.restarts} restarts, {len(self.t.problems)} problems",
                    flush=True,
                )
        if self.window_left:
            self.end_window()
        self.child.quit()

    def stop(self) -> None:
        """After the run, or an error in it: no process of the soak's stays behind."""
        for f in (self.child.stdin, self.child.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.zygote.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--chats", type=int, default=6, help="conversations at most")
    ap.add_argument("--retire", type=int, default=24, help="messages after which a chat is deleted")
    ap.add_argument("--new", type=int, default=4, help="reply tokens")
    ap.add_argument("--block", type=int, default=16, help="KV block tokens (small: many blocks)")
    ap.add_argument("--cap", type=int, default=512 << 10, help="KV store quota in bytes")
    ap.add_argument("--check", type=float, default=0.25, help="share of turns checked against a fresh prefill")
    args = parse_args(ap, quick={"steps": 500})
    from tests.fixtures.tiny_models import build_tiny_model

    # a timeout's SIGTERM unwinds like an error, so the tmpfs below is unmounted on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: terminated"))
    t0 = time.perf_counter()
    work = workdir("soak")
    model = build_tiny_model("qwen2_vl", work / "model")
    disk = mount_small_disk(work / "disk", "48m")
    data = (disk.root if disk else work) / "data"
    print(
        f"soak: seed {args.seed}, {args.steps} steps, data on "
        + ("a 48 MiB tmpfs of its own" if disk else "a plain folder (no tmpfs here: no full-disk windows)"),
        flush=True,
    )
    soak = None
    try:
        soak = Soak(args, model, work, data, disk)
        soak.run()
    finally:
        if soak is not None:
            soak.stop()
        if disk is not None:
            disk.free()
            unmount(disk)
    seconds = time.perf_counter() - t0
    t = soak.t
    kills = ", ".join(f"{n} {k}" for k, n in sorted(t.kills.items())) or "none"
    print(
        f"{t.steps} steps in {seconds:.0f} s: {t.turns} turns ({t.checked} checked against a fresh prefill, "
        f"{t.restored_turns} restored from the SSD), {t.restarts} restarts, {t.deleted} chats deleted"
    )
    print("attached: " + ", ".join(f"{n} {k}" for k, n in sorted(t.sent.items())))
    print(f"kills survived: {sum(t.kills.values())} ({kills})")
    print(
        f"full-disk windows survived: {t.disk_windows} ({t.refused_in_window} writes refused in them; "
        f"{t.refused_starts} starts refused, {t.refused_starts - t.unclear_refusals} with one clear line)"
    )
    print(f"damaged blobs survived: {t.flips} flipped, {t.counted['bad_blobs']} detected and recomputed")
    print(
        f"spills: {dict(t.spills)}; sessions evicted under the quota: {t.counted['evicted_sessions']}; "
        f"store at most {t.peak_bytes / 1024:.0f} KiB of {args.cap / 1024:.0f} KiB"
    )
    print(f"second processes refused with one clear line: {t.clear_probes} of {t.probes}")
    goals = [
        ratio_line("wrong replies", t.wrong, at_most=0, digits=0),
        ratio_line("lost messages", t.lost, at_most=0, digits=0),
        ratio_line("steps over the store quota", t.over_quota, at_most=0, digits=0),
        ratio_line("unrecovered states", t.unrecovered + t.unclear_refusals + t.leftovers, at_most=0, digits=0),
        ratio_line("second processes without one clear line", t.probes - t.clear_probes, at_most=0, digits=0),
    ]
    for line in goals:
        print(line)
    for p in t.problems[:20]:
        print("  " + p)
    if t.problems:
        raise SystemExit(f"soak: {len(t.problems)} problems with seed {args.seed}")


if __name__ == "__main__":
    main()
