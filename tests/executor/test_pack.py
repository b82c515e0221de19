"""Deterministic packs and the hostile-input checks of unpacking."""

import io
import os
import tarfile

import pytest

from catalog.errors import StorageError
from executor import InvalidArtifactError, pack_bytes, pack_path, sha256_hex, unpack

MAX = 1 << 20


def make_tree(root, order):
    for rel in order:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n")
    return root


def test_the_same_tree_packs_to_the_same_bytes_whatever_the_metadata(tmp_path):
    names = ["__main__.py", "lib/util.py", "lib/data/x.txt", "README"]
    a = make_tree(tmp_path / "a", names)
    b = make_tree(tmp_path / "b", list(reversed(names)))
    os.utime(b / "lib" / "util.py", (1, 1))
    os.chmod(b / "README", 0o600)
    (b / "lib" / "__pycache__").mkdir()
    (b / "lib" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"junk")
    (b / "stale.pyc").write_bytes(b"junk")
    assert pack_path(a, max_bytes=MAX) == pack_path(b, max_bytes=MAX)


def test_content_and_executable_bits_change_the_digest(tmp_path):
    tree = make_tree(tmp_path / "t", ["__main__.py"])
    first = sha256_hex(pack_path(tree, max_bytes=MAX))
    os.chmod(tree / "__main__.py", 0o755)
    second = sha256_hex(pack_path(tree, max_bytes=MAX))
    (tree / "__main__.py").write_text("changed\n")
    third = sha256_hex(pack_path(tree, max_bytes=MAX))
    assert len({first, second, third}) == 3


def test_a_single_file_packs_as_one_member_named_after_it(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("print(1)\n")
    blob = pack_path(job, max_bytes=MAX)
    assert blob == pack_bytes("job.py", b"print(1)\n")
    names = unpack(blob, tmp_path / "out")
    assert names == ["job.py"]
    assert (tmp_path / "out" / "job.py").read_text() == "print(1)\n"


def test_unpack_round_trips_a_tree_with_modes(tmp_path):
    tree = make_tree(tmp_path / "t", ["__main__.py", "pkg/mod.py"])
    (tree / "empty").mkdir()
    os.chmod(tree / "pkg" / "mod.py", 0o755)
    unpack(pack_path(tree, max_bytes=MAX), tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "mod.py").read_text() == "# pkg/mod.py\n"
    assert (tmp_path / "out" / "empty").is_dir()
    assert os.stat(tmp_path / "out" / "pkg" / "mod.py").st_mode & 0o100


def test_packing_refuses_what_is_not_a_program(tmp_path):
    with pytest.raises(InvalidArtifactError, match="no such file"):
        pack_path(tmp_path / "missing", max_bytes=MAX)
    tree = make_tree(tmp_path / "t", ["a.py"])
    (tree / "loop").symlink_to(tree)
    with pytest.raises(InvalidArtifactError, match="symlink to a directory"):
        pack_path(tree, max_bytes=MAX)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidArtifactError, match="neither a file nor a directory"):
        pack_path(tmp_path / "fifo", max_bytes=MAX)


def test_a_symlinked_file_packs_as_its_content(tmp_path):
    tree = make_tree(tmp_path / "t", ["real.py"])
    (tree / "link.py").symlink_to(tree / "real.py")
    unpack(pack_path(tree, max_bytes=MAX), tmp_path / "out")
    assert not (tmp_path / "out" / "link.py").is_symlink()
    assert (tmp_path / "out" / "link.py").read_text() == "# real.py\n"


def test_packing_stops_at_the_size_limit(tmp_path):
    (tmp_path / "big.py").write_bytes(b"#" * 10_000)
    with pytest.raises(InvalidArtifactError, match="more than 4096 bytes"):
        pack_path(tmp_path / "big.py", max_bytes=4096)


