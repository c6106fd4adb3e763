"""The user's pages say what the code does: README's commands, links that lead somewhere, the docs' vocabulary
and fields as the code spells them, and CONTRIBUTING's controller-kind example still running."""

import argparse
import importlib.util
import json
import re
from pathlib import Path

import pytest

from fca_workbench.adapters import kinds
from fca_workbench.cli import build_parser
from fca_workbench.results.conditions import CONDITIONS, ROUTING_CONDITIONS, STATIC_PROFILES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_readme_gives_the_two_commands_exactly() -> None:
    """CI runs the README's test command verbatim; the reproduce command is the other one."""
    commands = re.findall(r"^    (\./scripts/\S+)$", read(ROOT / "README.md"), re.MULTILINE)
    assert commands == ["./scripts/reproduce.sh", "./scripts/test.sh"]
    assert all((ROOT / c).is_file() for c in commands)


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_relative_links_of_the_top_level_pages_lead_to_files(page: str) -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(ROOT / page))
    relative = [link for link in links if "://" not in link]
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"{page} links to missing files: {missing}"


def test_every_api_reference_names_a_module_of_the_package() -> None:
    """mkdocstrings fails the strict build on an unknown ``:::`` identifier; this says which, without mkdocs."""
    identifiers = [i for page in PAGES for i in re.findall(r"^::: (\S+)$", read(page), re.MULTILINE)]
    assert "fca_workbench.adapters" in identifiers
    unknown = [i for i in identifiers if importlib.util.find_spec(i) is None]
    assert not unknown, f"docs reference modules that do not exist: {unknown}"


def test_the_api_reference_has_every_public_entry_point_with_its_annotations() -> None:
    """The entry points the guides cite have their page, and signatures show their annotations (issue 37)."""
    identifiers = {i for page in PAGES for i in re.findall(r"^::: (\S+)$", read(page), re.MULTILINE)}
    entry_points = {"fca_workbench", "fca_workbench.audit.run", "fca_workbench.audit.session", "fca_workbench.export"}
    entry_points |= {"fca_workbench.export.static", "fca_workbench.downstream", "fca_workbench.viewmodel"}
    assert entry_points <= identifiers, sorted(entry_points - identifiers)
    config = read(ROOT / "mkdocs.yml")
    for option in ("show_signature_annotations: true", "separate_signature: true", "docstring_section_style: table"):
        assert option in config
    pages = set(re.findall(r"(api/[\w-]+\.md)", config))
    assert pages == {str(p.relative_to(DOCS)) for p in (DOCS / "api").glob("*.md")}  # every page in the nav


def test_readme_gives_the_run_time_of_reproduce() -> None:
    assert re.search(r"^Run time .*about \d+ minutes", read(ROOT / "README.md"), re.MULTILINE)


def test_concepts_define_every_condition_by_its_audit_name() -> None:
    concepts = read(DOCS / "concepts.md")
    for condition in CONDITIONS + STATIC_PROFILES + ROUTING_CONDITIONS:
        assert re.search(rf"^\| `{condition}` \|", concepts, re.MULTILINE), condition


def test_audit_json_page_explains_every_field_of_the_schema() -> None:
    schema = json.loads(read(ROOT / "fca_workbench" / "results" / "audit.schema.json"))
    page = read(DOCS / "audit-json.md")
    for section in schema["properties"]:
        assert re.search(rf"^### `{section}`$", page, re.MULTILINE), section
    for section in ("model", "execution"):
        for field in schema["properties"][section]["properties"]:
            assert f"`{field}`" in page, f"{section}.{field}"


def test_cli_guide_covers_every_command() -> None:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    guides = read(DOCS / "guides" / "cli.md") + read(DOCS / "guides" / "training.md")
    for command in subparsers.choices:
        assert re.search(rf"^ *fca {re.escape(command)}( |$)", guides, re.MULTILINE), command


def test_benchmark_summary_names_scripts_that_exist() -> None:
    summary = read(ROOT / "benchmarks" / "results" / "summary.md")
    scripts = set(re.findall(r"benchmarks/[\w/]+\.(?:py|sh)", summary))
    assert "benchmarks/bench_sweep.py" in scripts
    assert all((ROOT / s).is_file() for s in scripts), sorted(s for s in scripts if not (ROOT / s).is_file())


def test_contributing_controller_kind_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example a contributor copies: a kind of their own finds its controllers, replays `correct` exactly
    and replays a static profile."""
    monkeypatch.setattr(kinds, "KINDS", list(kinds.KINDS))
    monkeypatch.setattr("fca_workbench.adapters.hf.KINDS", kinds.KINDS)
    example = re.findall(r"```python\n(.*?)```", read(ROOT / "CONTRIBUTING.md"), re.DOTALL)[0]
    namespace: dict = {}
    exec(compile(example, "CONTRIBUTING.md", "exec"), namespace)
    assert kinds.KINDS[0].name == "channel_gate"
    assert namespace["controlled"].controller_names == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]


def test_layer_map_lists_every_module_where_it_is() -> None:
    """docs/layers.md is the code's map: every module of the package and of dashboards/ has its row, and no row
    names a file that is not there."""
    page = (ROOT / "docs" / "layers.md").read_text()
    listed = set(re.findall(r"^\| `((?:fca_workbench|dashboards)/[\w/]+\.py)` \|", page, re.MULTILINE))
    present = {
        str(p.relative_to(ROOT)) for folder in ("fca_workbench", "dashboards") for p in (ROOT / folder).rglob("*.py")
    }
    assert present - listed == set(), f"modules without a row in docs/layers.md: {sorted(present - listed)}"
    assert listed - present == set(), f"rows of docs/layers.md naming no file: {sorted(listed - present)}"


def test_every_dotted_name_in_the_docs_exists() -> None:
    """``fca_workbench.x.y`` in README, CONTRIBUTING and docs/ names a module or an attribute that is there."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for dotted in sorted(set(re.findall(r"fca_workbench(?:\.\w+)+", page.read_text()))):
            parts = dotted.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    target = importlib.import_module(".".join(parts[:cut]))
                    break
                except ModuleNotFoundError:
                    continue
            for name in parts[cut:]:
                if not hasattr(target, name):
                    missing.append(f"{page.relative_to(ROOT)}: {dotted}")
                    break
                target = getattr(target, name)
    assert missing == []
