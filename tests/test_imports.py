"""The package's import structure: no import circle, and no private name used across modules.

Every import statement of every module counts, the ones inside functions and classes too:
an import deferred into a function still ties the two modules together. The checks run on
the source text (``ast``), so they see the imports a test run never executes.
"""

import ast
import re
from collections import deque
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sklearn_ebound"


def package_sources(root=PACKAGE):
    """``{path: source}`` of every module of the package at ``root``, paths from its parent."""
    return {path.relative_to(root.parent).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted(root.rglob("*.py"))}


def _module_name(path):
    # "pkg/sub/__init__.py" -> "pkg.sub", "pkg/sub/mod.py" -> "pkg.sub.mod"
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(part):
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def imports(sources):
    """Every import of every module: ``(path, line, module, target, name)``.

    ``target`` is the module an import names, relative imports resolved against the
    importing module's own package; ``name`` is the imported name of ``from target import
    name``, or None for ``import target``.
    """
    for path, source in sources.items():
        module = _module_name(path)
        # A package's __init__ is its own package; a module's package is its parent.
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source, filename=path)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, module, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                target = node.module
                if node.level:
                    # Level 1 is the package itself, each further dot one package up.
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    yield path, node.lineno, module, target, alias.name


def import_graph(sources):
    """``{module: modules of the package it imports}``.

    ``import a.b`` and ``from a.b import c`` give an edge to ``a.b``, and the latter to
    ``a.b.c`` as well when ``c`` is a submodule. Parent packages that Python initialises
    first are no edges (they run before, not in a circle), and neither is ``from . import x``
    naming a package's own ``__init__``.
    """
    modules = {_module_name(path) for path in sources}
    graph = {module: set() for module in modules}
    for _, _, module, target, name in imports(sources):
        for candidate in (target, None if name is None else f"{target}.{name}"):
            if candidate in modules and candidate != module:
                graph[module].add(candidate)
    return graph


def find_cycles(graph):
    """One import circle ``[a, b, ..., a]`` per group of modules that import each other.

    The groups are the strongly connected components of the graph (Tarjan); in each, the
    circle is the shortest one through its first module in sorted order.
    """
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:  # pop v's component off the stack
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for group in groups:
        start = min(group)
        parent, queue, last = {start: None}, deque([start]), None
        while last is None:  # breadth first until an edge leads back to start
            u = queue.popleft()
            for w in sorted(graph[u] & group):
                if w == start:
                    last = u
                    break
                if w not in parent:
                    parent[w] = u
                    queue.append(w)
        path = []
        while last is not None:
            path.append(last)
            last = parent[last]
        cycles.append(path[::-1] + [start])
    return sorted(cycles)


def _owner(module):
    # The package a private module belongs to: the part before its first private component.
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[:i])
    return None


def private_imports(sources):
    """``"path:line: ..."`` for every import of a private name or a foreign private module.

    Private means a leading underscore (dunder names are public). A module may import the
    private modules of its own subpackage (and of subpackages below it), and the top-level
    private modules ``pkg._x`` from anywhere; it may import no private name (``_f``) from
    another module, and no private module of a different subpackage.
    """
    modules = {_module_name(path) for path in sources}
    offenders = []
    for path, line, module, target, name in imports(sources):
        root = module.split(".")[0]
        if target is None or target.split(".")[0] != root:
            continue  # outside the package
        if name is not None and f"{target}.{name}" in modules:
            target, name = f"{target}.{name}", None  # `from pkg import _mod` imports a module
        owner = _owner(target)
        if owner not in (None, root) and not (module + ".").startswith(owner + "."):
            offenders.append(f"{path}:{line}: imports {target}, a private module of {owner}")
        if name is not None and _is_private(name):
            offenders.append(f"{path}:{line}: imports the private name {name} from {target}")
    return offenders


# A small package with one planted circle and one planted violation of each kind.
PLANTED = {
    "pkg/__init__.py": "from . import sub\nfrom .a import f\n",
    "pkg/a.py": "from .b import g\n\n\ndef f():\n    pass\n",
    "pkg/b.py": "def g():\n    from .sub.c import h\n",  # function level
    "pkg/sub/__init__.py": "",
    "pkg/sub/c.py": "class C:\n    from ..a import f\n",  # class level, closes a -> b -> c
    "pkg/sub/_d.py": "x = z = w = 1\n",
    "pkg/sub/e.py": "from . import _d\nfrom ._d import x\n",  # own subpackage: allowed
    "pkg/sub/deep/__init__.py": "",
    "pkg/sub/deep/g.py": "from .._d import w\n",  # below its subpackage: allowed
    "pkg/_top.py": "y = 1\n",
    "pkg/f.py": ("from ._top import y\n"  # top-level private module: allowed
                 "from .sub._d import z\n"
                 "from .a import _hidden\n"
                 "import pkg.sub._d\n"
                 "from . import __version__\n"),  # a dunder is public
}


