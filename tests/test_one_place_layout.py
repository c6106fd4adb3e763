"""One place each (issues 22, 33): the audit folder's layout, atomic writes, one-line errors, the checkpoint folder.

Each concept has one home; the scans below fail when a second copy is written by hand elsewhere in the package
or the dashboard app, and the behaviour tests pin what that one home does.
"""

import ast
import re
from pathlib import Path

import pytest

from fca_workbench.audit import run as audit_run
from fca_workbench.foundation import checkpoint
from fca_workbench.foundation.checkpoint import check_checkpoint, is_checkpoint
from fca_workbench.foundation.errors import UserError, first_line, one_line
from fca_workbench.foundation.files import atomic_path, temporary_sibling, write_atomic
from fca_workbench.foundation.resources import copy_checkpoints
from fca_workbench.notebooks import reproduce
from fca_workbench.results import layout

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "fca_workbench").rglob("*.py"), *(ROOT / "dashboards").rglob("*.py")])
LAYOUT = ROOT / "fca_workbench" / "results" / "layout.py"
FILES = ROOT / "fca_workbench" / "foundation" / "files.py"
ERRORS = ROOT / "fca_workbench" / "foundation" / "errors.py"
CHECKPOINT = ROOT / "fca_workbench" / "foundation" / "checkpoint.py"
# Files of an audit or results folder. README.md (a run's index) is left out: a checkpoint's model card has
# the same name and is another concept (checkpoint.CARD_FILE).
LAYOUT_FILES = {
    layout.AUDIT_FILE,
    layout.PER_TOKEN_CSV,
    layout.PER_TOKEN_PARQUET,
    layout.PROFILES_FILE,
    layout.AUDIT_MANY_FILE,
    layout.PROVENANCE_FILE,
    layout.RESULTS_MARKER,
    layout.REPRODUCE_CONFIG_FILE,
    layout.OUTPUT_MARKER,
    layout.LOCK_FILE,
}
# Folder names collide with settings keys ("cache", "audits"), so a folder is flagged where a path is joined.
LAYOUT_FOLDERS = {layout.CACHE_DIR, layout.AUDITS_DIR, layout.NOTEBOOKS_DIR, layout.TABLES_DIR, layout.FIGURES_DIR}


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:90]}"


def strings(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def enclosing_functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Every node under a function, mapped to the function's name (the innermost one)."""
    names = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                names[node] = function.name
    return names


# --------------------------------------------------------------------------------------------------------
# The audit folder's layout
# --------------------------------------------------------------------------------------------------------


def layout_spellings(path: Path) -> list[str]:
    tree, found = parsed(path), []
    for constant in strings(tree):
        parts = constant.value.split("/")  # "*/audit.json" and "audits/x/audit.json" are spellings too
        if LAYOUT_FILES & set(parts):
            found.append(where_any(path, constant))
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value in LAYOUT_FOLDERS | LAYOUT_FILES:
                found.append(where_any(path, node))
    return found


def test_every_layout_name_is_spelled_only_in_results_layout():
    spelled = [hit for path in SOURCES if path != LAYOUT for hit in layout_spellings(path)]
    assert not spelled, f"spell these through fca_workbench.results.layout: {spelled}"


def test_the_layout_scan_catches_a_hand_spelled_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "a = out / 'audit.json'\n"
        "b = out / 'tables' / 'x.csv'\n"
        "c = folder.glob('*/provenance.json')\n"
        "d = {'cache': None, 'audits': 1}\n"
        "e = f'no audit.json in {folder}'\n"
    )
    hits = layout_spellings(planted)
    assert sorted(h.split(":")[0] for h in hits) == ["1", "1", "2", "3"], hits  # a key or a message is fine


def test_the_cache_of_an_audit_has_one_rule(tmp_path):
    assert layout.cache_root(None, tmp_path) == tmp_path / "cache"
    assert layout.cache_root(str(tmp_path / "shared"), tmp_path / "audit") == tmp_path / "shared"
    assert layout.split_cache(None, tmp_path, "calibration") == tmp_path / "cache" / "calibration"
    audit = {"settings": {"cache": None}}
    assert layout.cache_folder(audit, tmp_path) == layout.split_cache(None, tmp_path, "eval")
    audit = {"settings": {"cache": str(tmp_path / "elsewhere")}}
    assert layout.cache_folder(audit, tmp_path / "a", "calibration") == tmp_path / "elsewhere" / "calibration"
    assert not hasattr(audit_run, "cache_root") or audit_run.cache_root is layout.cache_root


