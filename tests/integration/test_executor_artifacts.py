"""Artifacts from every source into the per-host cache, with real files, a real HTTP server on
loopback and real threads: cache hits, digest checks, size limits, and why a fetch failed."""

from __future__ import annotations

import asyncio
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from executor import (
    ArtifactCache,
    ArtifactFetcher,
    ArtifactMissingError,
    DigestMismatchError,
    FetchFailedError,
    FetchReason,
    InvalidArtifactError,
    pack_bytes,
    pack_path,
    sha256_hex,
)
from tests.conftest import free_port, wait_for_async

JOB = b"print('hello from job')\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes, dict[str, str]]] = {}
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (a size limit): expected

    def _answer(self) -> None:
        if self.path == "/slow.py":
            self.release.wait(10)  # answers only once the test is over (bounded)
        if self.path == "/unbounded.py":  # no Content-Length: the body runs until close
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"#" * 1024)
            return
        if self.path == "/cut.py":  # the connection drops half way through the body
            self.send_response(200)
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b"#" * 1024)
            return
        status, body, headers = self.routes.get(self.path, (404, b"missing", {}))
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web(tmp_path):
    """An HTTP server on 127.0.0.1 serving `routes`; stopped after the test."""
    _Handler.routes = {}
    _Handler.release = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Handler.routes
    finally:
        _Handler.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def run(coro):
    return asyncio.run(coro)


def fetcher(tmp_path: Path, **kwargs) -> ArtifactFetcher:
    max_bytes = kwargs.pop("max_bytes", 1 << 20)
    return ArtifactFetcher(ArtifactCache(tmp_path / "data" / "artifacts", max_bytes=max_bytes),
                           **kwargs)


def test_a_file_url_installs_a_read_only_program_and_hits_the_cache(tmp_path):
    job = tmp_path / "src" / "job.py"
    job.parent.mkdir()
    job.write_bytes(JOB)
    f = fetcher(tmp_path)

    async def go():
        artifact = await f.ensure(job.as_uri())
        again = await f.ensure(job.as_uri(), digest=artifact.digest)
        return artifact, again

    artifact, again = run(go())
    assert artifact == again
    assert f.fetches == 1  # the second call, with a digest, never read the file
    assert artifact.digest == sha256_hex(pack_path(job, max_bytes=1 << 20))
    assert artifact.root == tmp_path / "data" / "artifacts" / artifact.digest
    assert (artifact.program / "job.py").read_bytes() == JOB
    assert not os.stat(artifact.program / "job.py").st_mode & 0o222
    assert not os.stat(artifact.program).st_mode & 0o222
    f.cache.verify(artifact.digest)
    assert f.cache.digests() == [artifact.digest]


def test_a_directory_installs_as_its_tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "__main__.py").write_text("import pkg.mod\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "mod.py").write_text("print('mod')\n")
    artifact = run(fetcher(tmp_path).ensure(src.as_uri()))
    assert sorted(str(p.relative_to(artifact.program)) for p in artifact.program.rglob("*")) == [
        "__main__.py", "pkg", "pkg/__init__.py", "pkg/mod.py"]


def test_uploaded_bytes_come_from_the_uploader_once(tmp_path):
    blob = pack_bytes("job.py", JOB)
    digest = sha256_hex(blob)
    asked: list[str] = []

    async def go():
        opened = asyncio.Event()

        async def upload(d: str) -> bytes | None:
            asked.append(d)
            await opened.wait()  # every concurrent ensure is waiting on this one fetch
            return blob

        f = fetcher(tmp_path, upload=upload)
        waiting = [asyncio.create_task(f.ensure(f"sha256:{digest}")) for _ in range(5)]
        await wait_for_async(lambda: asked, what="the uploader to be asked")
        opened.set()
        results = await asyncio.gather(*waiting)
        hit = await f.ensure(f"sha256:{digest}")
        return results, hit, f.fetches

    results, hit, fetches = run(go())
    assert asked == [digest] and fetches == 1
    assert {r.digest for r in results} == {digest} and hit == results[0]
    assert (hit.program / "job.py").read_bytes() == JOB


def test_upload_failures(tmp_path):
    digest = sha256_hex(pack_bytes("job.py", JOB))

    async def nobody(d: str) -> bytes | None:
        return None

    async def liar(d: str) -> bytes | None:
        return pack_bytes("job.py", b"something else\n")

    async def go():
        with pytest.raises(ArtifactMissingError):
            await fetcher(tmp_path).ensure(f"sha256:{digest}")  # no uploader at all
        with pytest.raises(ArtifactMissingError):
            await fetcher(tmp_path, upload=nobody).ensure(f"sha256:{digest}")
        with pytest.raises(DigestMismatchError) as caught:
            await fetcher(tmp_path, upload=liar).ensure(f"sha256:{digest}")
        assert caught.value.expected == digest and caught.value.actual != digest

    run(go())
    cache = ArtifactCache(tmp_path / "data" / "artifacts")
    assert cache.digests() == []
    assert not any(p.name.startswith(".incoming") for p in cache.directory.iterdir())


def test_a_pack_that_is_not_a_program_is_refused_and_leaves_nothing(tmp_path):
    cache = ArtifactCache(tmp_path / "artifacts")
    with pytest.raises(InvalidArtifactError):
        cache.install(b"\x00" * 2048)
    assert list(cache.directory.iterdir()) == []


def test_size_limits_apply_to_every_source(tmp_path, web):
    base, routes = web
    routes["/big.py"] = (200, b"#" * 5000, {})
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * 5000)
    blob = pack_bytes("job.py", b"#" * 5000)

    async def upload(d: str) -> bytes | None:
        return blob

    async def go():
        f = fetcher(tmp_path, max_bytes=4096, upload=upload)
        for source in (big.as_uri(), f"{base}/big.py", f"{base}/unbounded.py",
                       f"sha256:{sha256_hex(blob)}"):
            with pytest.raises(FetchFailedError) as caught:
                await f.ensure(source)
            assert caught.value.reason == FetchReason.TOO_LARGE, source
            assert not caught.value.retriable

    run(go())