def test_checks_find_a_planted_circle_and_planted_private_imports():
    graph = import_graph(PLANTED)
    assert graph["pkg.sub.c"] == {"pkg.a"}  # `..a` from pkg.sub.c, no edge to pkg.sub
    assert graph["pkg"] == {"pkg.sub", "pkg.a"}
    # Edges to parent packages would close pkg -> pkg.a -> pkg as well; there are none.
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert private_imports(PLANTED) == [
        "pkg/f.py:2: imports pkg.sub._d, a private module of pkg.sub",
        "pkg/f.py:3: imports the private name _hidden from pkg.a",
        "pkg/f.py:4: imports pkg.sub._d, a private module of pkg.sub",
    ]
    # Without the function-level import of pkg.b the circle is gone.
    assert find_cycles(import_graph({**PLANTED, "pkg/b.py": "def g():\n    pass\n"})) == []


def test_no_import_circle():
    cycles = find_cycles(import_graph(package_sources()))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_imported_across_modules():
    offenders = private_imports(package_sources())
    assert not offenders, "private imports across modules:\n" + "\n".join(offenders)


# The layers of the package, lowest first: a module may import its own layer and those below,
# never one above. Every entry of the package root (module or subpackage) has its layer here.
LAYERS = {
    "utilities": ("_utils", "_scoring", "exceptions"),
    "statistics/attention": ("_moments", "_least_squares", "_spectrum", "_rank_statistics",
                             "_attention_operators", "_conjugate_gradients", "_kernel_moments",
                             "_attention_solver", "_kernel_rank", "datasets"),
    "nulls": ("_null_laws", "_resampled_null"),
    "diagnostics": ("_diagnostics", "_influence", "_lack_of_fit"),
    "rules": ("_rules",),
    "estimators": ("_intrinsic_rank", "_reduced_rank", "_deficiency", "nn"),
    "applications": ("experiments", "display", "heads", "cli", "_compress_defaults", "__init__",
                     "__main__"),
}


def _root_entry(module):
    # "pkg._rules.cv" -> "_rules", "pkg" -> "__init__"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(sources, layers):
    """``"path:line: ..."`` for every import of a higher layer, and for every entry of the
    package root that ``layers`` does not place."""
    rank = {entry: i for i, entries in enumerate(layers.values()) for entry in entries}
    names = list(layers)
    modules = {_module_name(path) for path in sources}
    offenders = sorted({f"{_root_entry(m)} has no layer" for m in modules
                        if _root_entry(m) not in rank})
    for path, line, module, target, name in imports(sources):
        root = module.split(".")[0]
        if target is None or target.split(".")[0] != root:
            continue
        if name is not None and f"{target}.{name}" in modules:
            target = f"{target}.{name}"
        source, imported = _root_entry(module), _root_entry(target)
        if source in rank and imported in rank and rank[imported] > rank[source]:
            offenders.append(f"{path}:{line}: {source} ({names[rank[source]]}) imports "
                             f"{imported} ({names[rank[imported]]})")
    return offenders


PLANTED_LAYERS = {
    "pkg/__init__.py": "from ._rules import read\n",
    "pkg/_rules/__init__.py": "from .cv import read\n",
    "pkg/_rules/cv.py": "from .._nulls import law\n\n\ndef read():\n    pass\n",
    "pkg/_nulls.py": "def law():\n    from ._rules.cv import read\n",  # up: a violation
    "pkg/_utils.py": "import pkg._nulls\n",  # up: a violation
    "pkg/_stray.py": "",  # no layer
}


def test_layer_check_finds_planted_violations():
    layers = {"utilities": ("_utils",), "nulls": ("_nulls",), "rules": ("_rules",),
              "top": ("__init__",)}
    assert layer_violations(PLANTED_LAYERS, layers) == [
        "_stray has no layer",
        "pkg/_nulls.py:2: _nulls (nulls) imports _rules (rules)",
        "pkg/_utils.py:1: _utils (utilities) imports _nulls (nulls)",
    ]
    fixed = {**PLANTED_LAYERS, "pkg/_nulls.py": "", "pkg/_utils.py": ""}
    del fixed["pkg/_stray.py"]
    assert layer_violations(fixed, layers) == []


def test_no_layer_imports_a_higher_one():
    offenders = layer_violations(package_sources(), LAYERS)
    assert not offenders, "imports against the layers:\n" + "\n".join(offenders)


def test_the_layout_page_lists_every_module_once_under_its_layer():
    # docs/layout.rst: one line a module, grouped by the layers above; a new module, a rename
    # or a move must be written there too.
    text = (PACKAGE.parent / "docs" / "layout.rst").read_text(encoding="utf-8")
    listed = re.findall(r"^- ``([\w/]+\.py)``: \S", text, flags=re.MULTILINE)
    on_disk = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))]
    assert sorted(listed) == on_disk and len(set(listed)) == len(listed)
    sections = re.split(r"^.+\n-+\n", text, flags=re.MULTILINE)[1:]
    assert len(sections) == len(LAYERS)
    for section, entries in zip(sections, LAYERS.values(), strict=True):
        roots = {name.split("/")[0].removesuffix(".py")
                 for name in re.findall(r"^- ``([\w/]+\.py)``", section, flags=re.MULTILINE)}
        assert roots == set(entries), (roots, entries)
