"""ppx's layers, read from its source with `ast`: a module imports from its own layer or a
lower one only (imports inside functions count; those under ``if TYPE_CHECKING:`` do not),
no import cycle joins ppx modules at import time, and no file is longer than 400 lines.

Layers, lowest first: ppx/__init__.py, ppx/errors.py, ppx/files.py, ppx/paths.py and ppx/units.py < schedules < models < config <
measure < engine < report < plan < launch < gpucheck < commands < ppx/cli.py and ppx/__main__.py.

Inside ppx/schedules/ the same rule holds between its rooms, lowest first: ir < families <
comms < sim < placing < auto < the package's own modules (registry, csv_io, csv_checks, grid and
__init__.py)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO

# the first name after "ppx." -> layer index; "" is ppx itself (ppx/__init__.py)
LAYERS = [
    ("", "errors", "files", "paths", "units"),
    ("schedules",),
    ("models",),
    ("config",),
    ("measure",),
    ("engine",),
    ("report",),
    ("plan",),
    ("launch",),
    ("gpucheck",),
    ("commands",),
    ("cli", "__main__"),
]
LAYER_OF = {part: k for k, parts in enumerate(LAYERS) for part in parts}
LAYER_NAME = ["base (ppx, ppx.errors, ppx.files, ppx.paths, ppx.units)"] + [f"ppx.{parts[0]}" for parts in LAYERS[1:]]
MAX_LINES = 400

# the rooms of ppx/schedules/, lowest first: the name after "ppx.schedules." -> room index;
# "" is ppx/schedules/__init__.py, and the package's own modules share the top room with it
ROOMS = [
    ("ir",),
    ("families",),
    ("comms",),
    ("sim",),
    ("placing",),
    ("auto",),
    ("", "registry", "csv_io", "csv_checks", "grid"),
]
ROOM_OF = {part: k for k, parts in enumerate(ROOMS) for part in parts}
ROOM_NAME = [f"ppx.schedules.{parts[0]}" for parts in ROOMS[:-1]] + [
    "ppx.schedules (registry, csv_io, csv_checks, grid)"
]


@dataclass(frozen=True)
class Import:
    file: Path  # the importing file
    line: int
    module: str  # the importing module
    target: str  # the ppx module imported
    top_level: bool  # runs when the module is imported (not inside a function)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYER_OF.get(parts[1] if len(parts) > 1 else "")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_in(tree: ast.Module) -> list[tuple[ast.stmt, bool]]:
    """Every Import/ImportFrom node with whether it runs at import time, skipping the bodies of
    ``if TYPE_CHECKING:`` (their ``else:`` runs)."""
    found: list[tuple[ast.stmt, bool]] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, top_level))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, top_level)
            return
        inner = top_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, True)
    return found


def scan(root: Path) -> tuple[dict[str, Path], list[Import]]:
    """The ppx modules under ``root`` (the folder that holds ppx/) and every import of one."""
    files = {module_name(p, root): p for p in sorted((root / "ppx").rglob("*.py")) if "__pycache__" not in p.parts}
    found = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, top_level in _imports_in(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1 packages
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from ppx import config` imports the module ppx.config; `from ppx.x import f` ppx.x
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in dict.fromkeys(targets):
                if target == "ppx" or target.startswith("ppx."):
                    found.append(Import(path, node.lineno, module, target, top_level))
    return files, found


def where(imp: Import, root: Path) -> str:
    return f"{imp.file.relative_to(root)}:{imp.line}"


def room(module: str) -> int | None:
    """The room of a module of ppx.schedules (None for one outside ppx.schedules or in no room)."""
    parts = module.split(".")
    if parts[:2] != ["ppx", "schedules"]:
        return None
    return ROOM_OF.get(parts[2] if len(parts) > 2 else "")


def room_violations(root: Path) -> list[str]:
    """ppx/schedules/'s rooms: a module in no room, and an import from a higher room."""
    files, imports = scan(root)
    inside = [m for m in files if m.split(".")[:2] == ["ppx", "schedules"]]
    out = [
        f"{files[m].relative_to(root)}: module {m} is in no room of ppx.schedules" for m in inside if room(m) is None
    ]
    for imp in imports:
        own, theirs = room(imp.module), room(imp.target)
        if own is not None and theirs is not None and theirs > own:
            out.append(
                f"{where(imp, root)}: {imp.module} ({ROOM_NAME[own]}) imports {imp.target} "
                f"from the higher room {ROOM_NAME[theirs]}"
            )
    return out