def test_http_sources_single_files_and_packs(tmp_path, web):
    base, routes = web
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "__main__.py").write_bytes(JOB)
    pack = pack_path(tree, max_bytes=1 << 20)
    routes["/dl/job.py"] = (200, JOB, {})
    routes["/dl/app.tar"] = (200, pack, {})
    routes["/moved.py"] = (302, b"", {"Location": "/dl/job.py"})

    async def go():
        f = fetcher(tmp_path)
        single = await f.ensure(f"{base}/dl/job.py")
        packed = await f.ensure(f"{base}/dl/app.tar", digest=sha256_hex(pack))
        moved = await f.ensure(f"{base}/moved.py")
        return single, packed, moved

    single, packed, moved = run(go())
    assert single.digest == sha256_hex(pack_bytes("job.py", JOB))
    assert (single.program / "job.py").read_bytes() == JOB
    assert (packed.program / "__main__.py").read_bytes() == JOB
    assert (moved.program / "moved.py").read_bytes() == JOB


def test_http_failures_say_why(tmp_path, web):
    base, routes = web
    routes["/error.py"] = (500, b"boom", {})
    routes["/forbidden.py"] = (403, b"no", {})
    routes["/job.py"] = (200, JOB, {})
    routes["/to-file.py"] = (302, b"", {"Location": "file:///etc/passwd"})
    closed_port = free_port()

    async def reason_of(source: str, **kwargs) -> FetchFailedError:
        with pytest.raises(FetchFailedError) as caught:
            await fetcher(tmp_path, timeout=kwargs.pop("timeout", 10.0)).ensure(source, **kwargs)
        return caught.value

    async def go():
        missing = await reason_of(f"{base}/nothing.py")
        assert (missing.reason, missing.retriable) == (FetchReason.NOT_FOUND, False)
        error = await reason_of(f"{base}/error.py")
        assert (error.reason, error.retriable) == (FetchReason.HTTP_STATUS, True)
        forbidden = await reason_of(f"{base}/forbidden.py")
        assert (forbidden.reason, forbidden.retriable) == (FetchReason.HTTP_STATUS, False)
        refused = await reason_of(f"http://127.0.0.1:{closed_port}/job.py")
        assert (refused.reason, refused.retriable) == (FetchReason.UNREACHABLE, True)
        slow = await reason_of(f"{base}/slow.py", timeout=0.3)
        assert (slow.reason, slow.retriable) == (FetchReason.TIMEOUT, True)
        redirect = await reason_of(f"{base}/to-file.py")
        assert (redirect.reason, redirect.retriable) == (FetchReason.UNSUPPORTED, False)
        with pytest.raises(DigestMismatchError):
            await fetcher(tmp_path).ensure(f"{base}/job.py", digest="00" * 32)

    run(go())


def test_file_failures_say_why(tmp_path):
    async def go():
        with pytest.raises(FetchFailedError) as caught:
            await fetcher(tmp_path).ensure((tmp_path / "nope.py").as_uri())
        assert caught.value.reason == FetchReason.NOT_FOUND

    run(go())


