"""The package's shape, checked from source with `ast` (fast: imports neither hpclab nor TF).

* No import cycle inside hpclab/. Every import statement counts — module level and inside
  functions alike: a lazy import only moves a cycle from import time to call time, which is how
  `cluster -> controls -> cluster` and `cluster -> sweep -> cluster` hid (issue 8). Relative
  imports are resolved; `from hpclab.pkg import name` points at `hpclab.pkg.name` when that is a
  module and at `hpclab.pkg` otherwise; a module that calls `importlib.import_module` also
  depends on every string constant in it naming an hpclab module (hpclab/__init__.py's lazy map).
* TensorFlow, Horovod and Keras are imported at module level (any statement that runs on import:
  top level, inside top-level `if`/`try`/`with`/loops and class bodies, not inside functions) only
  by modules of the rank-side package hpclab/rank/; a module elsewhere may not reach one that
  does through its own module-level imports either (parent packages' __init__ included).
* Rooms and what they may import (ROLE_RULES): `core` imports no other room; `records` only
  `core`; `rank` only `core` (never `cluster`, `records`, `views`); `views` never `rank` nor
  `cluster`; `views.charts` never `views.panel` (static figures load no widgets). Every import
  counts, lazy ones too; the one allowed exception is listed with its reason (ROLE_EXCEPTIONS).
* Size is a warning, concept the rule: a module over WARN_LINES lines is reported, one over
  MAX_LINES fails.
* docs/architecture.md names every module and names no module that does not exist (see the two
  doc tests for the matching rule).

Each check is a small function tested here on constructed input, so a check that can never fail
would show.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hpclab"
DOC = ROOT / "docs" / "architecture.md"
RANK_PACKAGE = "hpclab.rank"
HEAVY = ("tensorflow", "horovod", "keras", "tf_keras")
WARN_LINES = 400  # reported: a module this long may hold two concepts
MAX_LINES = 600  # fails: split it where a concept ends, never to meet the number
MAX_FUNCTION_LINES = 80  # in hpclab/rank/: a longer function does several jobs (issue 24)

# room -> the rooms its modules may import (a room always imports itself). A room is the
# first package under hpclab/ (`hpclab.core`, `hpclab.rank`, ...), or a deeper one named here.
ROLE_RULES: dict[str, set[str]] = {
    "hpclab.core": set(),
    "hpclab.records": {"hpclab.core"},
    "hpclab.rank": {"hpclab.core"},
    "hpclab.cluster": {"hpclab.core", "hpclab.records", "hpclab.rank"},
    "hpclab.studies": {"hpclab.core", "hpclab.records", "hpclab.cluster", "hpclab.rank"},
    "hpclab.views.charts": {"hpclab.core", "hpclab.records"},
    "hpclab.views.panel": {"hpclab.core", "hpclab.records", "hpclab.views.charts"},
    "hpclab.views": {"hpclab.core", "hpclab.records", "hpclab.views.charts"},
    "hpclab.tools": {
        "hpclab.core",
        "hpclab.records",
        "hpclab.cluster",
        "hpclab.rank",
        "hpclab.studies",
        "hpclab.views",
        "hpclab.views.charts",
        "hpclab.views.panel",
    },
}
# (importer, imported) -> why this one edge may cross the rules
ROLE_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("hpclab.cluster.lab", "hpclab.views.panel.panel"): "Lab.panel(), the notebook's front "
    "door; imported only when called",
}


# ---------------------------------------------------------------------------------------------
# the checks, as pure functions of a source tree
# ---------------------------------------------------------------------------------------------


def modules_in(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `package_dir` (the package's name is the
    folder's). `pkg/sub/__init__.py` is module `pkg.sub`."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    """The absolute dotted name an ImportFrom starts from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not (module in modules and _is_package(module, modules)):
        base = base[:-1]  # a plain module's relative imports start from its package
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(module: str, node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """Absolute dotted names one import statement may load (submodules when they are modules)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        start = _resolve(module, node, modules)
        names = []
        for alias in node.names:
            sub = f"{start}.{alias.name}"
            names.append(sub if sub in modules else start)
        return names
    return []


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """`name` when it is a module of the tree, else None (third-party, or a namespace package)."""
    return name if name in modules else None


def _parents(name: str, modules: dict[str, Path]) -> set[str]:
    """Packages whose __init__ runs before `name` does (`a.b.c` -> `a`, `a.b`), if they exist."""
    parts = name.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))} & set(modules)


def _dynamic_names(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    calls_importlib = any(
        isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
            or (isinstance(n.func, ast.Name) and n.func.id in ("import_module", "__import__"))
        )
        for n in ast.walk(tree)
    )
    if not calls_importlib:
        return set()
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in modules
    }


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> modules of the same tree it imports anywhere (module level or in functions)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps = set()
        for node in ast.walk(tree):
            for imported in imported_names(name, node, modules):
                target = _target(imported, modules)
                if target is not None:
                    deps.add(target)
        deps |= _dynamic_names(tree, modules) - {name}
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle (a -> ... -> a) per strongly connected component that has one
    (Tarjan's algorithm; a module importing itself counts)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in components:
        members = set(comp)
        start = comp[0]
        if len(comp) == 1 and start not in graph.get(start, ()):
            continue
        # shortest path from start back to start inside the component (breadth first)
        paths = {w: [start, w] for w in sorted(graph[start]) if w in members}
        frontier = list(paths)
        while start not in paths:
            nxt = []
            for u in frontier:
                for w in sorted(graph[u]):
                    if w in members and w not in paths:
                        paths[w] = paths[u] + [w]
                        nxt.append(w)
            frontier = nxt
        cycles.append(paths[start])
    return cycles


def _runs_on_import(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements executed when the module is imported: not function bodies (nor lambdas)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            yield from _runs_on_import(getattr(stmt, field, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _runs_on_import(handler.body)
        for case in getattr(stmt, "cases", []) or []:
            yield from _runs_on_import(case.body)


def module_level_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for stmt in _runs_on_import(tree.body):
        out.update(imported_names(name, stmt, modules))
    return out


def heavy_import_chains(
    modules: dict[str, Path], allowed_prefix: str = RANK_PACKAGE, heavy: tuple = HEAVY
) -> dict[str, list[str]]:
    """Module outside `allowed_prefix` -> the import chain by which loading it loads a heavy
    framework (TF/Horovod/Keras), following module-level imports and parent packages."""
    direct: dict[str, set[str]] = {}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = module_level_imports(name, path, modules)
        direct[name] = {i for i in imported if i.split(".")[0] in heavy}
        deps = {t for i in imported if (t := _target(i, modules)) is not None}
        for dep in list(deps):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            deps |= _parents(dep, modules)
        deps.discard(name)
        edges[name] = deps

    def inside(name: str) -> bool:
        return name == allowed_prefix or name.startswith(allowed_prefix + ".")

    offenders = {}
    for start in sorted(modules):
        if inside(start):
            continue
        chains = {start: [start]}
        queue = [start]
        while queue:
            u = queue.pop(0)
            if direct[u]:
                offenders[start] = chains[u] + [sorted(direct[u])[0]]
                break
            for w in sorted(edges[u]):
                if w not in chains:
                    chains[w] = chains[u] + [w]
                    queue.append(w)
    return offenders


def room_of(name: str, rules: dict[str, set[str]]) -> str | None:
    """The room a module belongs to: the longest room name in `rules` that is it or its
    package (`hpclab.views.charts.traces` -> `hpclab.views.charts`); None for the package root."""
    best = None
    for room in rules:
        if (name == room or name.startswith(room + ".")) and (
            best is None or len(room) > len(best)
        ):
            best = room
    return best


def role_violations(
    graph: dict[str, set[str]],
    rules: dict[str, set[str]] = ROLE_RULES,
    exceptions: dict[tuple[str, str], str] = ROLE_EXCEPTIONS,
) -> list[str]:
    """`importer -> imported (room A may not import room B)` for every edge of the import graph
    that crosses the room rules."""
    out = []
    for importer in sorted(graph):
        src = room_of(importer, rules)
        if src is None:
            continue
        for imported in sorted(graph[importer]):
            dst = room_of(imported, rules)
            if dst is None or dst == src or dst in rules[src]:
                continue
            if (importer, imported) in exceptions:
                continue
            out.append(f"{importer} -> {imported} ({src} may not import {dst})")
    return out


def long_modules(modules: dict[str, Path], limit: int = MAX_LINES) -> dict[str, int]:
    """Module -> line count, for the modules longer than `limit` lines."""
    counts = {}
    for name, path in modules.items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            counts[name] = n
    return counts


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function under ``node``, nested ones and methods too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def long_functions(
    modules: dict[str, Path], package: str, limit: int = MAX_FUNCTION_LINES
) -> dict[str, int]:
    """``module:function`` -> lines (``def`` to its last line), for the functions of the modules
    under `package` longer than `limit` lines."""
    out = {}
    for name, path in modules.items():
        if name != package and not name.startswith(package + "."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for qual, node in _functions(tree):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out[f"{name}:{qual}"] = lines
    return out


# -- the doc -------------------------------------------------------------------------------------

# a whole `*.py` path: not the tail of a longer word or path, not the head of `x.py.bak`;
# a leading `../` (a Markdown link from docs/) is dropped
_PATH = re.compile(r"(?<![\w./-])(?:\.\./)*((?:[\w-]+/)*[\w-]+\.py)(?![\w-]|\.\w)")


def doc_names_module(doc: str, rel: str) -> bool:
    """True when the doc names module `rel` (path relative to hpclab/, e.g. `views/live.py`) as
    `views/live.py` or `hpclab/views/live.py`: a whole path, not the tail of a longer one, so
    `live.py` alone does not name `views/live.py` and `views/live.py` does not name `live.py`."""
    return rel in _doc_module_paths(doc)


def _doc_module_paths(doc: str) -> set[str]:
    """Every `*.py` path the doc mentions, made relative to hpclab/ (`hpclab/` prefix dropped).
    Paths under another top-level folder of the repository (benchmarks/, scripts/, tests/, ...)
    are about that folder and left out."""
    out = set()
    for m in _PATH.finditer(doc):
        path = m.group(1)
        head = path.split("/")[0]
        if head == "hpclab":
            out.add(path.split("/", 1)[1])
        elif "/" in path and head in _OTHER_TOP_FOLDERS:
            continue
        else:
            out.add(path)
    return out


_OTHER_TOP_FOLDERS = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "hpclab"} | {
    "benchmarks",
    "scripts",
    "tests",
    "notebooks",
    "docs",
    "requirements",
}


def _trivial(path: Path) -> bool:
    """An __init__.py holding nothing but (at most) a docstring."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in body)


def modules_missing_from_doc(doc: str, package_dir: Path) -> list[str]:
    named = _doc_module_paths(doc)
    missing = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if path.name == "__init__.py" and _trivial(path):
            continue
        if rel not in named:
            missing.append(rel)
    return missing


def doc_paths_that_do_not_exist(doc: str, package_dir: Path) -> list[str]:
    return sorted(p for p in _doc_module_paths(doc) if not (package_dir / p).is_file())


# ---------------------------------------------------------------------------------------------
# the real tree
# ---------------------------------------------------------------------------------------------

MODULES = modules_in(PACKAGE)


def test_the_tree_is_found():
    assert {"hpclab", "hpclab.core.config", "hpclab.core.scaling", "hpclab.rank.step"} <= set(
        MODULES
    )
    assert any(n.startswith(RANK_PACKAGE + ".") for n in MODULES)


def test_no_import_cycle_in_hpclab():
    cycles = find_cycles(import_graph(MODULES))
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(
        "  " + " -> ".join(c) for c in cycles
    )


def test_only_the_rank_package_imports_tensorflow_or_horovod_at_module_level():
    offenders = heavy_import_chains(MODULES)
    assert not offenders, (
        f"outside {RANK_PACKAGE}, importing these loads TF/Horovod (import it inside the "
        "function that needs it, or move the code to the rank package):\n"
        + "\n".join(f"  {m}: {' -> '.join(chain)}" for m, chain in offenders.items())
    )


def test_no_module_over_the_line_limit():
    long = long_modules(MODULES, WARN_LINES)
    if long:
        warnings.warn(
            f"modules over {WARN_LINES} lines (do they hold one concept?): "
            + ", ".join(f"{m} ({n})" for m, n in sorted(long.items(), key=lambda kv: -kv[1])),
            stacklevel=1,
        )
    too_long = long_modules(MODULES)
    assert not too_long, f"modules over {MAX_LINES} lines (split by concept): " + ", ".join(
        f"{m} ({n})" for m, n in sorted(too_long.items(), key=lambda kv: -kv[1])
    )


def test_no_function_over_the_limit_in_the_rank_package():
    """The step and the loop stay readable: a rank-side function over MAX_FUNCTION_LINES lines
    holds several jobs (a feature belongs in hpclab/rank/features/, a part of the loop in a
    method of its own)."""
    long = long_functions(MODULES, RANK_PACKAGE)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in {RANK_PACKAGE}: " + ", ".join(
        f"{f} ({n})" for f, n in sorted(long.items(), key=lambda kv: -kv[1])
    )