def layer_violations(root: Path) -> list[str]:
    files, imports = scan(root)
    out = [f"{files[m].relative_to(root)}: module {m} is in no layer" for m in files if layer(m) is None]
    for imp in imports:
        own, theirs = layer(imp.module), layer(imp.target)
        if own is None:
            continue  # named above
        if theirs is None:
            out.append(f"{where(imp, root)}: imports {imp.target}, which is in no layer")
        elif theirs > own:
            out.append(
                f"{where(imp, root)}: {imp.module} ({LAYER_NAME[own]}) imports {imp.target} "
                f"from the higher layer {LAYER_NAME[theirs]}"
            )
    return out


def import_cycles(root: Path) -> list[str]:
    """Cycles among top-level imports of ppx modules, found by a depth-first search: each back
    edge closes one cycle, reported as the chain of modules with the file:line of each import."""
    files, imports = scan(root)
    edges: dict[str, list[Import]] = {m: [] for m in files}
    for imp in imports:
        if imp.top_level and imp.target in files and imp.target != imp.module:
            edges[imp.module].append(imp)
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[Import] = []  # the edges from the root of the search to the current module
    cycles: dict[frozenset, str] = {}

    def visit(module: str) -> None:
        state[module] = 1
        for imp in edges[module]:
            if state.get(imp.target) == 1:  # back edge: the cycle is the stack from imp.target on
                chain = stack[next(k for k, e in enumerate(stack) if e.module == imp.target) :] + [imp]
                text = " -> ".join(f"{e.module} ({where(e, root)})" for e in chain) + f" -> {imp.target}"
                cycles.setdefault(frozenset((e.module, e.target) for e in chain), text)
            elif imp.target not in state:
                stack.append(imp)
                visit(imp.target)
                stack.pop()
        state[module] = 2

    for module in files:
        if module not in state:
            visit(module)
    return list(cycles.values())


def long_files(root: Path, folders=("ppx", "bench", "tests")) -> list[str]:
    """Source files (Python and shell) of ``folders`` longer than MAX_LINES."""
    out = []
    paths = sorted(p for folder in folders for p in (root / folder).rglob("*") if p.suffix in (".py", ".sh", ""))
    for path in paths:
        if path.is_file() and "__pycache__" not in path.parts:
            n = len(path.read_bytes().splitlines())
            if n > MAX_LINES:
                out.append(f"{path.relative_to(root)}: {n} lines (at most {MAX_LINES})")
    return out


def test_every_import_is_from_the_same_or_a_lower_layer():
    bad = layer_violations(REPO)
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_every_import_inside_schedules_is_from_the_same_or_a_lower_room():
    bad = room_violations(REPO)
    assert not bad, "imports against the rooms of ppx/schedules/:\n" + "\n".join(bad)


def test_the_rooms_are_the_subpackages_of_schedules():
    """Every subpackage of ppx/schedules/ is a room and every room but the top one a subpackage,
    so a new folder cannot sit outside the order."""
    folders = {p.parent.name for p in (REPO / "ppx/schedules").glob("*/__init__.py")}
    assert folders == {parts[0] for parts in ROOMS[:-1]}


def test_no_import_cycles_between_ppx_modules():
    cycles = import_cycles(REPO)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_source_file_is_longer_than_400_lines():
    bad = long_files(REPO)
    assert not bad, "\n".join(bad)


# The checks themselves, on a made-up package: they find what they are for.


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "ppx/__init__.py": "",
    "ppx/errors.py": "",
    "ppx/schedules/__init__.py": "from ppx.schedules.basic import f\nfrom ppx.errors import E\n",
    "ppx/schedules/basic.py": "from typing import TYPE_CHECKING\nfrom . import costs\nif TYPE_CHECKING:\n"
    "    from ppx.config import Config\n",
    "ppx/schedules/costs.py": "import os\n",
    "ppx/config/__init__.py": "from ppx import schedules\nfrom ppx.schedules import costs\n",
    "ppx/cli.py": "def main():\n    from ppx.commands import run\n",
    "ppx/commands/__init__.py": "",
    "ppx/commands/run.py": "import ppx.config\n",
}


def test_the_checks_pass_a_layered_package(tmp_path):
    root = write(tmp_path, CLEAN)
    assert layer_violations(root) == [] and import_cycles(root) == [] and long_files(root) == []


@pytest.mark.parametrize(
    "bad,expected",
    [
        (
            "from ppx.config import load\n",
            "ppx/schedules/costs.py:2: ppx.schedules.costs (ppx.schedules) imports "
            "ppx.config from the higher layer ppx.config",
        ),
        (
            "def f():\n    from ppx import commands\n",
            "ppx/schedules/costs.py:3: ppx.schedules.costs (ppx.schedules) "
            "imports ppx.commands from the higher layer ppx.commands",
        ),
        (
            "if True:\n    import ppx.cli\n",
            "ppx/schedules/costs.py:3: ppx.schedules.costs (ppx.schedules) imports "
            "ppx.cli from the higher layer ppx.cli",
        ),
        (
            "from ..config import x\n",
            "ppx/schedules/costs.py:2: ppx.schedules.costs (ppx.schedules) imports "
            "ppx.config from the higher layer ppx.config",
        ),
    ],
)
def test_an_import_from_a_higher_layer_is_named_by_file_and_line(tmp_path, bad, expected):
    root = write(tmp_path, {**CLEAN, "ppx/schedules/costs.py": "import os\n" + bad})
    assert layer_violations(root) == [expected]


