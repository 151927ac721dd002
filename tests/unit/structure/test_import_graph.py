"""The static import graph of ``attnlab`` is acyclic, imports inside functions included.

Every module under ``src/attnlab`` is parsed with :mod:`ast`; every ``import`` and
``from ... import`` anywhere in it (module level, functions, ``TYPE_CHECKING`` blocks)
that names an ``attnlab`` module becomes an edge. ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``). A package's
``__init__`` importing its own submodules is an ordinary edge ``pkg -> pkg.x``; the
implicit import of a parent package when a submodule loads is not an edge, so a
submodule may import a sibling without passing through ``__init__``. A module imported by
name (``importlib.import_module("attnlab.x")``, the name written out or held in a
module-level constant or a registry dict of the module) is an edge too, so no door up the
tree hides from the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "src"
PACKAGE = "attnlab"
# The registries docs/design.md names: they import a module by its name when it is asked
# for (a subcommand, a training task; attnlab._moved: an old path; the inspection protocol:
# the door that serves a model), and are the only modules allowed to. Their by-name imports
# are not edges. attnlab.cli is the package's __init__ (SUBCOMMANDS), not its subcommand modules.
REGISTRIES = {"attnlab.cli", "attnlab.train.tasks", "attnlab._moved", "attnlab.inspect.compute.inspectable"}


def _modules(root: Path) -> dict[str, Path]:
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _named_modules(tree: ast.Module) -> list[str]:
    """The ``attnlab`` modules a module imports by name: string constants that name one,
    where the module calls ``import_module`` at all."""
    calls = any(isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                == "import_module" for node in ast.walk(tree))
    if not calls:
        return []
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith(PACKAGE + ".") and node.value.replace(".", "").replace("_", "").isalnum()]


def import_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` within the package."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name in _named_modules(tree) if module not in REGISTRIES else ():
            if name in modules and name != module:
                edges[module].add(name)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    source = _resolve_relative(module, is_package, node.level, node.module)
                else:
                    source = node.module or ""
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in modules else source)
            for target in targets:
                # `import attnlab.a.b` names the deepest module that exists
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module and target.startswith(PACKAGE):
                    edges[module].add(target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` when the graph is a DAG."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_import_graph_of_the_package_is_acyclic() -> None:
    edges = import_edges(_modules(SOURCE))
    assert len(edges) > 30
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return _modules(root)


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "attnlab/__init__.py": "",
        "attnlab/pkg/__init__.py": "from .a import f\n",
        "attnlab/pkg/a.py": "from .b import g\ndef f():\n    return g()\n",
        "attnlab/pkg/b.py": "def g():\n    from attnlab.pkg.a import f\n    return f\n",
    })
    cycle = find_cycle(import_edges(modules))
    assert cycle is not None and {"attnlab.pkg.a", "attnlab.pkg.b"} <= set(cycle)


def test_a_package_init_importing_its_submodules_is_no_cycle(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "attnlab/__init__.py": "from .pkg import f\n",
        "attnlab/pkg/__init__.py": "from .a import f\nfrom . import b\n",
        "attnlab/pkg/a.py": "from .b import g\nfrom attnlab.pkg import b\ndef f():\n    return g()\n",
        "attnlab/pkg/b.py": "import torch\ndef g():\n    return 1\n",
    })
    edges = import_edges(modules)
    assert edges["attnlab.pkg"] == {"attnlab.pkg.a", "attnlab.pkg.b"}
    assert edges["attnlab.pkg.a"] == {"attnlab.pkg.b"}
    assert find_cycle(edges) is None


def test_a_name_from_a_package_is_an_edge_to_its_init(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "attnlab/__init__.py": "",
        "attnlab/pkg/__init__.py": "from .a import f\n",
        "attnlab/pkg/a.py": "def f():\n    from attnlab.other import h\n",
        "attnlab/other.py": "from attnlab.pkg import f\nh = f\n",
    })
    edges = import_edges(modules)
    assert edges["attnlab.other"] == {"attnlab.pkg"}
    cycle = find_cycle(edges)
    assert cycle is not None and "attnlab.other" in cycle


def test_only_the_registries_import_modules_by_name() -> None:
    users = sorted(module for module, path in _modules(SOURCE).items()
                   if _named_modules(ast.parse(path.read_text(encoding="utf-8"))) and module not in REGISTRIES)
    assert users == []


def _unseen_doors(tree: ast.Module) -> list[int]:
    """Lines of ``import_module`` / ``__import__`` calls whose module name is computed (an
    f-string, a concatenation, a call): the graph cannot tell which module they open."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args:
            if not isinstance(node.args[0], (ast.Constant, ast.Name, ast.Subscript, ast.Attribute)):
                lines.append(node.lineno)
    return lines