def test_no_second_cache_rule_is_defined():
    defined = [
        where(path, node)
        for path in SOURCES
        if path != LAYOUT
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.FunctionDef) and node.name in {"cache_root", "cache_folder", "split_cache"}
    ]
    assert not defined, f"the cache of an audit is results.layout's: {defined}"


# --------------------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------------------

# Not a temp-and-rename of one file: train's finish moves the files of a staged checkpoint folder (.fca-final)
# into the run folder one by one, and leaves the staging folder for the user when a name clashes.
STAGED_MOVES = {("fca_workbench/training/train.py", "finish")}


def renames_by_hand(path: Path) -> list[str]:
    tree, found = parsed(path), []
    function_of = enclosing_functions(tree)
    relative = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id == "os" and node.func.attr in {"replace", "rename"}:
                found.append(where_any(path, node))
            elif node.func.attr in {"replace", "rename"} and len(node.args) == 1 and not node.keywords:
                if not (isinstance(receiver, ast.Name) and receiver.id == "dataclasses"):  # Path.replace(target)
                    if (relative, function_of.get(node)) not in STAGED_MOVES:
                        found.append(where_any(path, node))
    found += [where_any(path, c) for c in strings(tree) if c.value.endswith(".tmp")]  # a hidden sibling by hand
    return found


def where_any(path: Path, node: ast.AST) -> str:
    return where(path, node) if path.is_relative_to(ROOT) else f"{node.lineno}: {ast.unparse(node)}"


def test_temporary_files_are_renamed_into_place_only_by_files_py():
    by_hand = [hit for path in SOURCES if path != FILES for hit in renames_by_hand(path)]
    assert not by_hand, f"use files.write_atomic or files.atomic_path: {by_hand}"


def test_the_rename_scan_catches_the_hand_written_ways(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import dataclasses, os\n"
        "tmp = path.with_name(f'.{path.name}.tmp')\n"
        "tmp.replace(path)\n"
        "os.replace(a, b)\n"
        "x = out / '.state.tmp'\n"
        "s = dataclasses.replace(settings, cache=None)\n"
        "t = 'a-b'.replace('-', '_')\n"
    )
    hits = renames_by_hand(planted)
    assert len(hits) == 4 and not any("dataclasses" in h or "'-'" in h for h in hits), hits


def test_atomic_path_renames_on_success_and_removes_on_failure(tmp_path):
    target = tmp_path / "sub" / "weights.bin"
    with atomic_path(target) as tmp:
        assert tmp == temporary_sibling(target) and tmp.parent == target.parent and tmp.name.startswith(".")
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and not tmp.exists()

    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"new" and not tmp.exists()  # the old file stands, no leftover

    folder = tmp_path / "folder"
    with pytest.raises(UserError):
        with atomic_path(folder) as staging:
            (staging / "a").mkdir(parents=True)
            raise UserError("nothing to keep")
    assert not folder.exists() and not staging.exists()  # a staged folder is removed too

    temporary_sibling(target).write_bytes(b"left by a crash")
    write_atomic(target, b"newer")
    assert target.read_bytes() == b"newer" and not temporary_sibling(target).exists()


def test_copy_checkpoints_leaves_nothing_behind_when_the_source_holds_none(tmp_path):
    source = tmp_path / "src"
    (source / "data" / "checkpoints" / "not-a-checkpoint").mkdir(parents=True)
    into = tmp_path / "into"
    with pytest.raises(UserError, match="no checkpoints under data/checkpoints"):
        copy_checkpoints(source, into)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    (source / "data" / "checkpoints" / "one").mkdir()
    (source / "data" / "checkpoints" / "one" / "config.json").write_text("{}")
    assert copy_checkpoints(source, into) == ["one"] and (into / "one" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["into", "src"]


# --------------------------------------------------------------------------------------------------------
# One-line errors
# --------------------------------------------------------------------------------------------------------


def one_lines_by_hand(path: Path) -> list[str]:
    found = []
    for node in ast.walk(parsed(path)):
        # text.splitlines()[0]
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "splitlines":
                found.append(where_any(path, node))
        # str(exc).splitlines() / str(exc).strip().splitlines() / " ".join(str(exc).split())
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"splitlines", "split"}
        ):
            receiver = node.func.value
            while (
                isinstance(receiver, ast.Call)
                and isinstance(receiver.func, ast.Attribute)
                and receiver.func.attr == "strip"
            ):
                receiver = receiver.func.value
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "str":
                if node.func.attr == "splitlines" or not node.args:
                    found.append(where_any(path, node))
    return found


