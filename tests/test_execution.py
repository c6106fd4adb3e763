"""Execution audit: counts, the positive control, hook hygiene and the audit.json section."""

import pytest
import torch

from fca_workbench.audit.execution import count_execution, count_flops, execution_audit, measure_latency
from fca_workbench.models import DenseConfig, DenseForCausalLM, FeatureGateConfig, FeatureGateForCausalLM
from fca_workbench.models.dense import shape_matched_dense
from fca_workbench.models.featuregate import positive_control

SIZES = dict(vocab_size=64, layers=2, width=32, heads=4, window=16)
N_WINDOWS, BATCH = 6, 4  # two forwards: 4 + 2 windows


def _windows(n=N_WINDOWS, seed=0):
    return torch.randint(0, SIZES["vocab_size"], (n, SIZES["window"]), generator=torch.Generator().manual_seed(seed))


def _dense():
    torch.manual_seed(0)
    return DenseForCausalLM(DenseConfig.from_sizes(**SIZES)).eval()


def _featuregate():
    """A FeatureGate whose gates vary: controllers start at zero (all gates 1), so randomise them."""
    torch.manual_seed(0)
    model = FeatureGateForCausalLM(FeatureGateConfig.from_sizes(**SIZES)).eval()
    for block in model.blocks:
        torch.nn.init.normal_(block.controller.proj.weight, std=1.0)
    return model


@pytest.fixture(scope="module")
def featuregate():
    return _featuregate()


@pytest.fixture(scope="module")
def control(featuregate):
    return positive_control(featuregate, _windows(seed=1), quantile=0.5)


def _all_hooks(model):
    return [h for m in model.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())]


@pytest.mark.parametrize("make, controllers_per_forward", [(_dense, 0), (_featuregate, SIZES["layers"])])
def test_unmodified_models_execute_everything(make, controllers_per_forward):
    model = make()
    counts = count_execution(model, _windows(), batch_size=BATCH)
    forwards = 2
    assert counts["blocks_total"] == SIZES["layers"] * forwards
    assert counts["blocks_executed"] == counts["blocks_total"]
    assert counts["controller_calls"] == controllers_per_forward * forwards
    assert counts["branch_tokens_total"] == 2 * SIZES["layers"] * N_WINDOWS * SIZES["window"]
    assert counts["branch_tokens_executed"] == counts["branch_tokens_total"]
    assert counts["fraction_executed"] == 1.0


def test_native_blocks_declare_their_branches():
    model = _dense()
    assert model.block_branches(0) == [model.blocks[0].attn, model.blocks[0].mlp]


def test_positive_control_skips_about_the_quantile(featuregate, control):
    assert control is not featuregate and featuregate.config.skip_threshold is None
    threshold = control.config.skip_threshold
    assert threshold is not None and all(block.config.skip_threshold == threshold for block in control.blocks)

    counts = count_execution(control, _windows(), batch_size=BATCH)
    assert 0.0 < counts["fraction_executed"] < 1.0
    assert counts["blocks_executed"] == counts["blocks_total"]  # it skips rows, not blocks
    # attention always runs (half the branch rows); about half of the MLP rows are skipped
    mlp_fraction = 2 * counts["fraction_executed"] - 1
    assert 0.2 < mlp_fraction < 0.8


def test_positive_control_saves_flops_and_changes_logits(featuregate, control):
    batch = _windows()
    assert count_flops(control, batch) < count_flops(featuregate, batch)
    with torch.no_grad():
        base, skipped = featuregate(batch).logits, control(batch).logits
    assert not torch.allclose(base, skipped)


def test_zero_threshold_reproduces_the_base_exactly(featuregate):
    zero = positive_control(featuregate, _windows(seed=1))
    zero.config.skip_threshold = 0.0  # gates lie in (0, 2): every row is kept, through the gather/scatter path
    batch = _windows()
    with torch.no_grad():
        assert torch.equal(zero(batch).logits, featuregate(batch).logits)
    assert count_execution(zero, batch, batch_size=BATCH)["fraction_executed"] == 1.0


def test_only_featuregate_has_a_positive_control(featuregate):
    assert _dense().positive_control(_windows()) is None
    control = featuregate.positive_control(_windows(seed=1))
    assert control.model is not featuregate
    assert (
        control.settings == {"skip_threshold": control.model.config.skip_threshold}
        and control.settings["skip_threshold"]
    )


def test_shape_matched_dense_copies_the_shapes(featuregate):
    dense = shape_matched_dense(featuregate)
    assert isinstance(dense, DenseForCausalLM)
    for field in ("vocab_size", "n_layer", "n_embd", "n_head", "block_size", "mlp_ratio"):
        assert getattr(dense.config, field) == getattr(featuregate.config, field)


def test_shape_matched_dense_of_muddpythia_and_its_branches_are_counted(windows):
    from conftest import tiny_model

    mudd = tiny_model("muddpythia")
    dense = shape_matched_dense(mudd)
    assert (dense.config.n_layer, dense.config.n_embd, dense.config.n_head) == (
        mudd.config.n_layer,
        mudd.config.dim,
        mudd.config.n_head,
    )
    counts = count_execution(mudd, windows, batch_size=3)
    assert counts["branch_tokens_total"] == windows.numel() * 2 * mudd.config.n_layer
    assert counts["fraction_executed"] == 1.0
    assert counts["controller_calls"] == 2 * mudd.config.n_layer


def test_execution_audit_section_and_hook_hygiene(control):
    audit = execution_audit(control, _windows(), batch_size=BATCH, repeats=2)
    design_keys = {
        "blocks_total",
        "blocks_executed",
        "fraction_executed",
        "controller_calls",
        "flops",
        "latency_ms",
        "dense_latency_ms",
        "latency_ratio_vs_dense",
    }
    assert set(audit) == design_keys | {"branch_tokens_total", "branch_tokens_executed", "baseline", "baseline_flops"}
    assert audit["baseline"] == "dense" and audit["baseline_flops"] > 0
    for key in (
        "blocks_total",
        "blocks_executed",
        "controller_calls",
        "flops",
        "branch_tokens_total",
        "branch_tokens_executed",
    ):
        assert isinstance(audit[key], int) and audit[key] >= 0, key
    for key in ("fraction_executed", "latency_ms", "dense_latency_ms", "latency_ratio_vs_dense"):
        assert isinstance(audit[key], float) and audit[key] > 0, key
    assert audit["latency_ratio_vs_dense"] == pytest.approx(audit["latency_ms"] / audit["dense_latency_ms"])
    assert audit["controller_calls"] == SIZES["layers"] * 2
    assert _all_hooks(control) == []


def test_hooks_are_removed_even_when_the_forward_fails(featuregate):
    too_long = torch.zeros(1, SIZES["window"] + 1, dtype=torch.long)
    with pytest.raises(ValueError):
        count_execution(featuregate, too_long)
    assert _all_hooks(featuregate) == []


def test_measure_latency_is_positive():
    assert measure_latency(_dense(), _windows(2), repeats=2, warmup=1) > 0
