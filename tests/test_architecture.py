"""The folder order of reproduce/ (docs/developing.md): every import points down it, and no
module imports itself back through others. Imports inside functions count too."""

import ast
from pathlib import Path

import reproduce

PACKAGE = Path(reproduce.__file__).parent
# Lowest first: a module may import its own layer and those before it, never one after it.
LAYERS = [
    {"config", "errors", "paths", "util"},
    {"paper"},
    {"data"},
    {"records"},
    {"train"},
    {"plan"},
    {"tables", "speed"},
    {"launch"},
    {"commands"},
    {"__main__"},
]


def _name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    if not top:  # the package itself
        return 0
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {_name(p, package): p for p in package.rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = parent.split(".")[:len(parent.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def test_every_module_has_a_layer():
    for module in _imports():
        assert module == "reproduce" or any(module.split(".")[1] in names for names in LAYERS), \
            f"{module}: add its folder to LAYERS and to docs/developing.md"


def _against(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} imports {b}" for a, targets in edges.items() for b in sorted(targets)
            if _layer(b) > _layer(a)]


def _circles(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return circles


def test_imports_point_down_the_folder_order():
    against = _against(_imports())
    assert not against, "imports against the folder order:\n" + "\n".join(against)


def test_no_import_circles():
    circles = _circles(_imports())
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_scan_finds_an_upward_import_and_a_circle(tmp_path):
    package = tmp_path / "reproduce"
    for folder in ("paper", "train"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    # the model importing the training machinery, lazily, and the fit importing the model
    (package / "paper" / "model.py").write_text("def f():\n    from ..train import fit\n")
    (package / "train" / "fit.py").write_text("from reproduce.paper.model import f\n")
    edges = _imports(package)
    assert _against(edges) == ["reproduce.paper.model imports reproduce.train.fit"]
    assert _circles(edges) == ["reproduce.paper.model -> reproduce.train.fit -> "
                               "reproduce.paper.model"]


def test_pyproject_lists_every_package():
    # the wheel carries only the packages pyproject.toml names (and the specs, as reproduce.sweeps)
    import re

    listed = set(re.findall(r'^\s+"(reproduce[\w.]*)",$', (PACKAGE.parent / "pyproject.toml")
                            .read_text(), flags=re.MULTILINE))
    folders = {_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert folders | {"reproduce.sweeps"} == listed


def test_each_module_name_once():
    # a name says one job: two folders' `cache.py` (or `status.py`) send a newcomer to the wrong one
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(_name(path))
    assert {stem: names for stem, names in seen.items() if len(names) > 1} == {}


def test_no_function_over_80_lines():
    # a function longer than a screen does several jobs: name them as functions of their own
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (lines := node.end_lineno - node.lineno + 1) > 80:
                    long.append(f"{_name(path)}.{node.name}: {lines} lines")
    assert long == []


def test_signal_handlers_and_lightning_s_stop_flag_live_in_one_module():
    """Stops have one owner (reproduce/train/stops.py): no other module installs a signal handler
    (``signal.signal``) or touches Lightning's private ``_signal_connector``."""
    owner = PACKAGE / "train" / "stops.py"
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_signal_connector" or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "signal" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "signal"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, "signal handling outside train/stops.py: " + ", ".join(found)


def test_commands_that_only_price_runs_leave_torch_s_compiler_unimported():
    """``status``, ``--render`` and a dry run read records and price runs: importing them must not
    import ``torch._dynamo`` (~2.4 s of a core on a slow CPU; ``@torch.compiler.disable`` at a
    module's top imports it). Fresh, as a user's command starts."""
    import subprocess
    import sys

    modules = ["reproduce.__main__", "reproduce.commands.status", "reproduce.commands.table",
               "reproduce.launch.progress", "reproduce.plan.dry_run", "reproduce.tables.render"]
    out = subprocess.run(
        [sys.executable, "-c", f"import sys\nfor m in {modules!r}: __import__(m)\n"
         "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:3])"],
        capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]", out.stdout