def test_the_first_line_of_an_error_is_taken_only_in_errors_py():
    by_hand = [hit for path in SOURCES if path != ERRORS for hit in one_lines_by_hand(path)]
    assert not by_hand, f"use errors.first_line (or errors.one_line): {by_hand}"


def test_the_one_line_scan_catches_the_hand_written_ways(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "a = str(exc).splitlines()[0]\n"
        "b = str(exc).strip().splitlines()\n"
        "c = ' '.join(str(exc).split())\n"
        "d = [line for line in source.splitlines()]\n"
        "e = str(path).split('/')\n"
    )
    hits = one_lines_by_hand(planted)
    assert sorted(h.split(":")[0] for h in hits) == ["1", "1", "2", "3"], hits  # d and e are not error messages


def test_first_line_and_one_line():
    assert first_line(ValueError("  first\nsecond\n")) == "first"
    assert first_line(KeyError()) == "KeyError" and first_line("") == "" and first_line("a\nb") == "a"
    assert one_line(TypeError("Validation error for field 'x':\n    TypeError: expected int")) == (
        "Validation error for field 'x': TypeError: expected int"
    )
    assert one_line(OSError()) == "OSError"


# --------------------------------------------------------------------------------------------------------
# The checkpoint folder
# --------------------------------------------------------------------------------------------------------

CHECKPOINT_NAMES = {
    checkpoint.CONFIG_FILE,
    checkpoint.GENERATION_CONFIG_FILE,
    checkpoint.SAFETENSORS_FILE,
    checkpoint.SAFETENSORS_INDEX,
    checkpoint.BIN_FILE,
    checkpoint.BIN_INDEX,
    checkpoint.TOKENIZER_FILE,
    checkpoint.TOKENIZER_CONFIG_FILE,
    checkpoint.SPECIAL_TOKENS_FILE,
    checkpoint.CARD_FILE,
    checkpoint.TRAIN_CARD_FILE,
    checkpoint.TRAIN_LOG_FILE,
    checkpoint.TRAIN_STATE_FILE,
}
# README.md is also the name of other folders' own files, other concepts: a results folder's index, the data
# folder's description of the corpus.
README_ELSEWHERE = {LAYOUT, ROOT / "fca_workbench" / "data" / "corpus.py"}


def docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def checkpoint_spellings(path: Path) -> dict[str, list[str]]:
    """Every checkpoint file name spelled in ``path`` outside a docstring (a path joined, a pattern, a message
    in an f-string alike), by name; a name inside a longer one (``model.safetensors.index.json``,
    ``reproduce_config.json``) is that name only."""
    tree = parsed(path)
    prose = docstrings(tree)
    found: dict[str, list[str]] = {}
    for constant in strings(tree):
        if id(constant) in prose:
            continue
        for name in CHECKPOINT_NAMES:
            if re.search(r"(?<![\w.-])" + re.escape(name) + r"(?!\.?[\w-])", constant.value):
                found.setdefault(name, []).append(where_any(path, constant))
    return found


def test_every_checkpoint_file_name_is_spelled_only_in_the_checkpoint_module():
    spelled = {
        hit
        for path in SOURCES
        if path != CHECKPOINT
        for name, hits in checkpoint_spellings(path).items()
        if not (name == checkpoint.CARD_FILE and path in README_ELSEWHERE)
        for hit in hits
    }
    assert not spelled, f"import these names from fca_workbench.foundation.checkpoint: {sorted(spelled)}"
    assert set(checkpoint_spellings(CHECKPOINT)) == CHECKPOINT_NAMES  # and each is declared there