def test_no_line_is_kept_from_the_formatter_to_save_lines():
    """`# fmt: skip` kept lines short of the old line gate; the formatter owns layout now. (A
    table that reads as one row per line may say `# fmt: off` with its reason: the knob table.)"""
    skipped = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert not skipped, "lines kept from the formatter: " + ", ".join(skipped)


def test_every_module_lives_in_a_room():
    """Only the package root sits outside the rooms: a new module goes into the room whose
    concept it serves, so what it may import is answered by where it lives."""
    homeless = [m for m in MODULES if m != "hpclab" and room_of(m, ROLE_RULES) is None]
    assert not homeless, "modules outside every room of ROLE_RULES: " + ", ".join(homeless)


def test_rooms_import_only_what_their_role_allows():
    bad = role_violations(import_graph(MODULES))
    assert not bad, "imports that cross the room rules:\n" + "\n".join("  " + b for b in bad)


def test_every_role_exception_is_a_real_edge():
    graph = import_graph(MODULES)
    stale = [edge for edge in ROLE_EXCEPTIONS if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"ROLE_EXCEPTIONS lists edges the code no longer has: {stale}"


def test_architecture_doc_names_every_module():
    """Rule: a module is named when docs/architecture.md contains its path relative to hpclab/
    (`config.py`, `views/live.py`) or the same path with `hpclab/` in front, as a whole path.
    __init__.py files that hold only a docstring need not be named; others do
    (`__init__.py`, `rank/__init__.py`)."""
    missing = modules_missing_from_doc(DOC.read_text(encoding="utf-8"), PACKAGE)
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_architecture_doc_names_no_module_that_does_not_exist():
    """Every `*.py` path in docs/architecture.md is a file under hpclab/ — written relative to
    hpclab/ or with `hpclab/` in front — unless it starts with another top-level folder of the
    repository (`benchmarks/run.py`, `scripts/...`, `tests/...`), which the doc may also name."""
    stale = doc_paths_that_do_not_exist(DOC.read_text(encoding="utf-8"), PACKAGE)
    assert not stale, "docs/architecture.md names modules that do not exist: " + ", ".join(stale)


# ---------------------------------------------------------------------------------------------
# the checks can fail: constructed inputs
# ---------------------------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return modules_in(root / "pkg")


def test_cycle_finder_on_synthetic_graphs():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"a"}}) == [["a", "a"]]
    cycles = find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}})
    assert sorted(cycles) == [["a", "b", "c", "a"], ["d", "e", "d"]]


