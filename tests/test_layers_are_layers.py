"""A layer is a decoder layer: on a tiny Qwen2-MoE, whose every block holds two controllers (``mlp.gate`` and
``mlp.shared_expert_gate``), the per-layer sweep's row of decoder layer L intervenes on both of L's controllers
(others correct), each controller alone has rows named by its module path, and tables, heatmap and menus say
layer with decoder indices and name controllers by path."""

import pytest
import torch
import zoo

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.sites import chosen_controllers, controller_labels, site_choices
from fca_workbench.audit.assignment import ConditionCoefficients, placed
from fca_workbench.audit.capture import capture
from fca_workbench.audit.interventions import static_profiles
from fca_workbench.audit.metrics import bootstrap_counts
from fca_workbench.audit.sweep import full_forward_window_nll, per_layer_rows, per_layer_sweep
from fca_workbench.models import next_token_nll
from fca_workbench.results.audit_tables import per_controller_table, per_layer_table
from fca_workbench.results.report import per_controller_lines
from fca_workbench.results.verdicts import per_layer_sentence

SWEPT = ["cross_input", "token_shuffle", "layer_mean"]
GATES = ["model.layers.{}.mlp.gate", "model.layers.{}.mlp.shared_expert_gate"]


def random_windows(count, seed):
    return torch.randint(1, zoo.VOCAB, (count, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("layers")
    model = TransformersControlled(zoo.build("qwen2_moe"))
    windows = random_windows(5, seed=1)
    cache = capture(model, windows, root / "eval", batch_size=3)
    profiles = static_profiles(capture(model, random_windows(4, seed=2), root / "calib", batch_size=4).batches())
    rows = per_layer_sweep(model, windows, cache, SWEPT, profiles, 0, bootstrap_counts(len(windows), 200, seed=0))
    return model, windows, cache, profiles, rows


def frozen_replay(model, windows, cache, profiles, condition, intervened):
    """Mean NLL of the full frozen forwards with ``condition``'s values at the controllers named in
    ``intervened`` (module paths) and every other controller's own cached values, computed here by hand."""
    assign = ConditionCoefficients(condition, cache, profiles, 0)
    chosen = {model.controller_names.index(name) for name in intervened}
    total = []
    for indices in cache.shard_indices():
        own, theirs = cache.values(indices), assign.values(indices)
        values = [theirs[i] if i in chosen else own[i] for i in range(len(own))]
        with torch.no_grad():
            logits = model.replay_run(windows[indices], placed(model, values, "cpu"))
        total.append(next_token_nll(logits, windows[indices]).double())
    return torch.cat(total).mean().item()


def test_the_model_holds_two_controllers_per_decoder_layer(swept):
    model = swept[0]
    assert model.controller_names == [gate.format(layer) for layer in (0, 1) for gate in GATES]
    assert model.controller_layers == [0, 0, 1, 1] and len(model.blocks) == 2


def test_a_layers_row_equals_the_frozen_replay_of_all_its_controllers(swept):
    model, windows, cache, profiles, rows = swept
    per_layer = rows["per_layer"]
    assert [(r["layer"], r["condition"]) for r in per_layer] == [(l, c) for l in (0, 1) for c in SWEPT]
    for row in per_layer:
        names = [gate.format(row["layer"]) for gate in GATES]
        assert row["controllers"] == names
        full = frozen_replay(model, windows, cache, profiles, row["condition"], names)
        assert abs(row["nll"] - full) <= 1e-6, row
    correct = frozen_replay(model, windows, cache, profiles, "correct", [])
    assert all(abs(r["delta"] - (r["nll"] - correct)) <= 1e-6 for r in per_layer)
    assert any(abs(r["delta"]) > 1e-4 for r in per_layer)  # the interventions really change something (a random model)


def test_a_controllers_row_equals_the_frozen_replay_of_it_alone(swept):
    model, windows, cache, profiles, rows = swept
    alone = rows["per_controller"]
    assert [(r["controller"], r["layer"], r["condition"]) for r in alone] == [
        (gate.format(l), l, c) for l in (0, 1) for gate in GATES for c in SWEPT
    ]
    for row in alone:
        full = frozen_replay(model, windows, cache, profiles, row["condition"], [row["controller"]])
        assert abs(row["nll"] - full) <= 1e-6, row
    # a layer's two controllers together are not either of them alone
    by_layer = {(r["layer"], r["condition"]): r["nll"] for r in rows["per_layer"]}
    assert any(abs(by_layer[(r["layer"], r["condition"])] - r["nll"]) > 1e-5 for r in alone)


def test_prefix_reuse_and_full_forwards_give_the_same_rows(swept):
    model, windows, cache, profiles, rows = swept
    counts = bootstrap_counts(len(windows), 200, seed=0)
    full = per_layer_rows(
        *full_forward_window_nll(model, windows, cache, SWEPT, profiles, 0, "cpu"), counts, model.controller_names
    )
    for key in ("per_layer", "per_controller"):
        assert len(full[key]) == len(rows[key])
        for a, b in zip(rows[key], full[key]):
            assert {k: v for k, v in a.items() if k not in ("nll", "delta", "delta_ci95")} == {
                k: v for k, v in b.items() if k not in ("nll", "delta", "delta_ci95")
            }
            assert abs(a["nll"] - b["nll"]) <= 1e-6 and abs(a["delta"] - b["delta"]) <= 1e-6


def audit_of(model, rows):
    return {
        "model": {
            "path": "qwen2-moe-tiny",
            "arch": "qwen2_moe",
            "controllers": model.controller_names,
            "controller_layers": model.controller_layers,
        },
        "settings": {},
        **rows,
    }


def test_tables_report_and_verdict_say_layer_for_decoder_layers_and_name_controllers(swept):
    model, _, _, _, rows = swept
    audit = audit_of(model, rows)
    layers = per_layer_table([audit])
    assert sorted(set(layers["layer"])) == [0, 1]  # decoder layers, not controllers 0..3
    assert set(layers["controllers"]) == {", ".join(gate.format(l) for gate in GATES) for l in (0, 1)}
    alone = per_controller_table([audit])
    assert set(alone["controller"]) == {gate.format(l) for l in (0, 1) for gate in GATES}
    sentence = per_layer_sentence(audit)
    assert "Per decoder layer" in sentence and "layer 2" not in sentence and "layer 3" not in sentence
    assert any(gate.format(l) in sentence for l in (0, 1) for gate in GATES)
    lines = per_controller_lines(audit["per_controller"])
    assert lines[1] == "ΔNLL with the condition at one controller only (layers of several controllers):"
    assert [line.split(":")[0].strip() for line in lines[2:]] == [gate.format(l) for l in (0, 1) for gate in GATES]


def test_menus_and_axes_offer_a_layer_or_one_controller(swept):
    model = swept[0]
    names, layers = model.controller_names, model.controller_layers
    choices = site_choices(names, layers)
    assert list(choices.items())[:2] == [("layer 0", 0), ("layer 1", 1)]
    assert choices[f"{GATES[1].format(0)} alone"] == GATES[1].format(0)
    assert chosen_controllers(1, names, layers) == [2, 3]
    assert chosen_controllers(GATES[1].format(1), names, layers) == [3]
    with pytest.raises(ValueError, match="holds no controller"):
        chosen_controllers(2, names, layers)
    assert controller_labels(names, layers) == names  # no row of a coefficient figure is called "layer 3"
    assert controller_labels(["h.0.gate", "h.1.gate"], [0, 1]) == ["layer 0", "layer 1"]


def test_the_dashboard_heatmaps_say_layer_and_name_controllers(swept):
    views = pytest.importorskip("dashboards.views")
    model, _, _, _, rows = swept
    audit = audit_of(model, rows)
    layer_axis = views.per_layer_heatmap(per_layer_table([audit]), "t")["data"][0]["y"]
    assert layer_axis == ["layer 0", "layer 1"]
    controller_axis = views.per_layer_heatmap(per_controller_table([audit]), "t")["data"][0]["y"]
    assert sorted(controller_axis) == sorted(gate.format(l) for l in (0, 1) for gate in GATES)