def test_a_module_outside_the_layers_is_named(tmp_path):
    root = write(tmp_path, {**CLEAN, "ppx/plugins/__init__.py": "", "ppx/cli.py": "import ppx.plugins\n"})
    assert layer_violations(root) == [
        "ppx/plugins/__init__.py: module ppx.plugins is in no layer",
        "ppx/cli.py:1: imports ppx.plugins, which is in no layer",
    ]


def test_a_cycle_is_reported_with_each_import(tmp_path):
    root = write(
        tmp_path,
        {
            **CLEAN,
            "ppx/schedules/costs.py": "from ppx.schedules.grid import g\n",
            "ppx/schedules/grid.py": "x = 1\nfrom ppx.schedules import basic\n",
        },
    )
    assert import_cycles(root) == [
        "ppx.schedules.basic (ppx/schedules/basic.py:2) -> ppx.schedules.costs (ppx/schedules/costs.py:1) -> "
        "ppx.schedules.grid (ppx/schedules/grid.py:2) -> ppx.schedules.basic"
    ]
    # the same imports inside functions are no cycle at import time
    root = write(tmp_path, {"ppx/schedules/grid.py": "def g():\n    from ppx.schedules import basic\n"})
    assert import_cycles(root) == []


ROOMY = {
    "ppx/__init__.py": "",
    "ppx/schedules/__init__.py": "from ppx.schedules.registry import build\n",
    "ppx/schedules/registry.py": "from ppx.schedules.sim.simulate import simulate\n",
    "ppx/schedules/ir/__init__.py": "",
    "ppx/schedules/ir/action.py": "import os\n",
    "ppx/schedules/sim/__init__.py": "",
    "ppx/schedules/sim/simulate.py": "from ppx.schedules.ir.action import Action\nfrom . import costs\n",
    "ppx/schedules/sim/costs.py": "from ppx.schedules.ir import action\n",
}


def test_the_room_check_passes_rooms_in_order(tmp_path):
    assert room_violations(write(tmp_path, ROOMY)) == []


@pytest.mark.parametrize(
    "bad,expected",
    [
        (
            "from ppx.schedules.sim.simulate import simulate\n",
            "ppx/schedules/ir/action.py:2: ppx.schedules.ir.action (ppx.schedules.ir) imports "
            "ppx.schedules.sim.simulate from the higher room ppx.schedules.sim",
        ),
        (
            "def f():\n    from ..sim import costs\n",
            "ppx/schedules/ir/action.py:3: ppx.schedules.ir.action (ppx.schedules.ir) imports "
            "ppx.schedules.sim.costs from the higher room ppx.schedules.sim",
        ),
        (
            "from ppx.schedules import build\n",
            "ppx/schedules/ir/action.py:2: ppx.schedules.ir.action (ppx.schedules.ir) imports "
            "ppx.schedules from the higher room ppx.schedules (registry, csv_io, csv_checks, grid)",
        ),
        (
            "import ppx.schedules.registry\n",
            "ppx/schedules/ir/action.py:2: ppx.schedules.ir.action (ppx.schedules.ir) imports "
            "ppx.schedules.registry from the higher room ppx.schedules (registry, csv_io, csv_checks, grid)",
        ),
    ],
)
def test_an_import_from_a_higher_room_is_named_by_file_and_line(tmp_path, bad, expected):
    root = write(tmp_path, {**ROOMY, "ppx/schedules/ir/action.py": "import os\n" + bad})
    assert room_violations(root) == [expected]


def test_a_module_outside_the_rooms_is_named(tmp_path):
    root = write(tmp_path, {**ROOMY, "ppx/schedules/extra/__init__.py": "", "ppx/schedules/extra/x.py": ""})
    assert room_violations(root) == [
        "ppx/schedules/extra/__init__.py: module ppx.schedules.extra is in no room of ppx.schedules",
        "ppx/schedules/extra/x.py: module ppx.schedules.extra.x is in no room of ppx.schedules",
    ]


def test_a_long_file_is_named(tmp_path):
    root = write(tmp_path, {**CLEAN, "ppx/engine/loop.py": "x = 1\n" * 401})
    assert long_files(root) == ["ppx/engine/loop.py: 401 lines (at most 400)"]