def test_lazy_relative_and_from_package_imports_make_edges(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": '_LAZY = {"Lab": "pkg.lab"}\n'
            "def __getattr__(n):\n    import importlib\n"
            "    return importlib.import_module(_LAZY[n])\n",
            "pkg/lab.py": "from pkg import errors\n"
            "def panel():\n    from pkg.views.panel import Panel\n",
            "pkg/errors.py": "class LabError(Exception): ...\n",
            "pkg/views/__init__.py": "",
            "pkg/views/panel.py": "from .. import errors\nfrom . import live\n"
            "def start():\n    from ..lab import Lab\n",
            "pkg/views/live.py": "import numpy\nfrom pkg.errors import LabError\n",
        },
    )
    graph = import_graph(mods)
    assert graph["pkg"] == {"pkg.lab"}
    assert graph["pkg.lab"] == {"pkg.errors", "pkg.views.panel"}
    assert graph["pkg.views.panel"] == {"pkg.errors", "pkg.views.live", "pkg.lab"}
    assert graph["pkg.views.live"] == {"pkg.errors"}
    assert find_cycles(graph) == [["pkg.lab", "pkg.views.panel", "pkg.lab"]]


def test_heavy_imports_found_at_module_level_only(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ok.py": "def f():\n    import tensorflow as tf\n",
            "pkg/guarded.py": "try:\n    import horovod.tensorflow as hvd\nexcept ImportError:\n"
            "    hvd = None\n",
            "pkg/branch.py": "import sys\nif sys.platform:\n    from tensorflow import keras\n",
            "pkg/klass.py": "class A:\n    import keras\n",
            "pkg/via.py": "from pkg.rank import data\n",
            "pkg/via_lazy.py": "def f():\n    from pkg.rank import data\n",
            "pkg/rank/__init__.py": "",
            "pkg/rank/data.py": "import tensorflow as tf\n",
            "pkg/rank/engine.py": "def f():\n    import horovod\n",
            "pkg/uses_engine.py": "from pkg.rank import engine\n",
        },
    )
    chains = heavy_import_chains(mods, allowed_prefix="pkg.rank")
    assert chains == {
        "pkg.branch": ["pkg.branch", "tensorflow"],
        "pkg.guarded": ["pkg.guarded", "horovod.tensorflow"],
        "pkg.klass": ["pkg.klass", "keras"],
        "pkg.via": ["pkg.via", "pkg.rank.data", "tensorflow"],
    }
    # a rank package whose __init__ loads TF makes every module-level import of it heavy
    (tmp_path / "pkg/rank/__init__.py").write_text("import tensorflow\n", encoding="utf-8")
    chains = heavy_import_chains(modules_in(tmp_path / "pkg"), allowed_prefix="pkg.rank")
    assert chains["pkg.uses_engine"] == ["pkg.uses_engine", "pkg.rank", "tensorflow"]