def test_the_checkpoint_name_scan_catches_a_hand_spelled_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""A docstring may name config.json."""\n'
        "a = folder / 'config.json'\n"
        "b = f'{folder} has no model.safetensors.index.json'\n"
        "c = out / 'reproduce_config.json'\n"
        "d = ('tokenizer.json', 'train_log.csv')\n"
    )
    found = {name: [int(h.split(":")[0]) for h in hits] for name, hits in checkpoint_spellings(planted).items()}
    assert found == {
        "config.json": [2],
        "model.safetensors.index.json": [3],
        "tokenizer.json": [5],
        "train_log.csv": [5],
    }, found


CHECK_MESSAGES = ("checkpoint folder not found", "not a checkpoint folder")


def test_the_checkpoint_check_is_written_once():
    copies = [
        where(path, constant)
        for path in SOURCES
        if path != CHECKPOINT
        for constant in strings(parsed(path))
        if any(message in constant.value for message in CHECK_MESSAGES)
    ]
    assert not copies, f"use checkpoint.check_checkpoint: {copies}"
    probes = [  # (folder / CONFIG_FILE).is_file(): what checkpoint.is_checkpoint says
        where(path, node)
        for path in SOURCES
        if path != CHECKPOINT
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "is_file"
        and isinstance(node.func.value, ast.BinOp)
        and ast.unparse(node.func.value.right) in {"CONFIG_FILE", "checkpoint.CONFIG_FILE"}
    ]
    assert not probes, f"use checkpoint.is_checkpoint: {probes}"


def test_check_checkpoint_messages(tmp_path):
    with pytest.raises(UserError, match=r"^checkpoint folder not found: .*missing$"):
        check_checkpoint(tmp_path / "missing")
    with pytest.raises(UserError, match=r"^not a checkpoint folder \(no config.json\): "):
        check_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert check_checkpoint(str(tmp_path)) == tmp_path and is_checkpoint(tmp_path)


def test_every_caller_uses_the_one_check(tmp_path):
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.models import load_model

    checks = (load_model, load_controlled, lambda folder: reproduce.NotebookRun(checkpoints=[folder]).check())
    for check in checks:
        with pytest.raises(UserError, match=r"^checkpoint folder not found: "):
            check(tmp_path / "missing")
        with pytest.raises(UserError, match=r"^not a checkpoint folder \(no config.json\): "):
            check(tmp_path)


# --------------------------------------------------------------------------------------------------------
# JSON files and the boundary of a loader (issue 23)
# --------------------------------------------------------------------------------------------------------

JSON_MODULES = {"json", "orjson", "ujson", "simplejson"}
# Uses of the json module that neither read nor write a file: canonical JSON hashed into a fingerprint or a
# cache key, and plotly's JSON handed to Jupyter as a dict. Any other is a JSON reader or writer by hand.
JSON_NOT_FILES = {
    ("fca_workbench/audit/capture.py", "model_fingerprint"),
    ("fca_workbench/notebooks/notebook_run.py", "shared_cache"),
    ("fca_workbench/results/figures.py", "mimebundle"),
}


def json_by_hand(path: Path) -> list[str]:
    tree, found = parsed(path), []
    function_of = enclosing_functions(tree)
    relative = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in JSON_MODULES:  # from json import loads
            found.append(where_any(path, node))
        elif isinstance(node, ast.Import):  # import json as j
            found += [where_any(path, node) for alias in node.names if alias.name in JSON_MODULES and alias.asname]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in JSON_MODULES
            and node.func.attr in {"load", "loads", "dump", "dumps"}
            and (relative, function_of.get(node)) not in JSON_NOT_FILES
        ):
            found.append(where_any(path, node))
    return found


def test_json_is_read_and_written_only_through_files_py():
    by_hand = [hit for path in SOURCES if path != FILES for hit in json_by_hand(path)]
    assert not by_hand, (
        f"read JSON with files.read_json/parse_json, write it with files.write_json/dumps_json: {by_hand}"
    )


def test_the_json_scan_catches_the_hand_written_ways(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import json\n"
        "a = json.loads(path.read_text())\n"
        "path.write_text(json.dumps(audit, indent=2))\n"
        "from json import load\n"
        "import json as j\n"
        "with open(p) as f: b = json.load(f)\n"
        "json.dump(x, f)\n"
        "c = json.JSONDecodeError\n"
        "def model_fingerprint(): return json.dumps(1)\n"
    )
    hits = json_by_hand(planted)
    assert sorted(int(h.split(":")[0]) for h in hits) == [2, 3, 4, 5, 6, 7, 9], hits  # 9: allowed only in capture.py


def broad_handlers_turned_into_user_errors(path: Path) -> list[str]:
    """``except Exception`` (or bare, or ``BaseException``) whose body raises a ``UserError``: a loader's
    boundary written by hand, which would turn a real bug into a one-line message."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ExceptHandler):
            caught = node.type
            broad = caught is None or (isinstance(caught, ast.Name) and caught.id in {"Exception", "BaseException"})
            raises_user_error = any(
                isinstance(inner, ast.Raise)
                and isinstance(inner.exc, ast.Call)
                and isinstance(inner.exc.func, ast.Name)
                and inner.exc.func.id == "UserError"
                for inner in ast.walk(node)
            )
            if broad and raises_user_error:
                found.append(where_any(path, node))
    return found


