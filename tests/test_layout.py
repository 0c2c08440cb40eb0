"""The layout in ARCHITECTURE.md, checked: layers import downward only, targets do not import
each other, no import cycles between modules or between packages, no module under wrapgen/ over
600 lines.

Imports are read from the source (`ast`), lazy imports inside functions included: a lazy import
is still a dependency, only a hidden one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wrapgen"
MAX_LINES = 600
TARGETS = ("python", "cpp", "fx", "interpret")

# Lowest first; a module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("wrapgen.config", "wrapgen.errors", "wrapgen.cache")),
    ("wrapper_ir", ("wrapgen.wrapper_ir",)),
    # loop bodies and fusion groups: what lowering makes and kernel codegen reads
    ("loop_ir", ("wrapgen.loop_ir",)),
    ("kernels", ("wrapgen.kernels",)),
    # lowering hands fusion groups to kernel codegen; kernels import nothing of lowering
    ("lowering", ("wrapgen.lowering",)),
    ("backends", ("wrapgen.backends",)),
)
API_LAYER = "api"  # everything else: wrapgen/__init__, api, aot, compiled, debug, dynamo, ...


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The wrapgen modules `name` imports: `from pkg import sub` counts as importing `pkg.sub`
    when that is a module, else as importing `pkg` itself."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "wrapgen")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "wrapgen":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules() else source)
    return found - {name}


def layer_of(name: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)


def layer_name(index: int) -> str:
    return LAYERS[index][0] if index < len(LAYERS) else API_LAYER


def target_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 3 and parts[:2] == ["wrapgen", "backends"] and parts[2] in TARGETS:
        return parts[2]
    return None


def upward_imports() -> list[str]:
    return [
        f"{name} ({layer_name(layer_of(name))}) imports {dep} ({layer_name(layer_of(dep))})"
        for name in modules()
        for dep in sorted(imports_of(name))
        if layer_of(dep) > layer_of(name)
    ]


def cross_target_imports() -> list[str]:
    """A target's package imports no other target's; shared backend modules import none of them
    (only `wrapgen.backends` itself, which registers the targets)."""
    found = []
    for name in modules():
        if name == "wrapgen.backends" or not name.startswith("wrapgen.backends."):
            continue
        for dep in sorted(imports_of(name)):
            if target_of(dep) is not None and target_of(dep) != target_of(name):
                found.append(f"{name} imports {dep}")
    return found


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module, each sorted."""
    return strongly_connected({name: sorted(imports_of(name) & modules().keys()) for name in modules()})


def package_cycles() -> list[list[str]]:
    """Import cycles between packages, lazy imports included: within each package, its
    sub-packages (each taken whole, with everything below it) and its own modules are the nodes,
    and a component of more than one node that holds a sub-package is a cycle. Two packages can
    import each other with no module in a cycle (a module of each imports a third of the other)."""
    packages = sorted(name for name, path in modules().items() if path.name == "__init__.py")
    cycles = []
    for package in packages:
        def node(name: str, package: str = package) -> str | None:
            if not name.startswith(package + "."):
                return None
            return f"{package}.{name[len(package) + 1:].split('.')[0]}"

        graph: dict[str, set[str]] = {}
        for name in modules():
            source = node(name)
            if source is None:
                continue
            graph.setdefault(source, set())
            for dep in imports_of(name) & modules().keys():
                target = node(dep)
                if target is not None and target != source:
                    graph[source].add(target)
        for component in strongly_connected({k: sorted(v) for k, v in graph.items()}):
            if any(name in packages for name in component):
                cycles.append(component)
    return cycles


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return cycles


def long_modules() -> list[str]:
    found = []
    for path in modules().values():
        count = len(path.read_text().splitlines())
        if count > MAX_LINES:
            found.append(f"{path.relative_to(PACKAGE.parent)}: {count} lines")
    return found


def test_layers_import_downward_only():
    assert upward_imports() == []


def test_targets_do_not_import_each_other():
    assert cross_target_imports() == []


def test_no_import_cycles():
    assert import_cycles() == []


def test_no_package_import_cycles():
    assert package_cycles() == []


def test_no_module_over_600_lines():
    assert long_modules() == []


def test_every_target_is_a_package_with_its_emitter():
    for target in TARGETS:
        assert f"wrapgen.backends.{target}" in modules()
        assert f"wrapgen.backends.{target}.emitter" in modules()


# The checks must be able to fail: each finds what it is built to find in a made-up module set.
@pytest.fixture
def fake_modules(monkeypatch, tmp_path):
    def install(files: dict[str, str]) -> None:
        root = tmp_path / "wrapgen"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        monkeypatch.setattr(f"{__name__}.PACKAGE", root)
        modules.cache_clear()

    yield install
    modules.cache_clear()


def test_checks_find_what_they_look_for(fake_modules):
    fake_modules({
        "__init__.py": "",
        "wrapper_ir/__init__.py": "",
        "wrapper_ir/lines.py": "def f():\n    from wrapgen.lowering import graph\n",
        "lowering/__init__.py": "",
        "lowering/graph.py": "from wrapgen.lowering.kernel import K\n",
        "lowering/kernel.py": "from wrapgen.lowering import graph\n" + "x = 1\n" * 601,
        "backends/__init__.py": "from wrapgen.backends.cpp import emitter\n",
        "backends/cpp/__init__.py": "",
        "backends/cpp/emitter.py": "from wrapgen.backends.python.runtime import f\n",
        "backends/python/__init__.py": "",
        "backends/python/runtime.py": "",
        # packages that import each other, no module in a cycle: kernels -> loop_ir -> kernels,
        # and lowering's passes -> loops -> passes (lazily)
        "kernels/__init__.py": "",
        "kernels/codegen.py": "from wrapgen.loop_ir.groups import G\n",
        "kernels/ops.py": "",
        "loop_ir/__init__.py": "",
        "loop_ir/groups.py": "",
        "loop_ir/render.py": "from wrapgen.kernels.ops import add\n",
        "lowering/passes/__init__.py": "",
        "lowering/passes/fold.py": "from wrapgen.lowering.loops.body import B\n",
        "lowering/passes/order.py": "",
        "lowering/loops/__init__.py": "",
        "lowering/loops/body.py": "",
        "lowering/loops/group.py": "def f():\n    from wrapgen.lowering.passes import order\n",
    })
    assert upward_imports() == [
        "wrapgen.loop_ir.render (loop_ir) imports wrapgen.kernels.ops (kernels)",
        "wrapgen.wrapper_ir.lines (wrapper_ir) imports wrapgen.lowering.graph (lowering)",
    ]
    assert cross_target_imports() == ["wrapgen.backends.cpp.emitter imports wrapgen.backends.python.runtime"]
    assert import_cycles() == [["wrapgen.lowering.graph", "wrapgen.lowering.kernel"]]
    assert package_cycles() == [["wrapgen.kernels", "wrapgen.loop_ir"], ["wrapgen.lowering.loops", "wrapgen.lowering.passes"]]
    assert long_modules() == ["wrapgen/lowering/kernel.py: 602 lines"]
