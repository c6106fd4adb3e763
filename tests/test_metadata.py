"""The dependency bounds in pyproject.toml are true: every one has a lower bound, the installed packages (the
versions the suite runs against) satisfy it, none is below what an installed dependency itself requires of
another, and the transformers bound is the major version whose APIs the code calls."""

import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirements() -> list[Requirement]:
    """The project's requirements and its extras' (an extra's reference to the project itself aside)."""
    listed = [*PROJECT["dependencies"], *(r for extra in PROJECT["optional-dependencies"].values() for r in extra)]
    return [r for r in map(Requirement, listed) if canonicalize_name(r.name) != canonicalize_name(PROJECT["name"])]


def applies(requirement: Requirement) -> bool:
    """Whether the requirement holds on this Python (markers such as ``python_version < '3.11'``)."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def floor(requirement: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    return max(bounds) if bounds else None


def installed(name: str) -> Version | None:
    try:
        return Version(distribution(name).version)
    except PackageNotFoundError:
        return None


def test_every_requirement_has_a_lower_bound():
    assert [str(r) for r in requirements() if floor(r) is None] == []


def test_the_installed_packages_satisfy_every_bound():
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    checked = 0
    for requirement in filter(applies, requirements()):
        version = installed(requirement.name)
        if version is None:
            assert canonicalize_name(requirement.name) not in core, f"{requirement.name} is not installed"
            continue  # an extra this environment does not install (bench, mutation)
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement} but {version} installed"
        checked += 1
    assert checked >= len(core) + 10


def test_no_bound_is_below_what_a_dependency_at_our_bound_requires_of_another():
    """Each dependency installed at the version our bound names (the tested one) must not need more of another
    than we declare. A dependency installed above our bound is left out: its newer releases may need more (an
    accelerate release needing a newer torch than ``torch>=2.4``) while the release at our bound, which pip
    falls back to beside an older torch, does not; this environment holds only the newer one's metadata."""
    ours = {canonicalize_name(r.name): floor(r) for r in requirements()}
    low, checked = [], 0
    for requirement in filter(applies, requirements()):
        if installed(requirement.name) is None or installed(requirement.name) != floor(requirement):
            continue
        checked += 1
        for theirs in map(Requirement, distribution(requirement.name).requires or []):
            name = canonicalize_name(theirs.name)
            needed = floor(theirs)
            if name in ours and applies(theirs) and needed is not None and ours[name] < needed:
                low.append(f"{name}>={ours[name]}, but {requirement.name} needs {theirs}")
    assert low == []
    assert checked >= 10, f"only {checked} dependencies are installed at the version their bound names"


def test_the_transformers_bound_is_the_major_version_whose_apis_the_code_calls():
    code = "\n".join(path.read_text() for path in (REPO / "fca_workbench").rglob("*.py"))
    assert "from transformers import initialization" in code and "get_experts_implementation" in code  # 5.x APIs
    transformers = next(r for r in requirements() if r.name == "transformers")
    assert floor(transformers) >= Version("5")
    assert installed("transformers") >= floor(transformers)


def test_the_checks_are_configured_once_and_run_by_the_test_script():
    """Lint, format, type and dependency settings live in pyproject.toml alone; pre-commit runs the dev extra's pinned tools
    from .venv (a hook repository's own pin would drift from them); scripts/test.sh fails on each check."""
    assert [
        n for n in ("mypy.ini", ".mypy.ini", "setup.cfg", "ruff.toml", ".ruff.toml", ".flake8") if (REPO / n).exists()
    ] == []
    hooks = (REPO / ".pre-commit-config.yaml").read_text()
    assert "rev:" not in hooks and hooks.count("repo: local") == 1
    assert all(f"entry: .venv/bin/{tool}" in hooks for tool in ("ruff check", "ruff format --check", "mypy"))
    script = (REPO / "scripts" / "test.sh").read_text()
    assert "set -euo pipefail" in script
    checks = ["ruff check", "ruff format --check", "bin/mypy", "bin/deptry", "mkdocs build --strict", "-m pytest"]
    assert sorted(checks, key=script.index) == checks  # every check before the tests
    dev = {Requirement(r).name: Requirement(r) for r in PROJECT["optional-dependencies"]["dev"]}
    assert all(str(dev[tool].specifier).startswith("==") for tool in ("ruff", "mypy", "deptry"))
    deptry = next(line for line in script.splitlines() if "bin/deptry" in line)
    assert (
        deptry.split("#")[0].split("deptry", 1)[1].strip() in hooks
    )  # the hook checks the same roots  # one verdict everywhere


def test_the_citation_names_this_version_and_license():
    """CITATION.cff (YAML, read here line by line: its top-level scalars) agrees with the package's metadata."""
    lines = (REPO / "CITATION.cff").read_text().splitlines()
    fields = dict(line.split(": ", 1) for line in lines if line[:1].isalpha() and ": " in line)
    import fca_workbench

    assert fields["cff-version"] == "1.2.0"
    assert fields["version"] == fca_workbench.__version__
    assert fields["license"] == PROJECT["license"]
