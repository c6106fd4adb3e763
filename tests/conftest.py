"""Shared fixtures: tiny random models of every family, with controllers that really vary; one tiny ``fca
reproduce`` run; and ``fca`` run as a user runs it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fca_workbench.models import FAMILIES

TINY = dict(vocab_size=64, layers=2, width=64, heads=4, window=16)


def fca(*args, cwd=None):
    """``fca ARGS`` in a subprocess of this Python (exit code, stdout and stderr as text)."""
    return subprocess.run(
        [sys.executable, "-m", "fca_workbench", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def assert_one_line_error(result, *fragments):
    """A user error: non-zero exit, no traceback, one ``fca: error:`` line holding every fragment."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fca: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def refused_before_anything(argv: list, out: Path, capsys, *fragments: str) -> str:
    """``fca ARGV --out OUT`` run in this process (``cli.main``): refused (exit 2) in one ``fca: error:`` line
    holding every fragment, with ``OUT`` never created; the line is returned."""
    from fca_workbench.cli import main

    assert main([*map(str, argv), "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fca: error:"), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not out.exists()
    return lines[0]


def tiny_model(arch: str, seed: int = 0, **sizes):
    """A tiny random model whose controllers emit input-dependent coefficients (not the zero init)."""
    config_class, model_class = FAMILIES[arch]
    torch.manual_seed(seed)
    model = model_class(config_class.from_sizes(**{**TINY, **sizes}))
    for controller in model.controllers:
        for param in controller.parameters():
            torch.nn.init.normal_(param, std=0.5)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer():
    """The project tokenizer (vocab 4096), which every tiny foreign model of the tests is saved with."""
    from fca_workbench.data.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(params=sorted(FAMILIES))
def arch(request):
    return request.param


@pytest.fixture
def windows():
    return torch.randint(0, TINY["vocab_size"], (6, TINY["window"]), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Tiny random checkpoint folders of every family, with the shipped tokenizer, context 64."""
    from fca_workbench.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = load_tokenizer()
    folders = {}
    for name in sorted(FAMILIES):
        folders[name] = root / name
        tiny_model(name, vocab_size=len(tokenizer), window=64).save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    return folders


TINY_MIXTRAL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="session")
def tiny_mixtral(tmp_path_factory):
    """A tiny random Mixtral folder (2 layers, 4 experts, top-2, context 64) with the shipped tokenizer; its
    routers are scaled up so that routing depends on the input."""
    import transformers

    from fca_workbench.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("mixtral") / "mixtral"
    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(vocab_size=len(tokenizer), **TINY_MIXTRAL))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(20.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def second_seed(folder: Path, out: Path) -> Path:
    """Another FeatureGate 'seed': the same tiny model with differently drawn controller weights."""
    from transformers import AutoModelForCausalLM

    from fca_workbench.data.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for controller in model.controllers:
            for param in controller.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(out)
    load_tokenizer(folder).save_pretrained(out)
    return out


TINY_REPRODUCE_SETTINGS = {"max_windows": 4, "batch_size": 4}  # every audit of the shared run


@pytest.fixture(scope="session")
def tiny_reproduce(tiny_checkpoints, tiny_mixtral, tmp_path_factory):
    """One tiny ``fca reproduce`` run of every notebook, shared by every test that reads one (it is the slowest
    fixture: ~2-5 min on a loaded 2-core machine): tiny random checkpoints of each family, a second FeatureGate
    seed and a tiny Mixtral, 4 windows of 64 tokens. Returns the plan, the results by notebook name, each
    checkpoint's audit.json by checkpoint name, and the checkpoint folders by name. Tests must not write into it."""
    from fca_workbench.notebooks import reproduce

    root = tmp_path_factory.mktemp("reproduce")
    names = {"featuregate": "featuregate-s0", "dense": "dense-s0", "muddpythia": "muddpythia-s0"}
    folders = {name: Path(shutil.copytree(tiny_checkpoints[arch], root / name)) for arch, name in names.items()}
    folders["featuregate-s1"] = second_seed(tiny_checkpoints["featuregate"], root / "featuregate-s1")
    folders["moe-s0"] = Path(shutil.copytree(tiny_mixtral, root / "moe-s0"))
    order = ["featuregate-s0", "featuregate-s1", "dense-s0", "muddpythia-s0", "moe-s0"]
    config = root / "tiny.json"
    config.write_text(
        json.dumps(
            {
                "notebooks": sorted(p.stem for p in reproduce.NOTEBOOK_DIR.glob("*.py")),
                "cache": str(root / "cache"),
                "parameters": {"checkpoints": [str(folders[name]) for name in order], **TINY_REPRODUCE_SETTINGS},
                # 08's defaults evaluate all 1,600 fca_play_choice items: a few of the small task here
                "notebook": {"explore": {"window_index": 1}, "08_downstream": {"tasks": "fca_next_line", "limit": 16}},
            }
        )
    )
    plan, results = reproduce.reproduce(config, root / "run", progress=False)
    audits = {name: json.loads((plan.out / "audits" / name / "audit.json").read_text()) for name in order}
    return plan, {r.name: r for r in results}, audits, folders


@pytest.fixture
def fingerprint_calls(monkeypatch):
    """Every hash of a model's weights the session or a capture takes (``capture.model_fingerprint``), by the
    model's class name."""
    import fca_workbench.audit.capture as capture_module
    import fca_workbench.audit.session as session_module

    calls = []
    real = capture_module.model_fingerprint

    def counted(model):
        calls.append(type(model).__name__)
        return real(model)

    monkeypatch.setattr(session_module, "model_fingerprint", counted)
    monkeypatch.setattr(capture_module, "model_fingerprint", counted)
    return calls


@pytest.fixture
def nothing_built(monkeypatch):
    """Fails the test if a layer with weights (a Linear or an Embedding: every model has one) is constructed: a
    refusal "before building" is checked on that state, not by how long it took (a time bound fails under load)."""

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"a {type(self).__name__} was built before the refusal")

    for layer in (torch.nn.Linear, torch.nn.Embedding):
        monkeypatch.setattr(layer, "__init__", refuse)


def assert_identical_models(model, loaded, ids):
    """Bit-exact equality of two models: every weight, and the logits and coefficients on ``ids``."""
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        a = model(ids, return_coefficients=True)
        b = loaded(ids, return_coefficients=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(x, y) for x, y in zip(a.coefficients, b.coefficients))


def perturbed_muddpythia(config: dict, seed: int = 0):
    """A MUDDPythia whose every parameter is perturbed, so controllers and norms are not at their init."""
    from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM

    torch.manual_seed(seed)
    model = MUDDPythiaForCausalLM(MUDDPythiaConfig(**config))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()


# Modules that read the one shared ``tiny_reproduce`` run go to the same pytest-xdist worker, so it is made once.
SHARED_RUN_MODULES = {"test_notebooks", "test_reproduce"}


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (scripts/test.sh: ``-n 2``) every module runs whole on one worker, so its
    module-scoped fixtures (servers, audits, training runs) are built once, and the modules that share the
    tiny reproduce run run on one worker. (xdist's own ``--dist loadgroup`` marks have no effect under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return "shared-reproduce" if Path(module).stem in SHARED_RUN_MODULES else module

    return ModuleScheduling(config, log)
