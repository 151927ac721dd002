"""Small files, one concept each: no source file of the package is longer than a reader
takes in at one sitting (500 lines)."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "src" / "attnlab"
MAX_LINES = 500
SUFFIXES = (".py", ".cpp", ".h", ".js", ".css", ".html")
# A file that must stay longer, with the reason (none today).
EXCEPTIONS: dict[str, str] = {}


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_source_file_is_longer_than_500_lines() -> None:
    files = [path for path in sorted(SOURCE.rglob("*")) if path.is_file() and path.suffix in SUFFIXES]
    assert len(files) > 100  # the walk found the package
    long = {str(path.relative_to(SOURCE)): _line_count(path) for path in files
            if str(path.relative_to(SOURCE)) not in EXCEPTIONS and _line_count(path) > MAX_LINES}
    assert long == {}, f"split these along a seam (one concept per file): {long}"


def test_every_exception_still_exists_and_is_still_long() -> None:
    for name in EXCEPTIONS:
        path = SOURCE / name
        assert path.is_file() and _line_count(path) > MAX_LINES, f"{name} needs no exception any more"
