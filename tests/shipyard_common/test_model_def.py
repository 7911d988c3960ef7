"""Tests for model definitions: validating the uploaded v1File list, deterministic packing, and
safe unpacking, including hand-built malicious archives."""

from __future__ import annotations

import base64
import gzip
import io
import os
import random
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipyard_common.model_def import (
    ModelDefInvalid,
    ModelFile,
    normalize_model_path,
    pack_model_definition,
    unpack_model_definition,
    validate_model_definition,
)

REG = ord(tarfile.REGTYPE)  # 48, what the det CLI sends for files
DIR = ord(tarfile.DIRTYPE)  # 53, for directories


def v1file(
    path: str, content: bytes = b"", *, type: int = REG, mode: int = 0o100644, **extra: Any
) -> dict[str, Any]:
    """A file entry exactly as determined's v1File.to_json() writes it (mtime string-encoded)."""
    entry = {
        "path": path,
        "type": type,
        "content": base64.b64encode(content).decode("ascii"),
        "mtime": "1700000000",
        "mode": mode,
        "uid": 0,
        "gid": 0,
    }
    entry.update(extra)
    return entry


def refused(files: list[Any], **kwargs: Any) -> ModelDefInvalid:
    with pytest.raises(ModelDefInvalid) as info:
        validate_model_definition(files, **kwargs)
    return info.value


# ----------------------------------------------------------------------------------------------
# validate_model_definition
# ----------------------------------------------------------------------------------------------


def test_valid_upload_is_decoded_in_order() -> None:
    files = [
        v1file("model_def.py", b"import torch\n"),
        v1file("data", type=DIR, mode=0o40755),
        v1file("data/labels.txt", b"cat\ndog\n", mode=0o100600),
        v1file("run.sh", b"#!/bin/sh\n", mode=0o100755),
    ]
    assert validate_model_definition(files) == [
        ModelFile("model_def.py", b"import torch\n", 0o644, False),
        ModelFile("data", b"", 0o755, True),
        ModelFile("data/labels.txt", b"cat\ndog\n", 0o600, False),
        ModelFile("run.sh", b"#!/bin/sh\n", 0o755, False),
    ]


def test_paths_are_normalized() -> None:
    files = [v1file("./a//b/./c.py", b"x"), v1file("d/", type=DIR)]
    assert [f.path for f in validate_model_definition(files)] == ["a/b/c.py", "d"]


def test_mode_keeps_permission_bits_only_and_owner_can_always_read() -> None:
    files = [
        v1file("suid", b"x", mode=0o104755),  # setuid dropped
        v1file("locked", b"x", mode=0o100000),  # owner read forced
        v1file("nomode", b"x", mode=-1),  # Determined's "unset"
        v1file("dir", type=DIR, mode=0o40500),  # owner rwx forced on directories
    ]
    files[2].pop("mode")
    modes = [f.mode for f in validate_model_definition(files)]
    assert modes == [0o755, 0o400, 0o644, 0o700]


def test_type_zero_string_typeflag_and_missing_fields_mean_a_regular_file() -> None:
    bare = {"path": "a.py", "content": base64.b64encode(b"1").decode()}
    files = [
        v1file("old.py", b"1", type=0),
        {**v1file("s.py", b"2"), "type": "48"},
        bare,
        {"path": "empty.txt"},
    ]
    out = validate_model_definition(files)
    assert [(f.path, f.is_dir, f.content) for f in out] == [
        ("old.py", False, b"1"),
        ("s.py", False, b"2"),
        ("a.py", False, b"1"),
        ("empty.txt", False, b""),
    ]


def test_empty_upload_is_fine() -> None:
    assert validate_model_definition([]) == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../evil.py", "must not contain '..' components"),
        ("a/../../evil.py", "must not contain '..' components"),
        ("a/..", "must not contain '..' components"),
        ("/etc/passwd", "must be relative, not absolute"),
        ("//host/share", "must be relative, not absolute"),
        ("..\\evil.py", "must not contain backslashes"),
        ("a\\b", "must not contain backslashes"),
        ("a\x00b", "must not contain NUL characters"),
        ("a\nb", "must not contain control characters"),
        ("", "must not be empty"),
        (".", "'.' does not name a file inside the folder"),
        ("./", "'./' does not name a file inside the folder"),
        ("x" * 256, "has a component longer than 255 bytes"),
        ("/".join(["d" * 200] * 21), "is longer than 4096 bytes"),
    ],
)
def test_path_escapes_are_refused(path: str, reason: str) -> None:
    err = refused([v1file("fine.py", b"1"), v1file(path, b"x")])
    assert err.path == "modelDefinition[1].path"
    assert err.reason == reason


