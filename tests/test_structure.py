"""The package's shape: layers that only point down, no import cycles, modules of a readable size.

Layers, lowest first (a module imports only from its own layer or the ones below; docs/layers.md):
foundation/ (errors, files, fingerprints, flags, lazy, resources, checkpoint) → data → models → adapters → results
→ audit → entry points (cli/, training/, notebooks/, export/, downstream/, viewmodel/, explore).
"""

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fca_workbench"
LAYERS = ["foundation", "data", "models", "adapters", "results", "audit", "entry"]
MAX_LINES = 450  # outside models/, where one readable file per family may be longer


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "entry"  # fca_workbench itself re-exports from below
    return parts[1] if parts[1] in LAYERS[:-1] else "entry"


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(imported workbench module, line, inside a function)`` for every import of the workbench in ``path``."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("fca_workbench"):
                for alias in child.names:
                    candidate = f"{child.module}.{alias.name}"
                    target = candidate if MODULES.get(candidate) else child.module
                    found.append((target, child.lineno, in_function))
            elif isinstance(child, ast.Import):
                found.extend(
                    (a.name, child.lineno, in_function) for a in child.names if a.name.startswith("fca_workbench")
                )
            visit(child, nested)

    visit(tree, False)
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    assert {layer(m) for m in MODULES} <= set(LAYERS)
    assert layer("fca_workbench.audit.capture") == "audit" and layer("fca_workbench.foundation.files") == "foundation"
    assert layer("fca_workbench.foundation.checkpoint") == "foundation"
    assert layer("fca_workbench.cli") == "entry" and layer("fca_workbench.viewmodel.live") == "entry"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    here = LAYERS.index(layer(module))
    upward = [
        f"line {line}: {target} ({layer(target)})"
        for target, line, _ in imports(MODULES[module])
        if LAYERS.index(layer(target)) > here
    ]
    assert not upward, f"{module} ({layer(module)}) imports from a layer above it: {upward}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_local_imports_of_the_workbench(module):
    local = [f"line {line}: {target}" for target, line, inside in imports(MODULES[module]) if inside]
    assert not local, f"{module} imports inside a function (a cycle dodged, or a slow import hidden): {local}"


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    done, on_path = set(), []

    def walk(module):
        if module in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(module) :] + [module]))
        if module in done:
            return
        on_path.append(module)
        for target in sorted(graph[module]):
            # a package's __init__ importing its own submodules is how re-exports work, not a cycle
            if not target.startswith(module + "."):
                walk(target)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        walk(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("fca_workbench.models.")))
def test_modules_stay_readable(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by concern (at most {MAX_LINES} outside models/)"


def unannotated(tree: ast.Module) -> list[str]:
    """``line name: what is missing`` for every public module- or class-level function (nested ones aside)
    without a parameter or return annotation; ``self``/``cls`` need none, ``__init__`` no return."""
    found = []

    def check(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> None:
        args = function.args
        positional = args.posonlyargs + args.args
        params = positional + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a is not None]
        missing = [
            a.arg for a in params if a.annotation is None and not (a is positional[0] and a.arg in ("self", "cls"))
        ]
        if function.returns is None and function.name != "__init__":
            missing.append("return")
        if missing:
            found.append(f"line {function.lineno} {owner}{function.name}: {', '.join(missing)}")

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_") or node.name == "__init__":
                    check(node, owner)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, (ast.If, ast.Try)):  # definitions under `if TYPE_CHECKING:` or `try:`
                visit(node.body + node.orelse, owner)

    visit(tree.body, "")
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_public_functions_are_annotated(module):
    missing = unannotated(ast.parse(MODULES[module].read_text()))
    assert not missing, f"{module}: annotate every parameter and the return of its public functions: {missing}"


PUBLIC_PATHS = [  # what the README and notebooks of the flat layout imported, and users' code with them
    ("fca_workbench", "load_model"),
    ("fca_workbench", "load_audit"),
    ("fca_workbench", "load_audits"),
    ("fca_workbench.notebooks.tables", "variation_table"),
    ("fca_workbench.notebooks.tables", "open_cache"),
    ("fca_workbench.notebooks.tables", "show"),
    ("fca_workbench.notebooks.reproduce", "NotebookRun"),
    ("fca_workbench.notebooks.reproduce", "shipped_checkpoints"),
    ("fca_workbench.training.training_audit", "MiniAudit"),
    ("fca_workbench.training.training_audit", "load_training_runs"),
    ("fca_workbench.training.callbacks", "FCACallback"),
    ("fca_workbench.explore", "Explorer"),
    ("fca_workbench.adapters", "load_controlled"),
    ("fca_workbench.adapters", "register_kind"),
    ("fca_workbench.adapters", "tensor_kind"),
    ("fca_workbench.foundation.resources", "shipped"),
    ("fca_workbench.foundation.errors", "UserError"),
    ("fca_workbench.viewmodel", "condition_named"),
    ("fca_workbench.audit", "run_audit"),
    ("fca_workbench.audit", "AuditSettings"),
    ("fca_workbench.data", "load_windows"),
    ("fca_workbench.data", "split_path"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC_PATHS)
def test_public_import_paths_keep_working(module, name):
    assert hasattr(importlib.import_module(module), name)
