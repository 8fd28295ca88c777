"""llama.cpp for the benchmarks: built once from the pinned `llama-cpp-python` sdist (which vendors
llama.cpp, its `convert_hf_to_gguf.py` and gguf-py) into a cache folder outside the repository,
then used to convert a model folder to GGUF and to time it with its own tools.

A benchmark-only dependency (README, Dependencies): nothing in Parley imports it. The sdist comes
from PyPI through pip; the build needs cmake and a C++ compiler. `Unavailable` carries the one
line a benchmark prints when any of that is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp is built (pinned: figures name it)
TARGETS = ("llama-bench", "llama-mtmd-cli", "llama-quantize", "llama-server")
# Native code for this CPU, as a user's own build would get; no network code, no tests. The server
# (tests/bench/day_of_chats.py) without HTTPS and without its web UI (neither fetched nor built).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_CCACHE=OFF",
)

# The converter, run with two shims for the test fixtures' tokenizer (a small BPE laid out at
# Qwen's ids): llama.cpp recognises a BPE pre-tokenizer by hashing how it splits a test string,
# which only published tokenizers match, so it is named as the published model's ("qwen2"); and
# Qwen2-VL's converter tries a sentencepiece vocabulary first, which needs a package this
# project does not install although the folder has none. The weights are converted unchanged.
CONVERT_SHIM = r"""
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.argv[0] = "convert_hf_to_gguf.py"
import convert_hf_to_gguf as cli
from conversion import base, qwenvl
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
qwenvl.Qwen2VLModel.set_vocab = base.TextModel._set_vocab_gpt2
cli.main()
"""


# The model both sides of a comparison run: Qwen2-VL-2B-Instruct at its published shape with seeded
# random weights (tests/fixtures/published_configs.py); --quick keeps the widths with 2 text layers
# and 3 vision blocks (the converter maps the projector's `merger.mlp.2` by block number, so it
# needs 3) and a 4096-token vocabulary.
PEER_SHAPE = "Qwen2-VL-2B-Instruct"
PEER_QUICK = {"layers": 2, "vision_layers": 3, "vocab_size": 4096}


# GGUF files on which llama.cpp's weight repacking crashed here, and the line that says so (seen:
# SIGSEGV in ggml_backend_amx_mul_mat prefilling q8_0 on a Sapphire Rapids VM, llama.cpp 0c1e570)
NO_REPACK: dict[Path, str] = {}


class Unavailable(Exception):
    """llama.cpp cannot be had here; the message is the one line a benchmark prints."""


def cache_root() -> Path:
    base = os.environ.get("PARLEY_BENCH_CACHE") or Path.home() / ".cache" / "parley-bench"
    return Path(base) / "llama.cpp" / LLAMA_CPP_PYTHON


@contextlib.contextmanager
def _locked(folder: Path):
    """One builder at a time (two benchmarks, or two engineers, on one machine)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, **kw) -> None:
    """Run a build step in its own process group, killed whole if this process is interrupted, so
    no compiler outlives a stopped benchmark and writes into the next build's folder."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        try:
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        done = subprocess.CompletedProcess(cmd, proc.returncode)
    if done.returncode != 0:
        # tqdm's bars are no reason; on a full disk the reason could not be written at all
        said = [s for s in log.read_text(errors="replace").splitlines() if s.strip() and "%|" not in s]
        free = shutil.disk_usage(log.parent).free
        why = f"the disk is full ({free >> 20} MiB free)" if free < 256 << 20 else (said[-1:] or [""])[0][:200]
        raise Unavailable(f"{Path(cmd[0]).name} failed (exit {done.returncode}; log {log}): {why}")


@dataclass(frozen=True)
class LlamaCpp:
    root: Path  # the cache folder of this version

    @property
    def source(self) -> Path:
        return self.root / "src"

    def tool(self, name: str) -> Path:
        return self.root / "build" / "bin" / name

    @property
    def info(self) -> dict:
        return json.loads((self.root / "built.json").read_text())

    # ------------------------------------------------------------------ conversion

    def convert(self, model_dir: Path, outtype: str, out: Path, mmproj: bool = False) -> Path:
        """`convert_hf_to_gguf.py` on `model_dir`; the language model, or with `mmproj` the vision
        tower and projector. Skipped when `out` exists (conversions are minutes at full size)."""
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        cmd = [
            sys.executable,
            "-c",
            CONVERT_SHIM,
            str(self.source),
            str(model_dir),
            "--outtype",
            outtype,
            "--outfile",
            str(tmp),
        ] + (["--mmproj"] if mmproj else [])
        _run(cmd, out.parent / "convert.log", env=dict(os.environ, PYTHONPATH=str(self.source / "gguf-py")))
        made = tmp if tmp.exists() else next(out.parent.glob(f"*{tmp.stem}*.part"), None)
        if made is None:
            raise Unavailable(f"convert_hf_to_gguf.py wrote no {tmp.name}")
        os.replace(made, out)
        return out

    def picture_model(self, quick: bool, tag: str) -> tuple[Path, Path, Path]:
        """(model folder, bf16 GGUF of its language model, f16 mmproj of its vision tower) for
        PEER_SHAPE, built once and converted once into `<model>-<tag>-gguf-<version>` beside it
        (kept: minutes at full size; `tag` keeps one benchmark's files from another's clean-up)."""
        from tests.fixtures.published_configs import build_published

        model_dir = build_published(PEER_SHAPE, **(PEER_QUICK if quick else {}))
        gdir = model_dir.parent / f"{model_dir.name}-{tag}-gguf-{LLAMA_CPP_PYTHON}"
        lm = self.convert(model_dir, "bf16", gdir / "lm-bf16.gguf")
        mmproj = self.convert(model_dir, "f16", gdir / "mmproj-f16.gguf", mmproj=True)
        return model_dir, lm, mmproj

    def quantize(self, source: Path, kind: str, out: Path) -> Path:
        if not out.exists():
            tmp = out.with_suffix(".part")
            _run([str(self.tool("llama-quantize")), str(source), str(tmp), kind], out.parent / "convert.log")
            os.replace(tmp, out)
        return out

    # ------------------------------------------------------------------ timing

    def bench(self, gguf: Path, threads: int, prompt: int = 0, generate: int = 0, depth: int = 0) -> float:
        """tokens/s of one llama-bench test: prefill of `prompt` tokens, or `generate` tokens
        decoded after `depth` tokens of context (one repetition, after its own warm-up).
        Weight repacking (llama.cpp's AMX / interleaved layouts) stays on, as a user gets it,
        unless it crashed on this file (see `no_repack`)."""

        def run(repack: bool):
            cmd = [
                str(self.tool("llama-bench")),
                "-m",
                str(gguf),
                "-t",
                str(threads),
                "-p",
                str(prompt),
                "-n",
                str(generate),
                "-d",
                str(depth),
                "-r",
                "1",
                "-o",
                "json",
                "--repack",
                str(int(repack)),
            ]
            return subprocess.run(cmd, capture_output=True, text=True)

        done = run(gguf not in NO_REPACK)
        if done.returncode < 0 and gguf not in NO_REPACK:  # killed by a signal: a crash, not a refusal
            NO_REPACK[gguf] = (
                f"llama.cpp crashed (signal {-done.returncode}) with weight repacking on {gguf.name}: "
                "measured with --repack 0"
            )
            done = run(False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-400:]
            raise RuntimeError(f"llama-bench failed (exit {done.returncode}): {tail}")
        rows = json.loads(done.stdout)
        return float(rows[0]["avg_ts"])

    def picture_first_token(self, gguf: Path, mmproj: Path, picture: Path, question: str, threads: int) -> float:
        """Seconds from a picture and question to the first reply token in `llama-mtmd-cli`, by
        its own log clock: from formatting the message (after the model, the projector and their
        warm-up runs are loaded, which Parley's figure leaves out too) to the timings it prints
        right after the first token (-v puts a timestamp on every line)."""
        cmd = [
            str(self.tool("llama-mtmd-cli")),
            "-m",
            str(gguf),
            "--mmproj",
            str(mmproj),
            "--image",
            str(picture),
            "-p",
            question,
            "-n",
            "1",
            "-t",
            str(threads),
            "--temp",
            "0",
            "-v",
        ]
        cmd += ["--no-repack"] if gguf in NO_REPACK else []
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        log = done.stdout + "\n" + done.stderr
        if done.returncode != 0:
            raise RuntimeError(f"llama-mtmd-cli failed (exit {done.returncode}): {log.strip()[-400:]}")
        start = _stamp(log, "chat_add_and_format")
        end = _stamp(log, "llama_perf_context_print")
        if start is None or end is None:
            raise RuntimeError(f"llama-mtmd-cli's log has no timestamps where expected:\n{log[-1500:]}")
        return end - start


NOT_BUILT = "llama.cpp is not built on this machine: `make bench-tools` builds it once"


def ensure(
    say=lambda line: print(line, file=sys.stderr, flush=True), build: bool = True, need: tuple[str, ...] = TARGETS
) -> LlamaCpp:
    """The built llama.cpp of the pinned version with the tools in `need`, building it on first use
    (minutes: said first) unless `build` is False (the test suite's quick run: a build does not
    belong in `make test`). A build from before a tool joined TARGETS gets the missing ones added
    in its own build folder (only what they need is compiled)."""
    root = cache_root()
    with _locked(root):
        if (root / "built.json").exists():
            llama = LlamaCpp(root)
            missing = [t for t in TARGETS if not llama.tool(t).exists()]
            if not missing:
                return llama
            if not build:
                if any(t in missing for t in need):
                    raise Unavailable(f"{', '.join(missing)} not built on this machine: `make bench-tools` adds it")
                return llama
            return _add_targets(root, missing, say)
        if not build:
            raise Unavailable(NOT_BUILT)
        cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
        if cmake is None or not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
            raise Unavailable("llama.cpp cannot be built here: cmake and a C++ compiler are needed")
        log = root / "build.log"
        log.unlink(missing_ok=True)
        sdist = root / "sdist"
        if not any(sdist.glob("*.tar.gz")):
            say(f"llama.cpp: fetching the llama-cpp-python {LLAMA_CPP_PYTHON} sdist from PyPI (once)")
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "-d",
                    str(sdist),
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                ],
                log,
            )
        archive = next(sdist.glob("*.tar.gz"))
        src = root / "src"
        if not (src / "CMakeLists.txt").exists():
            shutil.rmtree(src, ignore_errors=True)
            tmp = root / "src.part"
            shutil.rmtree(tmp, ignore_errors=True)
            prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                for m in members:
                    m.name = m.name[len(prefix) :]
                tar.extractall(tmp, members=[m for m in members if m.name], filter="data")
            os.replace(tmp, src)
        t0 = time.monotonic()
        say(f"llama.cpp: building {', '.join(TARGETS)} into {root} (once; ~15-25 min on 2 cores)")
        # built aside and moved into place whole: a build cut short never passes for a finished one
        build, part = root / "build", root / "build.part"
        shutil.rmtree(part, ignore_errors=True)
        gen = ["-G", "Ninja"] if ninja else []
        _run([cmake, "-S", str(src), "-B", str(part), *gen, *CMAKE_FLAGS], log)
        _run([cmake, "--build", str(part), "-j", str(os.cpu_count() or 2), "--target", *TARGETS], log)
        shutil.rmtree(build, ignore_errors=True)
        os.replace(part, build)  # the tools are linked statically: nothing in them names the folder
        (root / "built.json").write_text(
            json.dumps(
                {
                    "llama_cpp_python": LLAMA_CPP_PYTHON,
                    "cmake_flags": CMAKE_FLAGS,
                    "build_s": round(time.monotonic() - t0),
                    "commit": _vendored_commit(src),
                },
                indent=1,
            )
        )
        return LlamaCpp(root)


def _add_targets(root: Path, missing: list[str], say) -> LlamaCpp:
    """Build `missing` in the existing build folder, reconfigured with today's CMAKE_FLAGS: ninja
    recompiles only what they need (llama-server on the 0.3.36 build: the server's own sources
    and cpp-httplib). The folder was configured as build.part, so it goes back there for the
    build (CMake refuses a cache moved elsewhere) and returns into place whole when it is done."""
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if cmake is None:
        raise Unavailable("llama.cpp cannot be built here: cmake is needed")
    log = root / "build.log"
    build, part = root / "build", root / "build.part"
    if not part.exists():
        os.replace(build, part)
    elif build.exists():  # an earlier addition was cut short after the move: build.part is that folder
        shutil.rmtree(build)
    t0 = time.monotonic()
    say(f"llama.cpp: adding {', '.join(missing)} to the build in {root} (once; minutes on 2 cores)")
    gen = ["-G", "Ninja"] if ninja else []
    _run([cmake, "-S", str(root / "src"), "-B", str(part), *gen, *CMAKE_FLAGS], log)
    _run([cmake, "--build", str(part), "-j", str(os.cpu_count() or 2), "--target", *TARGETS], log)
    os.replace(part, build)
    info = json.loads((root / "built.json").read_text())
    info["cmake_flags"] = CMAKE_FLAGS
    info.setdefault("added", []).append({"targets": missing, "build_s": round(time.monotonic() - t0)})
    (root / "built.json").write_text(json.dumps(info, indent=1))
    return LlamaCpp(root)


def _stamp(log: str, marker: str) -> float | None:
    """Seconds of llama.cpp's log clock (`M.SS.mmm.uuu` at the start of a line) on the first line
    that contains `marker`."""
    for line in log.splitlines():
        if marker in line:
            m = re.match(r"(\d+)\.(\d+)\.(\d+)\.(\d+) ", line)
            if m:
                mins, secs, ms, us = (int(x) for x in m.groups())
                return mins * 60 + secs + ms / 1e3 + us / 1e6
    return None


def _vendored_commit(src: Path) -> str:
    """The ggml version and commit the sdist vendors, as its CMake reports them."""
    log = (src.parent / "build.log").read_text(errors="replace")
    found = [
        line.split(":", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith(("-- ggml version:", "-- ggml commit:"))
    ]
    return "ggml " + ", commit ".join(found[:2]) if found else "unknown"


if __name__ == "__main__":  # `make bench-tools`: build it now, outside any benchmark
    try:
        print(f"llama.cpp ready in {ensure().root}")
    except Unavailable as exc:
        raise SystemExit(str(exc)) from None
