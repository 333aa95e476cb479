"""The layout shows the architecture, and these tests keep it so: code that travels to hosts
stays standard-library only, packages import one way (lower layers never import higher ones),
no import cycle, no sys.path edits, and deploy/ never imports invoke."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Lowest first. A module may import modules of its own layer and of the layers before it.
LAYERS = ("host", "errors", "timeline", "commandline", "inventory", "plan", "transport", "cluster", "push", "state", "console", "run")
MAX_FLAT_MODULES = 12


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(DEPLOY.rglob("*.py"))}


def imported(path: Path, at_run_time: bool = False) -> set[str]:
    """Every module an import statement names (anywhere in the file, not just at the top),
    relative imports resolved. `at_run_time`: all but those under `if TYPE_CHECKING:`, which
    only readers and linters see."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()

    def visit(node: ast.AST) -> None:
        if at_run_time and isinstance(node, ast.If) and \
                getattr(node.test, "id", "") == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(ast.parse(path.read_text(), str(path)))
    return names


def deploy_imports(path: Path, known: set[str]) -> set[str]:
    """The deploy modules `path` imports (a `from deploy.x import name` counts as deploy.x,
    or as deploy.x.name when that is a module)."""
    return {name for name in imported(path) if name in known and name != "deploy"}


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def test_every_deploy_module_belongs_to_a_layer():
    for module in sources():
        if module != "deploy":
            assert module.split(".")[1] in LAYERS, f"{module}: not in a layer of this test"


def test_the_host_package_imports_only_the_standard_library_and_itself():
    assert (DEPLOY / "host" / "__init__.py").is_file()
    for path in sorted((DEPLOY / "host").glob("*.py")):
        for name in imported(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith("deploy.host") \
                or name in ("deploy", "__future__"), f"{path.name} imports {name}"


def test_the_host_package_imports_neither_dataclasses_nor_inspect_nor_typing():
    """Every host's agent imports the package at its start: dataclasses (with the inspect it
    imports) would be a sixth of that start's CPU (records.py), typing and the evaluation of
    the requests' annotations a tenth (protocol.py _parsed)."""
    for path in sorted((DEPLOY / "host").glob("*.py")):
        top = {name.split(".")[0] for name in imported(path, at_run_time=True)}
        found = top & {"dataclasses", "inspect", "typing"}
        assert not found, f"{path.name} imports {sorted(found)}"


def test_lower_layers_never_import_higher_ones():
    known = set(sources())
    wrong = [f"{module} imports {other}" for module, path in sources().items()
             if module != "deploy"
             for other in deploy_imports(path, known) if layer(other) > layer(module)]
    assert wrong == []


def test_no_import_cycles():
    known = set(sources())
    graph = {m: deploy_imports(p, known) - {m} for m, p in sources().items()}
    state: dict[str, int] = {}      # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(other):] + [other]))
            if other not in state:
                visit(other, path + [other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_deploy_never_imports_invoke():
    for path in sorted(DEPLOY.rglob("*.py")):
        assert not any(n.split(".")[0] == "invoke" for n in imported(path)), path


def touches_sys_path(tree: ast.AST) -> list[int]:
    """Lines that call a method of sys.path, assign to it or import it by name."""
    def is_sys_path(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if is_sys_path(target) or (isinstance(target, ast.Subscript)
                                           and is_sys_path(target.value)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" \
                and any(alias.name == "path" for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_no_sys_path_edits_in_the_tool():
    for path in [ROOT / "tasks.py", *sorted(DEPLOY.rglob("*.py"))]:
        assert touches_sys_path(ast.parse(path.read_text())) == [], path


def test_the_sys_path_check_sees_each_way_of_editing_it():
    for code in ("sys.path.insert(0, 'x')", "sys.path = []", "sys.path[0] = 'x'",
                 "sys.path += ['x']", "from sys import path", "sys.path.append('x')"):
        assert touches_sys_path(ast.parse("import sys\n" + code)) == [2], code
    assert touches_sys_path(ast.parse("import sys\nprint(sys.path[0])")) == []


def test_few_modules_flat_in_deploy():
    flat = [p.name for p in DEPLOY.glob("*.py") if p.name != "__init__.py"]
    assert len(flat) <= MAX_FLAT_MODULES, flat


def test_test_files_are_named_apart():
    """pytest imports test files by their base name: two of one name cannot be collected in
    one run."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_the_tools_lines_fit_a_side_by_side_diff():
    """deploy/ and tasks.py keep to 100 columns: read in a terminal beside another file."""
    long = [f"{path.relative_to(ROOT)}:{n}"
            for path in [ROOT / "tasks.py", *sorted(DEPLOY.rglob("*.py"))]
            for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 100]
    assert long == []
