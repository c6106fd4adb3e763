"""The compute-matched router reference: ``random_topk`` gives each window k of a router's E experts, drawn at random
per window and router (seeded), at equal weights summing to the routed mass; ``layer_mean_topk``'s retention is over
it, with the all-expert ``global_mean`` beside it; every retention carries both ends and its reference."""

import pytest
import torch
from transformers import AutoTokenizer

from fca_workbench import load_audit, run_audit
from fca_workbench.adapters import COEFFICIENT
from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.interventions import random_experts, uniform_top_k
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.data.windows import load_windows
from fca_workbench.models import next_token_nll
from fca_workbench.results.conditions import (
    GLOBAL_MEAN,
    LAYER_MEAN_TOPK,
    LAYER_TOKEN_MEAN,
    RANDOM_TOPK,
    condition_named,
)
from fca_workbench.results.report import format_report
from fca_workbench.results.verdicts import staticness_verdict

SETTINGS = dict(window=16, max_windows=6, batch_size=3, resamples=200, latency_repeats=1, seed=2)


def test_random_topk_draws_k_experts_uniformly_per_window_and_router_at_equal_weights():
    mean = [torch.tensor([0.5, 0.3, 0.15, 0.05]), torch.tensor([0.7])]  # a router of 4 (k = 2); a one-slot gate
    template = uniform_top_k(mean, [2, None])
    assert torch.equal(template[0], torch.tensor([0.5, 0.5, 0.0, 0.0])) and template[1] is mean[1]
    drawn = random_experts(template, [torch.tensor(2), torch.tensor(0)], torch.arange(3000), 5, seed=1)
    router, gate = drawn
    assert router.shape == (3000, 5, 4) and torch.equal(gate, torch.full((3000, 5, 1), 0.7))
    assert torch.equal(router, router[:, :1].expand_as(router))  # the same experts at every position of a window
    chosen = router[:, 0] > 0
    assert (chosen.sum(-1) == 2).all() and torch.equal(router[:, 0][chosen], torch.full((6000,), 0.5))
    code = (chosen.long() * torch.tensor([1, 2, 4, 8])).sum(-1)  # each pair of experts as one number
    counts = torch.bincount(code, minlength=16)[[3, 5, 6, 9, 10, 12]].double()  # the six pairs of 4
    assert counts.sum() == 3000
    chi2 = ((counts - 500) ** 2 / 500).sum().item()
    assert chi2 < 20.5  # 5 degrees of freedom: p ≈ 0.001 above this
    again = random_experts(template, [torch.tensor(2), torch.tensor(0)], torch.arange(3000)[7:9], 5, seed=1)
    assert torch.equal(again[0], router[7:9])  # a window's draw does not depend on its batch


def test_random_topk_is_a_routers_only_static_reference():
    condition = condition_named(RANDOM_TOPK)
    assert condition.routers_only and condition.static and not condition.retention
    assert condition_named(LAYER_MEAN_TOPK).reference == RANDOM_TOPK


@pytest.fixture(scope="module")
def routed(tiny_mixtral, tmp_path_factory):
    out = tmp_path_factory.mktemp("routed") / "audit"
    settings = AuditSettings(checkpoint=str(tiny_mixtral), cache=str(out.parent / "cache"), **SETTINGS)
    return settings, out, run_audit(settings, out)


def test_the_audit_replays_random_topk_as_a_hand_built_gate(routed):
    settings, _, audit = routed
    folder = settings.checkpoint
    session = ReplaySession.open(settings, read_now=())
    data = audit["data"]["eval"]
    windows = load_windows(data["source"], AutoTokenizer.from_pretrained(folder), data["window"], data["windows"])
    drawn = session.values(RANDOM_TOPK, torch.arange(len(windows)))
    layer_mean = session.profiles["layer_mean"]
    gates = []
    for layer, value in enumerate(drawn):
        chosen = value[COEFFICIENT][:, 0] > 0  # [B, E]: the experts each window got
        assert (chosen.sum(-1) == 2).all()
        gate = chosen.double() * (layer_mean[layer].double().sum() / 2)  # k of E at half the mean routed mass
        gates.append({COEFFICIENT: gate.float().unsqueeze(1).expand(-1, windows.shape[1], -1).contiguous()})
    assert len({tuple(g[COEFFICIENT][:, 0].nonzero()[:, 1].tolist()) for g in gates}) == 2  # draws differ by layer
    controlled = load_controlled(folder)
    with torch.no_grad():
        nll = next_token_nll(controlled.replay_run(windows, gates), windows).double().mean(dim=1).mean().item()
    assert audit["conditions"][RANDOM_TOPK]["nll"] == pytest.approx(nll, abs=1e-5, rel=0)


def test_every_retention_has_both_ends_and_its_reference(routed):
    _, out, audit = routed
    per_token = load_audit(out).per_token
    window = per_token.groupby(["condition", "window"], observed=True)["nll"].mean().unstack("window")
    mean = window.mean(axis=1)
    for profile, retention in audit["retention"].items():
        reference = RANDOM_TOPK if profile in (LAYER_MEAN_TOPK, LAYER_TOKEN_MEAN) else GLOBAL_MEAN
        assert retention["reference"] == reference
        gap = mean[reference] - mean["correct"]
        assert retention["denominator"]["value"] == pytest.approx(gap, abs=1e-6)
        assert retention["numerator"]["value"] == pytest.approx(mean[reference] - mean[profile], abs=1e-6)
        lo, hi = retention["denominator"]["ci95"]
        assert retention["resolved"] == (lo > 0 or hi < 0)
        if retention["resolved"]:
            assert retention["value"] == pytest.approx((mean[reference] - mean[profile]) / gap, rel=1e-5)
        else:
            assert retention["value"] is None and retention["ci95"] == [None, None]
    beside = audit["retention"][LAYER_MEAN_TOPK]["other_references"][GLOBAL_MEAN]
    assert beside["reference"] == GLOBAL_MEAN
    assert beside["denominator"]["value"] == pytest.approx(mean[GLOBAL_MEAN] - mean["correct"], abs=1e-6)
    report = format_report(audit)
    assert RANDOM_TOPK in report
    assert staticness_verdict(audit).count(RANDOM_TOPK) >= 1