def test_non_string_path() -> None:
    err = refused([{"path": 5, "type": REG, "content": ""}])
    assert (err.path, err.reason) == ("modelDefinition[0].path", "must be a string (got int)")


@pytest.mark.parametrize(
    ("typeflag", "reason"),
    [
        (ord(tarfile.SYMTYPE), "'link': symbolic links are not allowed"),
        (ord(tarfile.LNKTYPE), "'link': hard links are not allowed"),
        (ord(tarfile.CHRTYPE), "'link': character devices are not allowed"),
        (ord(tarfile.BLKTYPE), "'link': block devices are not allowed"),
        (ord(tarfile.FIFOTYPE), "'link': FIFOs are not allowed"),
        (1, "'link': unsupported file type 1; only regular files (48) and directories (53)"),
        (ord("7"), "'link': unsupported file type 55; only regular files (48) and directories (53)"),
    ],
)
def test_links_devices_and_unknown_types_are_refused(typeflag: int, reason: str) -> None:
    err = refused([v1file("link", b"/etc/passwd", type=typeflag)])
    assert (err.path, err.reason) == ("modelDefinition[0].type", reason)


def test_non_integer_type() -> None:
    err = refused([{**v1file("a"), "type": "REGULAR"}])
    assert (err.path, err.reason) == (
        "modelDefinition[0].type",
        "must be an integer tar typeflag (got 'REGULAR')",
    )


@pytest.mark.parametrize("content", ["!!!!", "abc", "aGVsbG8=\n", "aGVs bG8="])
def test_bad_base64_is_refused(content: str) -> None:
    err = refused([v1file("ok.py"), {**v1file("a.py"), "content": content}])
    assert (err.path, err.reason) == ("modelDefinition[1].content", "'a.py': content is not valid base64")


def test_content_must_be_a_string() -> None:
    err = refused([{**v1file("a.py"), "content": 12}])
    assert (err.path, err.reason) == ("modelDefinition[0].content", "must be a base64 string (got int)")


def test_directory_with_content_is_refused() -> None:
    err = refused([v1file("d", b"data", type=DIR)])
    assert (err.path, err.reason) == ("modelDefinition[0].content", "'d': a directory has no content")


def test_duplicate_paths_after_normalization_are_refused() -> None:
    err = refused([v1file("a.py", b"1"), v1file("b.py"), v1file("./a.py", b"2")])
    assert (err.path, err.reason) == (
        "modelDefinition[2].path",
        "duplicate path 'a.py' (also modelDefinition[0])",
    )


def test_file_used_as_a_directory_is_refused() -> None:
    err = refused([v1file("a/b/c.py", b"1"), v1file("a/b", b"i am a file")])
    assert (err.path, err.reason) == (
        "modelDefinition[0].path",
        "'a/b/c.py' is inside 'a/b', which is a file",
    )


def test_total_size_limit() -> None:
    files = [v1file("a", b"x" * 600), v1file("b", b"y" * 400)]
    assert len(validate_model_definition(files, max_bytes=1000)) == 2  # exactly at the limit
    err = refused([*files, v1file("c", b"z")], max_bytes=1000)
    assert err.path == "modelDefinition"
    assert err.reason == "model definition is larger than the limit of 1000 bytes (at 'c')"


def test_oversized_content_is_refused_before_decoding() -> None:
    # Not valid base64 at all, but so long it cannot fit: the size check must come first.
    err = refused([{"path": "big", "type": REG, "content": "A" * 4000 + "!"}], max_bytes=1000)
    assert err.path == "modelDefinition"
    assert "larger than the limit of 1000 bytes" in err.reason


def test_file_count_limit() -> None:
    assert len(validate_model_definition([v1file(f"f{i}") for i in range(5)], max_files=5)) == 5
    err = refused([v1file(f"f{i}") for i in range(6)], max_files=5)
    assert (err.path, err.reason) == ("modelDefinition", "has 6 entries, more than the limit of 5")


@pytest.mark.parametrize("files", ["not a list", b"bytes", {"path": "a"}, None])
def test_upload_must_be_a_list(files: Any) -> None:
    err = refused(files)
    assert (err.path, err.reason) == ("modelDefinition", "must be a list of files")


def test_entries_must_be_objects() -> None:
    err = refused([v1file("a"), "b.py"])
    assert (err.path, err.reason) == ("modelDefinition[1]", "must be an object with path, type and content")


