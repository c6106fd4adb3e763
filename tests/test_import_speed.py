"""A package that imports in a blink: ``import fca_workbench``, ``fca --help`` and the refusal of a bad flag import
neither torch nor transformers (nor lm-eval); the public names are imported when first used
(``fca_workbench.foundation.lazy``), and every command's module when it runs (``fca_workbench.cli.COMMANDS``).

Each check runs in a fresh interpreter: this one has torch imported long ago.
"""

import argparse
import ast
import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fca_workbench
from fca_workbench.cli import COMMANDS, build_parser, command_name

PACKAGE = Path(__file__).resolve().parent.parent / "fca_workbench"
HEAVY = ("torch", "transformers", "lm_eval")

RUN_FCA = """
import json, runpy, sys
sys.argv = ["fca", *json.loads(sys.argv[1])]
try:
    runpy.run_module("fca_workbench", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, [name for name in {heavy} if name in sys.modules]]))
"""


def fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def fca_in_fresh_python(*args: str) -> tuple[int, list[str], subprocess.CompletedProcess]:
    """``fca ARGS`` (``python -m fca_workbench``) in a fresh interpreter: its exit code, the heavy modules it
    imported, and the process (stdout's last line is this report)."""
    result = fresh_python(RUN_FCA.format(heavy=HEAVY), json.dumps(args))
    code, imported = json.loads(result.stdout.splitlines()[-1])
    return code, imported, result


def test_importing_the_package_imports_no_torch():
    result = fresh_python(f"import sys, fca_workbench; print([m for m in {HEAVY} if m in sys.modules])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_building_the_parser_imports_no_torch():
    code = f"import sys; from fca_workbench.cli import build_parser; build_parser(); print([m for m in {HEAVY} if m in sys.modules])"
    result = fresh_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [["--help"], ["audit", "--help"], ["eval", "--help"], ["dashboard", "--help"]])
def test_help_imports_no_torch(args):
    code, imported, result = fca_in_fresh_python(*args)
    assert code == 0 and imported == [], result.stderr
    assert "usage: fca" in result.stdout


def test_version_is_the_installed_distributions_and_imports_no_torch():
    code, imported, result = fca_in_fresh_python("--version")
    assert code == 0 and imported == [], result.stderr
    assert result.stdout.splitlines()[0] == f"fca {importlib.metadata.version('fca-workbench')}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["audit", "x", "--max-windows", "0"], "--max-windows: must be at least 1"),
        (["audit", "x", "--dtype", "int8"], "unknown dtype 'int8'"),
        (["audit-many", "x", "y", "--dtype", "half"], "unknown dtype 'half'"),
        (["audit", "x", "--controllers", "a", "--only-controllers", "b"], "not allowed with argument"),
        (["eval", "x", "--tasks", " , "], "--tasks names no task"),
        (["eval", "x", "--tasks", "t", "--conditions", "correct,cross_input"], "'cross_input' needs a text's own"),
        (["eval", "x", "--tasks", "t", "--dtype", "int8"], "unknown dtype 'int8'"),
        (["export", "x", "--profile", "correct", "--out", "y"], "unknown profile 'correct'"),
        (
            ["export", "x", "--profile", "layer_mean", "--audit", "a", "--max-windows", "2", "--out", "y"],
            "--audit gives",
        ),
        (["train", "--arch", "dense", "--gate-range", "sigmoid", "--out", "y"], "--gate-range shape FeatureGate"),
        (["train", "--hf-config", "c.json", "--layers", "2", "--out", "y"], "--layers shape --arch models"),
        (["train", "--arch", "dense", "--steps", "0", "--out", "y"], "--steps: must be at least 1"),
        (["dashboard", "--max-sessions", "-1"], "--max-sessions must be >= 0"),
        (["dashboard", "--basic-auth", "secret"], "--basic-auth on the command line"),
        (["data", "prepare", "--vocab-size", "3"], "--vocab-size: must be at least 257"),
    ],
)
def test_a_bad_flag_is_refused_before_torch_is_imported(args, fragment):
    code, imported, result = fca_in_fresh_python(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fca: error:"), result.stderr
    assert fragment in lines[0]
    assert imported == [], f"{args} imported {imported} before refusing"


def test_the_public_names_still_resolve():
    assert set(fca_workbench.__all__) <= set(dir(fca_workbench))
    assert {"dense", "featuregate", "muddpythia"} <= set(fca_workbench.FAMILIES)
    assert callable(fca_workbench.load_model) and callable(fca_workbench.load_audit)
    assert callable(fca_workbench.load_audits) and fca_workbench.CoefficientLMOutput.__name__ == "CoefficientLMOutput"
    assert isinstance(fca_workbench.__version__, str)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        fca_workbench.no_such_name  # noqa: B018


def test_the_families_are_registered_with_the_auto_classes_when_first_used():
    code = "import fca_workbench, transformers; fca_workbench.FAMILIES; print(transformers.AutoConfig.for_model('fca-featuregate').model_type)"
    result = fresh_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fca-featuregate"


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command of ``parser``, as the words that name it (``("data", "prepare")``)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(commands(sub, (*words, name)) or [(*words, name)])
    return found


def test_every_command_has_a_module_that_runs_it():
    parser = build_parser()
    named = set()
    for words in commands(parser):
        names = {"command": words[0], "data_command": words[1] if len(words) > 1 else None}
        named.add(command_name(argparse.Namespace(**names)))
    assert named == set(COMMANDS)
    for command in COMMANDS.values():
        assert callable(getattr(importlib.import_module(command.module), command.function)), command


def lazy_packages() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("__init__.py") if "lazy_exports(" in p.read_text())


def declared(init: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """What ``init`` imports under ``if TYPE_CHECKING:``, what it hands ``lazy_exports`` (module -> names each),
    and its ``__all__``."""
    tree = ast.parse(init.read_text())
    typed: dict[str, set[str]] = {}
    lazy: dict[str, set[str]] = {}
    public: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                typed.setdefault(statement.module, set()).update(alias.name for alias in statement.names)
            call = node.orelse[0].value
            assert isinstance(call, ast.Call) and isinstance(call.args[1], ast.Dict)
            lazy = {
                ast.literal_eval(k): set(ast.literal_eval(v)) for k, v in zip(call.args[1].keys, call.args[1].values)
            }
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            public = set(ast.literal_eval(node.value))
    return typed, lazy, public


@pytest.mark.parametrize("init", lazy_packages(), ids=lambda p: str(p.parent.relative_to(PACKAGE.parent)))
def test_lazy_names_are_declared_alike_for_type_checkers_and_at_run_time(init):
    typed, lazy, public = declared(init)
    assert typed == lazy, "the TYPE_CHECKING imports and lazy_exports name different things"
    assert set().union(*lazy.values()) == public, "__all__ differs from what lazy_exports hands out"
