"""The API against clients that mean harm, over real sockets on loopback: a thousand idle
connections do not lock an authorised client out, and pictures sent past the cap never take the
picture folder over it (nor the disk under its floor), while pictures a turn still needs stay."""

from __future__ import annotations

import io
import resource
import shutil
import socket
from pathlib import Path

import pytest
from PIL import Image

from engine.api import ApiError, ApiServer
from engine.api.pictures import store_upload
from engine.pictures.ref import digest_of
from engine.pictures.store import PictureSpaceError, PictureStore
from tests.fixtures.pictures import picture_bytes
from tests.helpers.api_served import data_url
from tests.helpers.engine_helpers import open_engine
from tests.helpers.remote_servers import ParleyServe

openai = pytest.importorskip("openai")

IDLE = 1000


def _room_for_sockets(n: int) -> None:
    """This process holds `n` sockets (the server side is another process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the open-file limit here is {hard}; the test needs {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def test_a_thousand_idle_sockets_do_not_lock_out_an_authorised_request(tiny_model, tmp_path):
    _room_for_sockets(IDLE)
    serve = ParleyServe(tiny_model("llava"), tmp_path / "data", token="s3cret")
    idle: list[socket.socket] = []
    try:
        host, port = serve.url.split("//")[1].split("/")[0].rsplit(":", 1)
        for _ in range(IDLE):  # connected, never a byte sent: what anyone on the network can do
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        client = openai.OpenAI(base_url=serve.url, api_key="s3cret", max_retries=0, timeout=60)
        [model] = [m.id for m in client.models.list().data]
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=2, temperature=0
        )
        assert r.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):  # the token is still required of everyone
            openai.OpenAI(base_url=serve.url, api_key="wrong", max_retries=0).models.list()
    finally:
        for s in idle:
            s.close()
        serve.close()
    log = serve.proc.stderr.read()
    assert len(log.splitlines()) < 5, log[-2000:]  # no line per refused or dropped connection


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    eng = open_engine(tiny_model("llava"), tmp_path_factory.mktemp("api-hostile") / "data")
    yield eng
    eng.shutdown()


def test_idle_connections_past_the_limit_make_way_for_new_ones(engine):
    """The descriptors idle sockets may take are capped: past `max_waiting` the one waiting
    longest is closed, so a new client always gets in even where descriptors are few."""
    server = ApiServer(engine, "127.0.0.1", 0, max_waiting=50).start()
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(200)]
    try:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model=engine.loaded.name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
        )
        assert r.usage.completion_tokens == 2
        assert idle[0].recv(1) == b""  # the longest waiting was closed by the server
        idle[-1].sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # the newest still works
        assert idle[-1].recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for s in idle:
            s.close()
        server.stop()


def on_disk(folder: Path) -> int:
    """Bytes of pictures in the folder, read from the filesystem (not the store's books)."""
    return sum(p.stat().st_size for p in folder.glob("??/*") if p.is_file())


def bmp(i: int, side: int = 256) -> bytes:
    """A distinct uncompressed picture: 3 bytes a pixel (~196 KB at 256 x 256)."""
    out = io.BytesIO()
    Image.open(io.BytesIO(picture_bytes(i, size=(side, side)))).save(out, "BMP")
    return out.getvalue()


def test_distinct_pictures_past_the_cap_keep_it_at_every_step(engine, tmp_path):
    cap = 1 << 20
    server = ApiServer(engine, "127.0.0.1", 0, data_dir=tmp_path, max_picture_bytes=cap).start()
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    folder = tmp_path / "pictures"
    try:
        for i in range(14):  # 2.7 MB sent in all
            pic = tmp_path / f"p{i}.bmp"
            pic.write_bytes(bmp(i))
            r = client.chat.completions.create(
                model=engine.loaded.name,
                max_tokens=1,
                temperature=0,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": data_url(pic, "image/bmp")}},
                        ],
                    }
                ],
            )
            assert r.usage.completion_tokens == 1
            assert on_disk(folder) <= cap, f"step {i}: {on_disk(folder)} bytes on disk, cap {cap}"
        assert server.pictures.pruned >= 8  # the oldest went first; the newest is there
        assert server.pictures.find(digest_of(bmp(13))) and not server.pictures.find(digest_of(bmp(0)))
    finally:
        server.stop()


def test_a_picture_larger_than_the_cap_is_413(engine, tmp_path):
    server = ApiServer(engine, "127.0.0.1", 0, data_dir=tmp_path, max_picture_bytes=100_000).start()
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    pic = tmp_path / "big.bmp"
    pic.write_bytes(bmp(1))
    try:
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(
                model=engine.loaded.name,
                max_tokens=1,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": data_url(pic, "image/bmp")}}],
                    }
                ],
            )
        assert err.value.status_code == 413 and err.value.body["code"] == "picture_too_large"
        assert on_disk(tmp_path / "pictures") == 0
    finally:
        server.stop()


def test_pictures_in_use_are_never_pruned_the_newcomer_is_refused(tmp_path):
    a, b, c = bmp(1), bmp(2), bmp(3)
    store = PictureStore(tmp_path / "pictures", max_transient_bytes=len(a) + len(b) + 1000)
    turn = store.hold()  # a turn in progress that will read a and b
    store_upload(store, a, "p", turn)
    store_upload(store, b, "p", turn)
    with pytest.raises(ApiError) as refused:
        store_upload(store, c, "messages[0].content[0]")
    err = refused.value
    assert err.status == 507 and err.code == "insufficient_storage" and "in use" in err.message
    assert on_disk(store.folder) == len(a) + len(b)
    turn.release()  # the turn ended: its pictures (oldest first) make room
    assert Path(store_upload(store, c, "p").path).exists()
    assert on_disk(store.folder) <= store.max_transient_bytes and store.pruned >= 1


def test_pictures_never_take_the_disk_below_the_floor(small_disk):
    folder = small_disk.root / "pictures"
    floor = 5 << 20  # of the 8 MiB disk
    store = PictureStore(folder, max_transient_bytes=1 << 30, min_free_bytes=floor)
    for i in range(8):  # 6.3 MB in all, but only ~3 MB may be used
        data = bmp(i, 512)  # ~786 KB
        store.put(data, ".bmp", transient=True)
        assert shutil.disk_usage(small_disk.root).free >= floor, f"step {i}"
    assert store.pruned >= 1
    held = store.hold()
    for name, _ in store.names():
        store.put((folder / name[:2] / name).read_bytes(), ".bmp", transient=True, hold=held)
    with pytest.raises(PictureSpaceError, match="free"):  # only pictures in use remain
        store.put(bmp(99, 512), ".bmp", transient=True)
    assert shutil.disk_usage(small_disk.root).free >= floor
    held.release()


def test_the_store_refuses_a_cap_it_cannot_keep(tmp_path):
    store = PictureStore(tmp_path / "pictures", max_transient_bytes=1000)
    with pytest.raises(PictureSpaceError, match="more than"):
        store.put(bmp(1), ".bmp", transient=True)
    assert on_disk(store.folder) == 0