def hostile(*members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name, data=b"x", kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.linkname = linkname
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("blob, message", [
    (hostile(member("/etc/evil")), "unsafe member name"),
    (hostile(member("../evil")), "unsafe member name"),
    (hostile(member("a/../../evil")), "unsafe member name"),
    (hostile(member("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")), "not a regular"),
    (hostile(member("hard", kind=tarfile.LNKTYPE, linkname="x")), "not a regular"),
    (hostile(member("dev", kind=tarfile.CHRTYPE)), "not a regular"),
    (hostile(member("fifo", kind=tarfile.FIFOTYPE)), "not a regular"),
    (hostile(member("a"), member("a")), "appears twice"),
    (hostile(), "empty"),
    (b"not a tar at all" * 64, "not a program pack"),
    (b"", "not a program pack"),
])
def test_unpack_refuses_hostile_packs(tmp_path, blob, message):
    with pytest.raises(InvalidArtifactError, match=message):
        unpack(blob, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_unpack_refuses_too_many_members(tmp_path):
    blob = hostile(*(member(f"f{i}") for i in range(11)))
    with pytest.raises(InvalidArtifactError, match="more than 10 members"):
        unpack(blob, tmp_path / "out", max_members=10)


def test_unpack_refuses_a_truncated_pack(tmp_path):
    blob = pack_bytes("job.py", b"print(1)\n" * 200)
    with pytest.raises(InvalidArtifactError):
        unpack(blob[:700], tmp_path / "out")


def test_unpack_into_an_unwritable_place_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError):
        unpack(pack_bytes("job.py", b"1"), tmp_path / "file" / "out")


def test_unpack_refuses_a_long_chain_of_extended_headers(tmp_path):
    # tarfile reads each GNU long-name (or pax) header by recursing into the next one, so a
    # pack of a few thousand of them in a row, well under the size limit, hits the recursion
    # limit: that is a hostile pack, not a bug in the executor.
    longname = tarfile.TarInfo("a" * 200).tobuf(format=tarfile.GNU_FORMAT)
    chain = longname[:-512] * 3000 + pack_bytes("job.py", b"1")
    assert len(chain) < 4 * MAX
    with pytest.raises(InvalidArtifactError, match="corrupt program pack|not a program pack"):
        unpack(chain, tmp_path / "out")


@pytest.mark.parametrize("names", [["a", "a/b"], ["a/b", "a"], ["d/a", "d/a/b/c"]])
def test_unpack_refuses_a_file_that_is_also_a_directory(tmp_path, names):
    # The pack is at fault, not this host's disk: InvalidArtifactError, not StorageError.
    with pytest.raises(InvalidArtifactError, match="both a file and a directory"):
        unpack(hostile(*(member(name) for name in names)), tmp_path / "out")


@pytest.mark.parametrize("name", ["a" * 300, "a/" * 2100 + "f"])
def test_unpack_refuses_names_too_long_for_the_disk(tmp_path, name):
    # A component past NAME_MAX failed as the host's StorageError; thousands of nested
    # directories as RecursionError (an executor bug): both are the pack's fault.
    with pytest.raises(InvalidArtifactError, match="too long"):
        unpack(hostile(member(name)), tmp_path / "out")


def test_packing_refuses_a_name_that_unpacking_would(tmp_path):
    # Else `tq submit` uploads a program every executor then refuses at each spawn.
    tree = make_tree(tmp_path / "t", ["main.py", "data\\x.txt"])
    with pytest.raises(InvalidArtifactError, match="backslash"):
        pack_path(tree, max_bytes=MAX)
    with pytest.raises(InvalidArtifactError, match="backslash"):
        pack_path(tree / "data\\x.txt", max_bytes=MAX)


@pytest.mark.parametrize("pax_headers, data", [
    ({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s",
      "GNU.sparse.realsize": "10"}, b"1\n" + b"\0" * 510),  # a sparse map int() cannot read
    ({"mtime": "1e400"}, b"x"),  # os.utime: OverflowError
    ({"mtime": "nan"}, b"x"),  # os.utime: ValueError
])
def test_unpack_refuses_malformed_header_values(tmp_path, pax_headers, data):
    # tarfile lets ValueError or OverflowError out for these: the pack's fault, not an
    # executor bug.
    info = tarfile.TarInfo("s")
    info.size = len(data)
    info.pax_headers = pax_headers
    with pytest.raises(InvalidArtifactError, match="program pack|pack refused"):
        unpack(hostile((info, data)), tmp_path / "out")
