"""The package's shape: no module of ``rlbook`` imports, even indirectly, a module that imports it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlbook"


def module_name(path: Path) -> str:
    """``src/rlbook/lm/moe.py`` -> ``rlbook.lm.moe``; a package's ``__init__.py`` -> the package."""
    parts = ("rlbook",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def eager_imports(path: Path, modules: set[str]) -> set[str]:
    """The ``rlbook`` modules that ``path`` imports outside any function: at module level, in class bodies and
    under ``if TYPE_CHECKING:`` (which a type checker follows). ``from rlbook.a import b`` counts ``rlbook.a`` and,
    when ``b`` is a module, ``rlbook.a.b``; relative imports are resolved. Parent packages that Python imports on
    the way (``rlbook``, ``rlbook.lm``) are not counted: only the modules a line names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue  # a lazy import runs when called, after every module has loaded
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{base}.{child.module}" if child.module else base
                else:
                    base = child.module or ""
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {target for target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): eager_imports(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (a depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def walk(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [node, target] if target in path else [node, target]
            if target not in state and (cycle := walk(target, path + [node])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start, [])):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    """No module of ``src/rlbook`` imports, directly or through others, a module that imports it, counting imports
    under ``if TYPE_CHECKING:`` (a type checker follows them, and they say the two modules need each other).
    Imports inside functions are not counted: they run after every module has loaded (``rlbook.checkpointing`` reaches
    ``rlbook.lm.model`` so, to keep ``import rlbook.checkpointing`` light)."""
    graph = import_graph()
    assert "rlbook.trainer" in graph and "rlbook.callbacks" in graph["rlbook.trainer"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def all_imports(path: Path) -> set[str]:
    """Every module ``path`` names in an import, also inside functions (a lazy import still ties two modules)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_of_the_package_imports_the_organism_registry():
    """``rlbook.organisms`` (the organisms' registration data) sits on top of the package: no other module of
    ``src/rlbook`` imports it, not even inside a function (``plotting`` reads series through ``rlbook.stats``)."""
    importers = sorted(module_name(path) for path in PACKAGE.rglob("*.py")
                       if path.name != "organisms.py" and "rlbook.organisms" in all_imports(path))
    assert importers == []


def test_importing_the_core_leaves_the_organism_registry_unloaded():
    """In a fresh interpreter, importing every module of the package but ``rlbook.organisms`` (and the ``__main__``
    entry points) does not load ``rlbook.organisms``."""
    import subprocess
    import sys

    script = ("import importlib, pkgutil, sys, rlbook\n"
              "names = sorted(m.name for m in pkgutil.walk_packages(rlbook.__path__, 'rlbook.')\n"
              "               if m.name != 'rlbook.organisms' and not m.name.endswith('.__main__'))\n"
              "for name in names:\n"
              "    importlib.import_module(name)\n"
              "print(len(names), 'rlbook.organisms' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) > 30 and out[1] == "False"


def test_the_statistics_have_one_home_and_the_old_paths_still_reach_it():
    """Each statistic is defined in ``rlbook.stats`` only; its old homes (read by the chapters and experiments)
    re-export the same function."""
    import rlbook.evaluation
    import rlbook.experiment
    import rlbook.organisms
    import rlbook.stats

    old_homes = {rlbook.evaluation: ["prompt_interval", "paired_difference", "paired_t_power", "seeds_needed",
                                     "detectable_effect", "holm_intervals"],
                 rlbook.experiment: ["mean_interval"],
                 rlbook.organisms: ["metric_at", "eval_series", "metric_at_budget", "baseline_change",
                                    "baseline_level", "gate_holds", "paired_difference"]}
    for module, names in old_homes.items():
        for name in names:
            function = getattr(module, name)
            assert function is getattr(rlbook.stats, name) and function.__module__ == "rlbook.stats", (module, name)
    for module in old_homes:  # no second definition left behind
        defined = {node.name for node in ast.parse(Path(module.__file__).read_text()).body
                   if isinstance(node, ast.FunctionDef)}
        assert not defined & set(vars(rlbook.stats)), (module.__name__, defined & set(vars(rlbook.stats)))
