"""The pages' stylesheets and scripts are package data files (``inspect/draw/assets``), never
Python strings: no string in the library holds a CSS rule or a line of script."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "src" / "attnlab"
# selector { property: value; } with a property pages use
CSS_RULE = re.compile(r"\{[^}]*\b(font|margin|padding|color|background|border|display|width|flex)[\w-]*\s*:[^;{}]+;")
SCRIPT = re.compile(r"\bfunction\s*\([^)]*\)\s*\{|\bdocument\.\w+|\.addEventListener\(")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def test_no_python_string_holds_css_or_javascript() -> None:
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if CSS_RULE.search(node.value) or SCRIPT.search(node.value):
                    found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert found == []


def test_every_asset_the_pages_name_ships_as_package_data() -> None:
    names = {match for path in (SOURCE / "inspect" / "draw").glob("*.py")
             for match in re.findall(r"""asset\(["']([\w.]+)["']\)""", path.read_text(encoding="utf-8"))}
    assert {"report.css", "report.js", "explanation.css", "explanation.js"} <= names
    assert all((SOURCE / "inspect" / "draw" / "assets" / name).is_file() for name in names)