def test_role_check_on_a_constructed_tree(tmp_path):
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/core/knobs.py": "from pkg.core import plan\n",
            "pkg/core/plan.py": "def f():\n    from pkg.cluster import lab\n",
            "pkg/cluster/__init__.py": "",
            "pkg/cluster/lab.py": "from pkg.core import knobs\nfrom pkg.rank import step\n",
            "pkg/rank/__init__.py": "",
            "pkg/rank/step.py": "from pkg.core.knobs import X\nfrom pkg.cluster.lab import Lab\n",
        },
    )
    rules = {"pkg.core": set(), "pkg.cluster": {"pkg.core", "pkg.rank"}, "pkg.rank": {"pkg.core"}}
    graph = import_graph(mods)
    assert role_violations(graph, rules, {}) == [
        "pkg.core.plan -> pkg.cluster.lab (pkg.core may not import pkg.cluster)",
        "pkg.rank.step -> pkg.cluster.lab (pkg.rank may not import pkg.cluster)",
    ]
    allowed = {("pkg.rank.step", "pkg.cluster.lab"): "a test's reason"}
    assert role_violations(graph, rules, allowed) == [
        "pkg.core.plan -> pkg.cluster.lab (pkg.core may not import pkg.cluster)"
    ]
    assert room_of("pkg.core.knobs", rules) == "pkg.core" and room_of("pkg", rules) is None