def test_error_str_has_path_and_reason() -> None:
    assert str(ModelDefInvalid("modelDefinition[3].path", "bad")) == "modelDefinition[3].path: bad"


def test_normalize_model_path() -> None:
    assert normalize_model_path("a/./b//c") == "a/b/c"
    assert normalize_model_path("café/ü.py") == "café/ü.py"
    with pytest.raises(ValueError):
        normalize_model_path("a/../b")


# ----------------------------------------------------------------------------------------------
# pack_model_definition
# ----------------------------------------------------------------------------------------------

TREE = [
    ModelFile("train.py", b"print('hi')\n", 0o644, False),
    ModelFile("pkg", b"", 0o755, True),
    ModelFile("pkg/__init__.py", b"", 0o644, False),
    ModelFile("pkg/run.sh", b"#!/bin/sh\necho\n", 0o755, False),
    ModelFile("empty_dir", b"", 0o700, True),
    ModelFile("données/é.txt", "é".encode(), 0o600, False),
]


def test_pack_is_deterministic_and_order_independent() -> None:
    first = pack_model_definition(TREE)
    shuffled = list(TREE)
    random.Random(7).shuffle(shuffled)
    assert pack_model_definition(shuffled) == first
    assert pack_model_definition(list(reversed(TREE))) == first


def test_pack_normalizes_metadata() -> None:
    archive = pack_model_definition(TREE)
    assert archive[:2] == b"\x1f\x8b"  # gzip
    assert archive[4:8] == b"\x00\x00\x00\x00"  # no timestamp in the gzip header
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == sorted(f.path for f in TREE)
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
            assert m.isdir() or m.isreg()
        by_name = {m.name: m for m in members}
        assert by_name["pkg/run.sh"].mode == 0o755
        assert tar.extractfile(by_name["données/é.txt"]).read() == "é".encode()  # type: ignore[union-attr]


def test_pack_refuses_unsafe_or_duplicate_paths() -> None:
    with pytest.raises(ModelDefInvalid):
        pack_model_definition([ModelFile("../x", b"", 0o644, False)])
    with pytest.raises(ModelDefInvalid):
        pack_model_definition([ModelFile("./x", b"", 0o644, False)])
    with pytest.raises(ModelDefInvalid):
        pack_model_definition([ModelFile("x", b"1", 0o644, False), ModelFile("x", b"2", 0o644, False)])