def test_a_libraries_exceptions_become_one_line_only_at_files_reading():
    by_hand = [hit for path in SOURCES if path != FILES for hit in broad_handlers_turned_into_user_errors(path)]
    assert not by_hand, f"hand the file to the library inside files.reading(...): {by_hand}"


def test_the_broad_handler_scan_catches_a_hand_written_boundary(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "try:\n    load(p)\nexcept Exception as exc:\n    raise UserError(f'{p}: {exc}') from None\n"
        "try:\n    load(p)\nexcept:\n    raise UserError('bad')\n"
        "try:\n    load(p)\nexcept ValueError as exc:\n    raise UserError('bad') from None\n"
        "try:\n    run()\nexcept Exception as exc:\n    report(exc)\n"
    )
    assert [int(h.split(":")[0]) for h in broad_handlers_turned_into_user_errors(planted)] == [3, 7]


def test_reading_turns_a_librarys_errors_into_one_line_and_leaves_bugs_alone(tmp_path):
    from fca_workbench.foundation.files import reading

    with pytest.raises(UserError, match=r"^cannot read x: no key 'added_tokens'; try again$"):
        with reading("cannot read x", "try again"):
            {}["added_tokens"]
    with pytest.raises(UserError, match=r"^cannot read x: data did not match any variant$"):
        with reading("cannot read x"):
            raise Exception("data did not match any variant\nat line 1")  # the Rust tokenizers' bare Exception
    with pytest.raises(UserError, match=r"^cannot read x: maximum recursion depth exceeded$"):
        with reading("cannot read x"):
            raise RecursionError("maximum recursion depth exceeded")
    with pytest.raises(UserError, match=r"^already one line$"):
        with reading("cannot read x"):
            raise UserError("already one line")

    class Bug(Exception):
        pass

    with pytest.raises(Bug):  # not what a library raises on a bad file: a bug keeps its traceback
        with reading("cannot read x"):
            raise Bug("a bug")
    with pytest.raises(AssertionError):
        with reading("cannot read x"):
            raise AssertionError("a bug")


def test_a_user_error_is_one_line_wherever_it_is_printed():
    error = UserError("model_type 'a\nb' is unknown\r\n")
    assert str(error) == "model_type 'a b' is unknown" and error.args == ("model_type 'a\nb' is unknown\r\n",)


def test_read_json_refuses_what_strict_json_has_not(tmp_path):
    from fca_workbench.foundation.files import read_json

    path = tmp_path / "a.json"
    for text, message in [
        ("[1e400]", "1e400 is too large for a number"),  # Python's json reads it as infinity
        ('{"x": NaN}', "NaN is not a JSON value"),
        ("[" * 100_000, "nested too deeply"),
        ("[1]", "holds a JSON array, not a JSON object"),
    ]:
        path.write_text(text)
        with pytest.raises(UserError, match=re.escape(message)):
            read_json(path)
    path.write_bytes(b'\xef\xbb\xbf{"x": 1.5}')
    assert read_json(path) == {"x": 1.5}