def test_line_limit_check(tmp_path):
    mods = _write(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/short.py": "x = 1\n" * 5, "pkg/sub/big.py": "x = 1\n" * 12},
    )
    assert long_modules(mods, limit=10) == {"pkg.sub.big": 12}
    assert long_modules(mods, limit=12) == {}


def test_function_length_check(tmp_path):
    def body(lines: int, indent: int) -> str:
        return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(lines))

    step = (
        "def short():\n"
        + body(2, 4)
        + "class Step:\n    def call(self):\n"
        + body(6, 8)
        + "        def inner():\n"
        + body(6, 12)
        + "if True:\n    def hidden():\n"
        + body(6, 8)
    )
    mods = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/rank/__init__.py": "",
            "pkg/rank/step.py": step,
            "pkg/other.py": "def long():\n" + body(6, 4),
        },
    )
    assert long_functions(mods, "pkg.rank", limit=6) == {
        "pkg.rank.step:Step.call": 14,  # (its nested function's lines count too)
        "pkg.rank.step:Step.call.inner": 7,
        "pkg.rank.step:hidden": 7,
    }
    assert long_functions(mods, "pkg.rank", limit=14) == {}
    assert long_functions(mods, "pkg", limit=6)["pkg.other:long"] == 7


def test_doc_rule_on_constructed_docs(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": '"""Only a docstring."""\n',
            "pkg/config.py": "",
            "pkg/views/__init__.py": "from pkg.views.live import Dashboard\n",
            "pkg/views/live.py": "",
        },
    )
    pkg = tmp_path / "pkg"
    good = (
        "| `config.py` | ... |\n| `hpclab/views/live.py` | ... |\n| `views/__init__.py` |\n"
        "Benchmarks live in `benchmarks/run.py`; see also scripts/make_notebooks.py.\n"
    )
    assert modules_missing_from_doc(good, pkg) == []
    assert doc_paths_that_do_not_exist(good, pkg) == []
    # a bare tail does not name a module in a subpackage; a stale module name is caught
    stale = "| `config.py` |\n| `live.py` |\n| `views/__init__.py` |\n| `cluster.py` |\n"
    assert modules_missing_from_doc(stale, pkg) == ["views/live.py"]
    assert doc_paths_that_do_not_exist(stale, pkg) == ["cluster.py", "live.py"]
    assert doc_names_module(good, "views/live.py") and not doc_names_module(stale, "views/live.py")


@pytest.mark.parametrize("rel", ["config.py", "views/live.py"])
def test_doc_rule_is_not_fooled_by_longer_paths(rel):
    doc = "see `myviews/live.py`, `notconfig.py`, `config.py.bak` and `x/views/live.py`\n"
    assert not doc_names_module(doc, rel)