def test_concurrent_installers_of_one_digest_both_succeed(tmp_path):
    blob = pack_bytes("job.py", JOB)
    caches = [ArtifactCache(tmp_path / "artifacts") for _ in range(4)]
    results: list[object] = []
    threads = [threading.Thread(target=lambda c=c: results.append(c.install(blob)))
               for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4 and len({r.digest for r in results}) == 1
    assert caches[0].digests() == [sha256_hex(blob)]
    assert [p.name for p in caches[0].directory.iterdir()] == [sha256_hex(blob)]


def test_leftovers_of_an_interrupted_install_are_cleaned(tmp_path):
    cache = ArtifactCache(tmp_path / "artifacts")
    (cache.directory / ".incoming-abc-1234" / "program").mkdir(parents=True)
    os.chmod(cache.directory / ".incoming-abc-1234" / "program", 0o555)
    assert cache.clean_incoming() == 1
    assert list(cache.directory.iterdir()) == []


def _refused_half_way() -> bytes:
    """A pack that passes every check before unpacking and is refused once some of it is
    on disk: its second member's mtime is past what the platform can set."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, mtime in (("__main__.py", 0), ("b.py", 2**80)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 100_000, mtime
            tar.addfile(info, io.BytesIO(b"#" * info.size))
    return buf.getvalue()


def test_a_pack_refused_half_way_through_unpacking_leaves_nothing(tmp_path):
    """The install's `.incoming-*` directory goes when the install ends, refused or not,
    without a restart."""
    hostile = _refused_half_way()

    async def upload(d: str) -> bytes | None:
        return hostile

    f = fetcher(tmp_path, upload=upload)
    with pytest.raises(InvalidArtifactError, match="refused while unpacking"):
        run(f.ensure(f"sha256:{sha256_hex(hostile)}"))
    assert list(f.cache.directory.iterdir()) == []


def test_a_download_cut_off_is_refused_and_leaves_nothing(tmp_path, web):
    """A body shorter than its Content-Length was taken whole: a program cut off half way
    was installed and would have run. It is refused as unreachable (worth a retry), and
    nothing of it is on disk (downloads are held in memory, at most `max_bytes`)."""
    base, _ = web
    f = fetcher(tmp_path)
    with pytest.raises(FetchFailedError, match="1024 of 4096 bytes") as caught:
        run(f.ensure(f"{base}/cut.py"))
    assert caught.value.reason == FetchReason.UNREACHABLE and caught.value.retriable
    assert list(f.cache.directory.iterdir()) == []


def test_remove_deletes_a_read_only_install(tmp_path):
    cache = ArtifactCache(tmp_path / "artifacts")
    artifact = cache.install(pack_bytes("job.py", JOB))
    assert cache.remove(artifact.digest)
    assert not cache.remove(artifact.digest)
    assert cache.lookup(artifact.digest) is None


def test_verify_notices_a_changed_pack(tmp_path):
    cache = ArtifactCache(tmp_path / "artifacts")
    artifact = cache.install(pack_bytes("job.py", JOB))
    artifact.pack.write_bytes(b"tampered")
    with pytest.raises(DigestMismatchError):
        cache.verify(artifact.digest)


_CRASH_WHILE_REMOVING = """
import os, sys
from executor import ArtifactCache
real_unlink, calls = os.unlink, []
def unlink(*args, **kwargs):
    calls.append(args)
    if len(calls) == 2:
        os._exit(9)  # the host dies half way through the removal
    return real_unlink(*args, **kwargs)
os.unlink = unlink
ArtifactCache(sys.argv[1]).remove(sys.argv[2])
"""


def test_an_artifact_half_removed_by_a_crash_is_never_used(tmp_path):
    tree = tmp_path / "prog"
    for name in ("a.py", "b.py", "c.py", "d.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(JOB)
    cache = ArtifactCache(tmp_path / "artifacts")
    artifact = cache.install(pack_path(tree, max_bytes=1 << 20))
    done = subprocess.run([sys.executable, "-c", _CRASH_WHILE_REMOVING, str(cache.directory),
                           artifact.digest], env={**os.environ, "PYTHONPATH": os.getcwd()},
                          timeout=60)
    assert done.returncode == 9
    restarted = ArtifactCache(tmp_path / "artifacts")
    restarted.clean_incoming()
    found = restarted.lookup(artifact.digest)
    if found is not None:  # still there: then whole
        restarted.verify(found.digest)
        assert sorted(os.listdir(found.program)) == ["a.py", "b.py", "c.py", "d.py"]
