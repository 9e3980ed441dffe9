"""The package's import graph: each layer imports only the layers below it, and no module imports itself back.

Layers, bottom up: errors, format, kernels, plugin, tools, bench, cli (README.md, docs/design.md). Every import
counts, also those inside functions (a lazy import is still an arrow)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "samoyeds_vllm"
LAYERS = ["errors", "format", "kernels", "plugin", "tools", "bench", "cli"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_is_in_a_layer():
    assert {m for m in _graph() if _layer(m) is None} == {"samoyeds_vllm"}  # the entry point (register)


def test_layers_import_only_layers_below():
    wrong = [
        (a, b)
        for a, deps in _graph().items()
        for b in deps
        if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)
    ]
    assert wrong == []


def test_plugin_and_kernels_never_import_tools_or_benchmarks_and_only_the_cli_imports_benchmarks():
    graph = _graph()
    for module, deps in graph.items():
        if _layer(module) in (LAYERS.index("kernels"), LAYERS.index("plugin")):
            assert not {d for d in deps if _layer(d) in (LAYERS.index("tools"), LAYERS.index("bench"))}, module
        if _layer(module) != LAYERS.index("bench") and module != "samoyeds_vllm.cli":
            assert not {d for d in deps if _layer(d) == LAYERS.index("bench")}, module


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_graph_is_read():
    """The checks above see the real arrows (a parser that found none would pass them all)."""
    graph = _graph()
    assert "samoyeds_vllm.kernels" in graph["samoyeds_vllm.plugin.ops"]
    assert "samoyeds_vllm.format.pattern" in graph["samoyeds_vllm.format.packing"]
    assert "samoyeds_vllm.bench.layer" in graph["samoyeds_vllm.cli"]  # inside a function