def test_no_module_outside_the_registries_opens_a_computed_module_name() -> None:
    """A door whose target is computed (``import_module(f"{__name__}.x")``) is invisible to
    the graph; outside the registries, modules import by plain ``import`` statements."""
    doors = sorted(f"{module}:{line}" for module, path in _modules(SOURCE).items() if module not in REGISTRIES
                   for line in _unseen_doors(ast.parse(path.read_text(encoding="utf-8"))))
    assert doors == []


def test_a_computed_module_name_is_found(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "attnlab/__init__.py": "",
        "attnlab/low.py": "import importlib\ndef f(name):\n    return importlib.import_module(f'attnlab.{name}')\n",
    })
    assert _unseen_doors(ast.parse(modules["attnlab.low"].read_text())) == [3]


def test_a_module_imported_by_name_is_an_edge(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "attnlab/__init__.py": "",
        "attnlab/low.py": "import importlib\nLOADER = 'attnlab.high'\ndef f():\n    return importlib.import_module(LOADER)\n",
        "attnlab/high.py": "from attnlab.low import f\n",
    })
    edges = import_edges(modules)
    assert edges["attnlab.low"] == {"attnlab.high"}
    cycle = find_cycle(edges)
    assert cycle is not None and {"attnlab.low", "attnlab.high"} <= set(cycle)


@pytest.mark.parametrize("module, level, name, is_package, expected", [
    ("attnlab.train.run", 1, "tasks", False, "attnlab.train.tasks"),
    ("attnlab.train.run", 2, "data", False, "attnlab.data"),
    ("attnlab.train", 1, "run", True, "attnlab.train.run"),
    ("attnlab.inspect.pages.report", 3, None, False, "attnlab"),
])
def test_relative_imports_resolve(module: str, level: int, name, is_package: bool, expected: str) -> None:
    assert _resolve_relative(module, is_package, level, name) == expected


def test_no_module_of_the_library_uses_pyplot() -> None:
    """Pictures are matplotlib Figures on the Agg canvas: pyplot keeps global state and may open windows."""
    users = []
    for module, path in _modules(SOURCE).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            if any(name == "matplotlib.pyplot" or name.startswith("matplotlib.pyplot.") for name in names):
                users.append(module)
    assert users == []


@pytest.mark.parametrize("lower, upper", [
    ("attnlab.attention", ("attnlab.layers", "attnlab.models", "attnlab.checkpoints", "attnlab.data",
                           "attnlab.train", "attnlab.inspect")),
    ("attnlab.layers", ("attnlab.models", "attnlab.checkpoints", "attnlab.data", "attnlab.train", "attnlab.inspect")),
    ("attnlab.data", ("attnlab.models", "attnlab.checkpoints", "attnlab.train", "attnlab.inspect", "attnlab.hf",
                      "attnlab.workflows", "attnlab.serve", "attnlab.cli")),
    ("attnlab.models", ("attnlab.checkpoints", "attnlab.train", "attnlab.inspect")),
    ("attnlab._pretrained_io", ("attnlab.checkpoints", "attnlab.models")),
    ("attnlab.checkpoints", ("attnlab.train", "attnlab.inspect", "attnlab.hf", "attnlab.workflows", "attnlab.serve",
                             "attnlab.cli")),
    ("attnlab.train", ("attnlab.inspect", "attnlab.hf", "attnlab.workflows", "attnlab.serve", "attnlab.cli")),
    ("attnlab.inspect.compute", ("attnlab.inspect.draw", "attnlab.train")),
    ("attnlab.inspect.draw", ("attnlab.train",)),
    ("attnlab.inspect", ("attnlab.hf", "attnlab.workflows", "attnlab.serve", "attnlab.cli")),
    ("attnlab.hf", ("attnlab.workflows", "attnlab.serve", "attnlab.cli")),
    ("attnlab.workflows", ("attnlab.serve", "attnlab.cli")),
    ("attnlab.serve", ("attnlab.cli",)),
])
def test_lower_packages_never_import_upper_ones(lower: str, upper: tuple[str, ...]) -> None:
    """The layering docs/design.md draws under "What may import what"."""
    edges = import_edges(_modules(SOURCE))
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items() if module == lower or module.startswith(lower + ".")
        for target in targets if any(target == name or target.startswith(name + ".") for name in upper)
    )
    assert wrong == []


def test_nothing_but_the_command_line_imports_it() -> None:
    """``attnlab.cli`` is the top floor: no module under ``src/attnlab`` imports it but its own."""
    def inside(name: str) -> bool:
        return name == "attnlab.cli" or name.startswith("attnlab.cli.")

    edges = import_edges(_modules(SOURCE))
    wrong = sorted(f"{module} -> {target}" for module, targets in edges.items() if not inside(module)
                   for target in targets if inside(target))
    assert wrong == []