def test_pack_of_nothing_is_a_valid_empty_archive(tmp_path: Path) -> None:
    unpack_model_definition(pack_model_definition([]), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


# ----------------------------------------------------------------------------------------------
# unpack_model_definition
# ----------------------------------------------------------------------------------------------


def read_tree(root: Path) -> list[ModelFile]:
    out = []
    for path in sorted(root.rglob("*")):
        st_ = path.lstat()
        rel = path.relative_to(root).as_posix()
        if stat.S_ISDIR(st_.st_mode):
            out.append(ModelFile(rel, b"", stat.S_IMODE(st_.st_mode), True))
        else:
            assert stat.S_ISREG(st_.st_mode)
            out.append(ModelFile(rel, path.read_bytes(), stat.S_IMODE(st_.st_mode), False))
    return out


def test_upload_to_disk_round_trip(tmp_path: Path) -> None:
    files = validate_model_definition(
        [v1file(f.path, f.content, type=DIR if f.is_dir else REG, mode=f.mode) for f in TREE]
    )
    archive = pack_model_definition(files)
    unpack_model_definition(archive, tmp_path / "trial")
    on_disk = read_tree(tmp_path / "trial")
    assert sorted(on_disk, key=lambda f: f.path) == sorted(
        [*TREE, ModelFile("données", b"", 0o755, True)], key=lambda f: f.path
    )
    # What the agent extracted packs back to the very same bytes (modulo the implicit parent).
    assert pack_model_definition([f for f in on_disk if f.path != "données"]) == archive


def test_unpack_into_existing_directory_replaces_regular_files(tmp_path: Path) -> None:
    dest = tmp_path / "trial"
    dest.mkdir()
    (dest / "train.py").write_text("old")
    (dest / "keep.txt").write_text("untouched")
    unpack_model_definition(pack_model_definition(TREE), dest)
    assert (dest / "train.py").read_bytes() == b"print('hi')\n"
    assert (dest / "keep.txt").read_text() == "untouched"


def test_read_only_directory_does_not_block_its_own_files(tmp_path: Path) -> None:
    files = [ModelFile("ro", b"", 0o500, True), ModelFile("ro/a.txt", b"a", 0o444, False)]
    dest = tmp_path / "out"
    unpack_model_definition(pack_model_definition(files), dest)
    assert (dest / "ro" / "a.txt").read_bytes() == b"a"
    assert stat.S_IMODE((dest / "ro").stat().st_mode) == 0o700  # owner rwx forced
    assert stat.S_IMODE((dest / "ro" / "a.txt").stat().st_mode) == 0o444


def build_tar(members: list[tuple[tarfile.TarInfo, bytes | None]], *, compress: bool = True) -> bytes:
    """A hand-made archive, bypassing every safety check of pack_model_definition."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


def member(name: str, type: bytes = tarfile.REGTYPE, **attrs: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = type
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def assert_refused_and_nothing_written(archive: bytes, tmp_path: Path, index: int, fragment: str) -> None:
    dest = tmp_path / "dest"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, dest)
    assert info.value.path == f"archive[{index}]"
    assert fragment in info.value.reason
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "evil.py").exists()


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("../evil.py", "must not contain '..' components"),
        ("ok/../../evil.py", "must not contain '..' components"),
        ("/tmp/evil.py", "must be relative, not absolute"),
        ("..\\evil.py", "must not contain backslashes"),
        ("./", "does not name a file"),
    ],
)
def test_unpack_refuses_escaping_paths(tmp_path: Path, name: str, fragment: str) -> None:
    archive = build_tar([(member("fine.py"), b"ok"), (member(name), b"pwned")])
    assert_refused_and_nothing_written(archive, tmp_path, 1, fragment)


@pytest.mark.parametrize(
    ("info", "fragment"),
    [
        (member("link", tarfile.SYMTYPE, linkname="/etc/passwd"), "symbolic links are not allowed"),
        (member("link", tarfile.SYMTYPE, linkname="../../evil.py"), "symbolic links are not allowed"),
        (member("hard", tarfile.LNKTYPE, linkname="fine.py"), "hard links are not allowed"),
        (member("tty", tarfile.CHRTYPE, devmajor=5, devminor=0), "character devices are not allowed"),
        (member("disk", tarfile.BLKTYPE, devmajor=8, devminor=0), "block devices are not allowed"),
        (member("pipe", tarfile.FIFOTYPE), "FIFOs are not allowed"),
        (member("cont", tarfile.CONTTYPE), "unsupported member type"),
    ],
)
def test_unpack_refuses_links_and_devices(tmp_path: Path, info: tarfile.TarInfo, fragment: str) -> None:
    archive = build_tar([(member("fine.py"), b"ok"), (info, None)])
    assert_refused_and_nothing_written(archive, tmp_path, 1, fragment)


def test_unpack_refuses_symlink_then_write_through_it(tmp_path: Path) -> None:
    # The classic two-step escape: a symlink to outside, then a file "inside" the symlink.
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = build_tar(
        [(member("sub", tarfile.SYMTYPE, linkname=str(outside)), None), (member("sub/evil.py"), b"pwned")]
    )
    with pytest.raises(ModelDefInvalid):
        unpack_model_definition(archive, tmp_path / "dest")
    assert list(outside.iterdir()) == []


def test_unpack_does_not_follow_symlinks_already_in_destination(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "sub")
    os.symlink(outside / "target.txt", dest / "file.txt")
    archive = pack_model_definition([ModelFile("sub/evil.py", b"pwned", 0o644, False)])
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, dest)
    assert "is not a directory" in info.value.reason
    archive = pack_model_definition([ModelFile("file.txt", b"pwned", 0o644, False)])
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, dest)
    assert "is not a regular file" in info.value.reason
    assert list(outside.iterdir()) == []


def test_unpack_refuses_duplicate_members(tmp_path: Path) -> None:
    archive = build_tar([(member("a.py"), b"1"), (member("./a.py"), b"2")])
    assert_refused_and_nothing_written(archive, tmp_path, 1, "duplicate path 'a.py'")


def test_unpack_refuses_more_than_max_bytes(tmp_path: Path) -> None:
    archive = build_tar([(member("a"), b"x" * 600), (member("b"), b"y" * 600)])
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, tmp_path / "dest", max_bytes=1000)
    assert (info.value.path, info.value.reason) == ("archive", "unpacks to more than the limit of 1000 bytes")
    assert not (tmp_path / "dest").exists()
    unpack_model_definition(archive, tmp_path / "dest", max_bytes=1200)  # exactly at the limit


def test_unpack_refuses_a_compression_bomb_from_its_header(tmp_path: Path) -> None:
    size = 32 * 1024 * 1024

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readinto(self, buffer: Any) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = bytes(n)
            self.left -= n
            return n

    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        tar.addfile(member("zeros", size=size), Zeros())
    archive = raw.getvalue()
    assert len(archive) < size // 100  # tiny on the wire
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, tmp_path / "dest", max_bytes=1024 * 1024)
    assert info.value.reason == f"unpacks to more than the limit of {1024 * 1024} bytes"
    assert not (tmp_path / "dest").exists()


def test_unpack_refuses_too_many_members(tmp_path: Path) -> None:
    archive = build_tar([(member(f"f{i}"), b"") for i in range(4)])
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, tmp_path / "dest", max_files=3)
    assert (info.value.path, info.value.reason) == ("archive", "has more than 3 entries")


@pytest.mark.parametrize(
    "archive",
    # mtime=0: the same bytes (and test id) in every pytest-xdist worker, whenever it collects.
    [b"", b"not an archive at all", gzip.compress(b"not a tar", mtime=0), b"\x1f\x8b\x08\x00garbage"],
    ids=["empty", "text", "gzip-not-tar", "truncated-gzip"],
)
def test_unpack_refuses_garbage(tmp_path: Path, archive: bytes) -> None:
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive, tmp_path / "dest")
    assert info.value.path == "archive"
    assert info.value.reason.startswith("not a valid tar.gz archive")


def test_unpack_refuses_truncated_archive(tmp_path: Path) -> None:
    archive = pack_model_definition([ModelFile("big.bin", os.urandom(50_000), 0o644, False)])
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(archive[: len(archive) // 2], tmp_path / "dest")
    assert info.value.path == "archive"


def test_unpack_accepts_plain_tar(tmp_path: Path) -> None:
    unpack_model_definition(build_tar([(member("a.py"), b"1")], compress=False), tmp_path / "dest")
    assert (tmp_path / "dest" / "a.py").read_bytes() == b"1"


def test_unpack_refuses_destination_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "dest").write_text("x")
    with pytest.raises(ModelDefInvalid) as info:
        unpack_model_definition(pack_model_definition(TREE), tmp_path / "dest")
    assert info.value.reason == f"destination {tmp_path / 'dest'} is not a directory"


def test_unpack_through_a_symlinked_destination_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "dest")
    unpack_model_definition(pack_model_definition(TREE), tmp_path / "dest")
    assert (tmp_path / "real" / "train.py").read_bytes() == b"print('hi')\n"


# ----------------------------------------------------------------------------------------------
# Property: upload -> pack -> unpack gives back the same tree, and pack is deterministic
# ----------------------------------------------------------------------------------------------

_component = st.text(alphabet="abcxyz_-.é0", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))


@st.composite
def _trees(draw: st.DrawFn) -> list[ModelFile]:
    dirs = draw(st.lists(st.lists(_component, min_size=1, max_size=3).map("/".join), max_size=4, unique=True))
    files: dict[str, ModelFile] = {}
    all_dirs = {d for d in dirs}
    for d in dirs:
        parts = d.split("/")
        all_dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    for d in sorted(all_dirs):
        files[d] = ModelFile(d, b"", draw(st.sampled_from([0o755, 0o700, 0o750])), True)
    for _ in range(draw(st.integers(0, 6))):
        parent = draw(st.sampled_from(["", *sorted(all_dirs)]))
        name = draw(_component)
        path = f"{parent}/{name}" if parent else name
        if path in files or any(p.startswith(path + "/") for p in files):
            continue
        files[path] = ModelFile(
            path, draw(st.binary(max_size=64)), draw(st.sampled_from([0o644, 0o600, 0o755])), False
        )
    return list(files.values())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(_trees(), st.randoms(use_true_random=False))
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, tree: list[ModelFile], rnd: random.Random
) -> None:
    upload = [v1file(f.path, f.content, type=DIR if f.is_dir else REG, mode=f.mode) for f in tree]
    rnd.shuffle(upload)
    validated = validate_model_definition(upload)
    archive = pack_model_definition(validated)
    assert pack_model_definition(list(reversed(validated))) == archive
    dest = tmp_path_factory.mktemp("rt")
    unpack_model_definition(archive, dest)
    assert sorted(read_tree(dest), key=lambda f: f.path) == sorted(tree, key=lambda f: f.path)
