"""The controlled-model protocol as code: both implementations satisfy ``ControlledModel`` (the native
families also ``SteppingModel``), family-specific behaviour sits behind protocol members (no family name or
router output key in the core or the UI), and every family and controller kind names its slots once."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
import torch
import transformers as T

from fca_workbench.adapters import TransformersControlled
from fca_workbench.adapters.kinds import ROUTER_OUTPUT, top_k
from fca_workbench.adapters.protocol import ControlledModel, SteppingModel
from fca_workbench.audit.interventions import routing_top_k
from fca_workbench.audit.prefix import PrefixCache
from fca_workbench.audit.sweep import PREFIX, sweep_mode
from fca_workbench.models.dense import DenseConfig, DenseForCausalLM
from fca_workbench.models.featuregate import FeatureGateConfig, FeatureGateForCausalLM
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM
from fca_workbench.results.slots import audit_slot_labels, slot_labels

ROOT = Path(__file__).resolve().parent.parent
SIZES = dict(vocab_size=64, layers=2, width=32, heads=4, window=16)
CORE = [ROOT / "fca_workbench" / part for part in ("audit", "results", "dashboard")] + [ROOT / "dashboards"]
FAMILY_NAMES = re.compile(r"featuregate|muddpythia|\bdense\b", re.IGNORECASE)
ROUTER_KEYS = re.compile("|".join(ROUTER_OUTPUT))
# (file relative to the repository, a code token that names a family), each group with its reason
BASELINE_NAME = [  # ``execution.baseline``'s value in audit.json ("dense": the shape-matched Dense the native
    # families are timed against, the default for audits written before the field), and the user-visible
    # column, caption and report text that name that baseline: a field of the on-disk contract, read from the
    # audit, never a test of the model's family
    ("fca_workbench/results/audit_tables.py", '"dense"'),
    (
        "fca_workbench/results/audit_tables.py",
        '"shape-matched Dense; for routers the static mixture, every expert run for every token)"',
    ),
    ("fca_workbench/results/audit_tables.py", '"latency / Dense (model)"'),
    ("fca_workbench/results/audit_tables.py", '"latency / Dense (control)"'),
    (
        "fca_workbench/results/report.py",
        """f"{'latency / ' + e.get('baseline', 'dense'):24s}{e['latency_ratio_vs_dense']:>10.2f}\"""",
    ),
    ("fca_workbench/results/report.py", """f"{'  latency / Dense':24s}{control['latency_ratio_vs_dense']:>10.2f}\""""),
    ("fca_workbench/results/seeds.py", '"latency / Dense"'),
    ("fca_workbench/results/verdicts.py", '"dense"'),
    ("fca_workbench/results/verdicts.py", '"the shape-matched Dense"'),
    (
        "fca_workbench/results/verdicts.py",
        """f"latency {e['latency_ratio_vs_dense']:.2f}× {BASELINES[e.get('baseline', 'dense')]}\"""",
    ),
]
PUBLISHED = [  # names and captions of the notebooks' tables as published (users and the README cite them)
    (
        "fca_workbench/results/audit_tables.py",
        '"Positive control: a FeatureGate copy that skips MLP rows whose gates fall below "',
    ),
    ("fca_workbench/results/audit_tables.py", '"muddpythia_penalties"'),
    (
        "fca_workbench/results/audit_tables.py",
        '"MUDDPythia: cross-input and token-shuffle penalties (ΔNLL vs correct, 95% bootstrap CIs)"',
    ),
]
ALLOWED = set(BASELINE_NAME + PUBLISHED)


def _featuregate():
    torch.manual_seed(0)
    model = FeatureGateForCausalLM(FeatureGateConfig.from_sizes(**SIZES, gate_groups=2)).eval()
    with torch.no_grad():  # gates that vary with the input
        for block in model.blocks:
            block.controller.proj.weight.normal_(0, 0.5)
    return model


def _muddpythia():
    config = MUDDPythiaConfig.from_sizes(**SIZES)
    return MUDDPythiaForCausalLM(config).eval()


def _dense():
    return DenseForCausalLM(DenseConfig.from_sizes(**SIZES)).eval()


def _mixtral():
    config = T.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return TransformersControlled(T.AutoModelForCausalLM.from_config(config).eval())


NATIVE = {"dense": _dense, "featuregate": _featuregate, "muddpythia": _muddpythia}


@pytest.fixture(scope="module")
def mixtral():
    return _mixtral()


@pytest.mark.parametrize("make", NATIVE.values(), ids=NATIVE.keys())
def test_native_families_are_controlled_stepping_models(make):
    model = make()
    assert isinstance(model, ControlledModel) and isinstance(model, SteppingModel)
    assert sweep_mode(model) == PREFIX and PrefixCache(model, torch.zeros(1, 4, dtype=torch.long)).stepping
    name, baseline = model.latency_baseline()
    assert name == "dense" and isinstance(baseline, torch.nn.Module)
    assert [len(model.slot_labels(i)) for i in range(len(model.controllers))] == [
        torch.Size(shape).numel() for shape in model.coefficient_slot_shapes
    ]


