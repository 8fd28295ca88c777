"""One life of the soak's app (tests/bench/soak.py): the engine and the history database as the
window uses them, driven over stdin, in a process of its own so that the soak can kill it.

Commands come one JSON object a line on stdin; answers go to stdout as lines starting with "@@ "
(anything else a library prints is ignored). `arm` makes the process SIGKILL itself at the k-th
write event from now: a rename or an fsync of any file (KV blobs, pictures, the image cache,
rates), or a write statement of the history database (its sqlite trace), whichever thread makes
it. The kind and file of that event go to stderr first, so the soak can say where it died.

Started once as a zygote (imports done), it forks a process per life; a probe is a forked
second process on a data folder in use: it loads the model, prints every notice and quits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class KillSwitch:
    """Counts write events (and, armed for reads, reads of KV blobs: a restore); at the armed one
    the process dies at once, as a power cut would."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events = 0
        self.kill_at = 0  # 0: not armed
        self.reads = False  # counting reads of KV blobs instead of writes

    def arm(self, k: int, reads: bool = False) -> None:
        with self.lock:
            self.events, self.kill_at, self.reads = 0, k, reads

    def disarm(self) -> None:
        with self.lock:
            self.kill_at = 0

    def event(self, kind: str, what: str) -> None:
        if (kind == "read") != self.reads:
            return
        with self.lock:
            self.events += 1
            due = self.events == self.kill_at
        if due:
            os.write(2, f"\nkilled at {kind} {what}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)


SWITCH = KillSwitch()


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def install_hooks() -> None:
    """Wrap the os calls every durable write goes through; before engine/ is imported, since its
    platform layer keeps a reference to os.fdatasync from import time."""
    real_replace, real_fsync, real_fdatasync = os.replace, os.fsync, os.fdatasync

    def replace(src, dst, *a, **k):
        SWITCH.event("rename", os.fspath(dst))
        return real_replace(src, dst, *a, **k)

    def fsync(fd):
        SWITCH.event("fsync", _fd_path(fd))
        return real_fsync(fd)

    def fdatasync(fd):
        SWITCH.event("fsync", _fd_path(fd))
        return real_fdatasync(fd)

    os.replace, os.fsync, os.fdatasync = replace, fsync, fdatasync
    real_pread, real_preadv = os.pread, os.preadv

    def read_event(fd: int) -> None:
        if SWITCH.reads and SWITCH.kill_at:  # looked up only while armed for a restore
            path = _fd_path(fd)
            if "kv-store" in path:
                SWITCH.event("read", path)

    def pread(fd, n, offset):
        read_event(fd)
        return real_pread(fd, n, offset)

    def preadv(fd, buffers, offset, *a):
        read_event(fd)
        return real_preadv(fd, buffers, offset, *a)

    os.pread, os.preadv = pread, preadv


def say(obj: dict) -> None:
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Life:
    def __init__(self, args) -> None:
        from app.history.history import History
        from engine.local.engine import Engine
        from engine.protocol.client import load_blocking
        from engine.protocol.events import Notice, SpillState
        from engine.protocol.settings import EngineSettings

        self.notices: list[str] = []
        self.spill_states: list = []
        self.spill_cond = threading.Condition()
        self._last_report = None
        self.history = History(args.data)
        # as the window starts: deletions from earlier sessions are final, unused pictures go
        self.history.purge_deleted()
        self.history.purge_orphan_pictures()
        # the history's write statements are write events too (sqlite writes in C, unseen by os.*)
        self.history._db.set_trace_callback(self._sql)
        settings = EngineSettings().with_changes(
            dict(
                dtype="float32",
                weights="fp32",
                block_tokens=args.block,
                spill_idle_s=3600.0,
                elastic_idle_s=0.5,
                store_cap_bytes=args.cap,
            )
        )
        self.engine = Engine(settings, Path(args.data)).start()

        def listen(e) -> None:
            if isinstance(e, Notice):
                self.notices.append(e.message)
            elif isinstance(e, SpillState):
                with self.spill_cond:
                    self.spill_states.append(e)
                    self.spill_cond.notify_all()

        self.engine.add_listener(listen)
        load_blocking(self.engine, args.model)

    @staticmethod
    def _sql(statement: str) -> None:
        verb = statement.split(None, 1)[0].upper() if statement.strip() else ""
        if verb in ("INSERT", "UPDATE", "DELETE", "COMMIT"):
            SWITCH.event("history", verb)

    # ------------------------------------------------------------ commands

    def new_chat(self, cmd: dict) -> dict:
        return {"chat": self.history.create_conversation().id}

    def engine_messages(self, chat: str) -> tuple[list, list]:
        """The chat as the window sends it (complete messages, pictures as the engine's refs), and
        the same as JSON for the soak's reference: role, text, [stored file, digest, fragment]."""
        from engine.protocol.events import Message

        kept = [m for m in self.history.messages(chat) if m.status == "complete"]
        messages = [Message(m.role, m.text, [self.history.picture_ref(p) for p in m.named_pictures()]) for m in kept]
        wire = [
            [
                m.role,
                m.text,
                [[str(self.history.pictures.path(p.file)), p.digest, p.fragment] for p in m.named_pictures()],
            ]
            for m in kept
        ]
        return messages, wire

    def store_picture(self, source: str) -> str:
        """A picture, or a PDF page named `file.pdf#p=N@DPI`, into the picture store: its ref."""
        from engine.pictures import parts
        from engine.pictures.ref import PictureRef

        base, fragment = parts.split(source)
        if not fragment:
            return self.history.add_picture(base)
        return self.history.add_file(base, PictureRef.of_file(base).digest) + "#" + fragment

    def turn(self, cmd: dict) -> dict:
        from engine.protocol.client import run_blocking
        from engine.protocol.events import Sampling, Turn, TurnDone

        chat = cmd["chat"]
        if cmd.get("text") is not None:  # else: answer the user message already there (after a kill)
            refs = [self.store_picture(p) for p in cmd["pictures"]]
            user = self.history.add_message(chat, "user", cmd["text"], refs)
            say({"committed": user.id, "chat": chat, "role": "user", "text": cmd["text"]})
        messages, wire = self.engine_messages(chat)
        reply = self.history.begin_reply(chat)
        result = run_blocking(self.engine, Turn(chat, messages, Sampling(max_new_tokens=cmd["new"])))
        if not isinstance(result, TurnDone):
            self.history.delete_from(reply.id)
            return {"failed": result.message}
        self.history.finish_reply(reply.id, result.reply)
        say({"committed": reply.id, "chat": chat, "role": "assistant", "text": result.reply})
        s = result.stats
        return {
            "token_ids": result.token_ids,
            "messages": wire,
            "restored": getattr(s, "restored_tokens", 0),
        }

    def spill(self, cmd: dict) -> dict:
        chat = cmd["chat"]
        with self.spill_cond:
            start = len(self.spill_states)
        self.engine.spill_now(chat)
        final = ("spilled", "failed", "refused")
        with self.spill_cond:
            ok = self.spill_cond.wait_for(
                lambda: any(e.conversation_id == chat and e.state in final for e in self.spill_states[start:]),
                timeout=60,
            )
            states = [e for e in self.spill_states[start:] if e.conversation_id == chat]
        last = states[-1] if ok and states else None
        return {"state": last.state.value if last else "none", "detail": last.detail if last else ""}

    def open(self, cmd: dict) -> dict:
        self.engine.open_chat(cmd["chat"])
        return {}

    def idle(self, cmd: dict) -> dict:
        """An idle pause: the spill timer shortened (through the settings, as the dialog changes
        it) until every hot conversation but the open one has spilled or failed to."""
        with self.spill_cond:
            start = len(self.spill_states)
        self.engine.update_settings(spill_idle_s=0.05)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and self.hot_chats() - {cmd.get("open")}:
                with self.spill_cond:
                    self.spill_cond.wait(0.2)  # woken by the next spill event, or looks again
                    if any(e.state in ("failed", "refused") for e in self.spill_states[start:]):
                        break
        finally:
            self.engine.update_settings(spill_idle_s=3600.0)
        return {"hot": sorted(self.hot_chats())}

    def report(self):
        """A memory report from the owner thread, made between requests (so after the ones before)."""
        from engine.protocol.events import MemoryReport

        got: list = []
        ev = threading.Event()

        def listen(e) -> None:
            if isinstance(e, MemoryReport):
                got.append(e)
                ev.set()

        self.engine.add_listener(listen)
        try:
            self.engine.request_memory_report()
            ev.wait(30)
        finally:
            self.engine.remove_listener(listen)
        return got[-1] if got else None

    def hot_chats(self) -> set[str]:
        self.report()  # the sessions as the owner thread left them after the requests so far
        return {cid for cid, s in list(self.engine.sessions.items()) if s.cache is not None}

    def state(self, cmd: dict) -> dict:
        """What the soak checks after a step: the history, the store's counters and limits."""
        report = self.report()
        scheduler = self.engine.spill_scheduler
        store = scheduler.store if scheduler is not None else None
        chats = {}
        for c in self.history.list_conversations():
            chats[c.id] = [[m.id, m.role, m.text, m.status] for m in self.history.messages(c.id)]
        return {
            "history": chats,
            "store": None if report is None or report.store is None else vars(report.store),
            "status": report.store_status if report is not None else "",
            "cap": store.max_bytes if store is not None else None,
            "notices": self.notices[-5:],
        }

    def tidy(self, cmd: dict) -> dict:
        """After a kill: a reply left `interrupted` at the end of a chat is dropped (the window
        offers to retry it); the user message before it stays."""
        dropped = 0
        for c in self.history.list_conversations():
            path = self.history.messages(c.id)
            while path and path[-1].status != "complete":
                dropped += self.history.delete_from(path[-1].id)
                path = self.history.messages(c.id)
        return {"dropped": dropped}

    def delete(self, cmd: dict) -> dict:
        """The person deletes a chat: gone from the list (purged at the next start), KV forgotten."""
        self.history.delete_conversation(cmd["chat"])
        self.engine.forget(cmd["chat"])
        return {}

    def arm(self, cmd: dict) -> dict:
        SWITCH.arm(cmd["k"], cmd.get("reads", False))
        return {}

    def disarm(self, cmd: dict) -> dict:
        SWITCH.disarm()
        return {}

    def quit(self, cmd: dict) -> dict:
        self.engine.shutdown()
        self.history.close()
        return {}


def probe(args) -> None:
    """A second process opening a data folder in use: every notice it gets, one per line."""
    from engine.local.engine import Engine
    from engine.protocol.client import load_blocking
    from engine.protocol.events import Notice
    from engine.protocol.settings import EngineSettings

    engine = Engine(EngineSettings().with_changes(dict(dtype="float32", weights="fp32")), Path(args.data)).start()
    engine.add_listener(lambda e: print("notice:", e.message, flush=True) if isinstance(e, Notice) else None)
    try:
        load_blocking(engine, args.model)
    finally:
        engine.shutdown()


def serve(args) -> None:
    """One life: start the app, then answer commands until `quit` or the end of stdin."""
    try:
        life = Life(args)
    except Exception as exc:  # what a person would see instead of the app: one line
        say({"start_failed": f"{type(exc).__name__}: {exc}"})
        raise
    say({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            out = getattr(life, cmd["op"])(cmd)
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        say({"op": cmd["op"], **out})
        if cmd["op"] == "quit":
            return


def forked(cmd: dict) -> None:
    """In a process forked from the zygote: stdin, stdout and stderr become the soak's pipes
    (FIFOs, opened in the order the soak opens them), then one life or one probe runs."""
    if cmd.get("probe"):
        out = os.open(cmd["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
    else:
        os.dup2(os.open(cmd["in"], os.O_RDONLY), 0)
        os.dup2(os.open(cmd["out"], os.O_WRONLY), 1)
        os.dup2(os.open(cmd["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), 2)
    sys.stdin = os.fdopen(0, "r")
    sys.stdout = os.fdopen(1, "w")
    sys.stderr = os.fdopen(2, "w")
    args = argparse.Namespace(**cmd["args"])
    if cmd.get("probe"):
        SWITCH.disarm()
        probe(args)
    else:
        serve(args)


def zygote(model: str) -> None:
    """Import torch, transformers and the app once (a model load brings in its family's modules),
    then fork a process for each life the soak asks for: a start costs a fork and a model load,
    not seconds of imports. `reap PID` answers that child's exit code (-9: it was killed)."""
    from engine.model.heavy_imports import heavy
    from engine.model.load import load_model

    heavy()
    import app.history.history  # noqa: F401
    import engine.local.engine  # noqa: F401

    load_model(model, dtype="float32", weights="fp32")  # imports what a load needs; the copy is dropped
    say({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "fork":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    forked(cmd)
                except BaseException:
                    import traceback

                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            say({"pid": pid})
        elif cmd["op"] == "reap":
            _, status = os.waitpid(cmd["pid"], 0)
            say({"code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    install_hooks()  # before engine/ is imported: the forked lives inherit them
    import torch

    torch.set_num_threads(1)  # before any thread pool starts: forked children get no dead threads
    zygote(args.model)


if __name__ == "__main__":
    main()