def test_a_transformers_model_is_a_controlled_stepping_model(mixtral):
    assert isinstance(mixtral, ControlledModel) and isinstance(mixtral, SteppingModel)
    assert sweep_mode(mixtral) == PREFIX and PrefixCache(mixtral, torch.zeros(1, 4, dtype=torch.long)).stepping
    name, baseline = mixtral.latency_baseline()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    assert name == "static_mixture" and isinstance(baseline, torch.nn.Module)
    assert baseline(ids).logits.shape == (2, 5, 64)
    assert mixtral.positive_control(ids) is None and mixtral.block_branches(0) == []


def test_check_inputs_is_one_signature_and_one_check(mixtral):
    ids = torch.zeros(2, 5, dtype=torch.long)
    for model in (_featuregate(), mixtral):
        model.check_inputs(ids)
        good = [torch.zeros(2, 5, *shape) for shape in model.coefficient_slot_shapes]
        model.check_inputs(ids, good)
        with pytest.raises(ValueError, match="coefficients of layer 0 have shape"):
            model.check_inputs(ids, [torch.zeros(2, 4, *good[0].shape[2:]), *good[1:]])
        with pytest.raises(ValueError, match="longer than the model's context"):
            model.check_inputs(torch.zeros(1, model.context_length + 1, dtype=torch.long))


def test_slot_labels_per_family_and_kind(mixtral):
    assert _dense().controllers == []
    featuregate = _featuregate()
    assert featuregate.slot_labels(1) == ["attn g0", "attn g1", "mlp g0", "mlp g1"]
    mudd = _muddpythia()
    assert mudd.slot_labels(0) == [f"{s}←x{j}" for s in "qkvr" for j in range(2)]
    assert mudd.slot_labels(1) == ["out←x0", "out←x1", "out←x2"]  # the last layer mixes for the head only
    assert mixtral.slot_labels(0) == ["expert 0", "expert 1", "expert 2", "expert 3"]
    # readers without the model derive the same names from the arch and the shape
    for model in (featuregate, mudd):
        assert [slot_labels(s, model.arch) for s in model.coefficient_slot_shapes] == [
            model.slot_labels(i) for i in range(len(model.controllers))
        ]
    assert slot_labels((4,), "mixtral", router=True) == mixtral.slot_labels(0)
    assert slot_labels((2, 2), "some_model_type") == ["slot 0,0", "slot 0,1", "slot 1,0", "slot 1,1"]


def test_tables_read_the_recorded_labels_else_derive_them():
    recorded = {"model": {"arch": "x", "slot_labels": [["a", "b"]], "controllers": ["c"]}, "execution": {}}
    assert audit_slot_labels(recorded, 0, (2,)) == ["a", "b"]
    older = {"model": {"arch": "featuregate", "controllers": ["c"]}, "execution": {}}
    assert audit_slot_labels(older, 0, (2, 1)) == ["attn g0", "mlp g0"]
    routed = {"model": {"arch": "x", "controllers": ["r"]}, "execution": {"experts": {"controllers": ["r"]}}}
    assert audit_slot_labels(routed, 0, (3,)) == ["expert 0", "expert 1", "expert 2"]
    assert audit_slot_labels({"model": {"arch": "x"}, "execution": {}}, 0, (2,)) == ["slot 0", "slot 1"]


def test_router_k_comes_from_the_kind(mixtral):
    _, values = mixtral.capture_run(torch.zeros(1, 3, dtype=torch.long))
    assert routing_top_k(values) == [top_k(v) for v in values] == [2, 2]
    assert top_k({"coefficient": values[0]["coefficient"]}) is None  # a static profile routes nowhere by itself


def code_tokens(path: Path):
    """``(line, text)`` of every name and string in ``path`` that is code: comments and docstrings left out."""
    source = path.read_text(encoding="utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add(value.lineno)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in docstrings:
            yield token.start[0], token.string


def test_no_family_name_or_router_key_in_the_core_or_the_ui():
    found = []
    for folder in CORE:
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for line, text in code_tokens(path):
                if (FAMILY_NAMES.search(text) or ROUTER_KEYS.search(text)) and (relative, text) not in ALLOWED:
                    found.append(f"{relative}:{line}: {text}")
    assert not found, (
        "family names or router keys in the core or UI (put them behind a protocol member):\n" + "\n".join(found)
    )


def test_no_module_asks_which_family_a_model_is():
    """A family's facts are declared once (its model file, ``adapters/families.py``, the export's ``FOLDINGS``):
    no ``isinstance`` on a family's classes outside ``models/``."""
    from fca_workbench.models import FAMILIES

    families = {cls.__name__ for pair in FAMILIES.values() for cls in pair}
    found = []
    for path in sorted([*(ROOT / "fca_workbench").rglob("*.py"), *(ROOT / "dashboards").rglob("*.py")]):
        if "models" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in sorted(named & families)]
    assert len(families) >= 6 and not found, found


def test_the_scan_sees_code_and_skips_prose(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Module about FeatureGate."""\n\n# top_k_index here is a comment\nx = "featuregate"\n')
    assert [text for _, text in code_tokens(sample) if FAMILY_NAMES.search(text)] == ['"featuregate"']


def test_slot_names_are_spelled_by_the_families_and_kinds_only():
    spelled = re.compile(r"←x|expert \{|\} g\{")
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for folder in CORE
        for path in sorted(folder.rglob("*.py"))
        for line, text in code_tokens(path)
        if spelled.search(text)
    ]
    assert not found, "slot labels spelled outside models/ and adapters/kinds.py:\n" + "\n".join(found)
