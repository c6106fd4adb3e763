"""``causal_shuffle``: each position gets the coefficients of a seeded random position at or before it in the same
window, so a causal model never sees coefficients computed from later tokens; the audit replays it like
``token_shuffle`` and its NLL is the frozen model's under coefficients gathered by hand."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from fca_workbench import run_audit
from fca_workbench.audit.assignment import WindowAssignment, assigned_values
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.data.windows import load_windows
from fca_workbench.models import load_model
from fca_workbench.results.conditions import CAUSAL_SHUFFLE, HEADLINE_CONDITIONS, condition_named
from fca_workbench.results.report import format_report

SETTINGS = dict(window=16, max_windows=4, batch_size=2, resamples=50, latency_repeats=1, seed=3)


def position_codes(batch: int, length: int) -> list[dict[str, torch.Tensor]]:
    """One controller whose coefficient at position t is t (two slots, both t): what moved where reads off it."""
    positions = torch.arange(length, dtype=torch.float32).view(1, length, 1).expand(batch, length, 2)
    return [{"coefficient": positions.clone()}]


def sources(windows: torch.Tensor, length: int, seed: int) -> torch.Tensor:
    """``[B, T]``: the position whose coefficients each position gets under ``causal_shuffle``."""
    own = position_codes(len(windows), length)
    values = assigned_values(CAUSAL_SHUFFLE, own, None, None, [(2,)], windows, seed)
    return values[0]["coefficient"][..., 0].long()


def test_causal_shuffle_is_a_seeded_headline_reassignment():
    condition = condition_named(CAUSAL_SHUFFLE)
    assert condition.seeded and condition.built_in and not condition.static and not condition.uses_donor
    assert CAUSAL_SHUFFLE in HEADLINE_CONDITIONS


def test_each_position_gets_a_position_at_or_before_it():
    length = 32
    drawn = sources(torch.arange(200), length, seed=7)
    t = torch.arange(length)
    assert (drawn <= t).all() and (drawn >= 0).all()
    assert (drawn[:, 0] == 0).all()  # the first position has only itself
    assert (drawn < t).any()  # it moves something
    # uniform over 0..t: at t = 31 each of the 32 sources has 1/32; 200 windows give about 6 each
    counts = torch.bincount(drawn[:, -1], minlength=length).double()
    expected = len(drawn) / length
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 70  # 31 degrees of freedom: p < 1e-4 above this
    mean_t = drawn.double().mean(0)  # E[source] = t / 2, sd of the mean at most 31 / sqrt(12 * 200) < 0.65
    assert ((mean_t - t.double() / 2).abs() < 4 * 0.65).all()


def test_a_window_gets_the_same_positions_however_it_is_batched_and_the_seed_changes_them():
    length = 16
    alone = torch.cat([sources(torch.tensor([w]), length, seed=1) for w in range(4)])
    assert torch.equal(alone, sources(torch.arange(4), length, seed=1))
    assert not torch.equal(alone, sources(torch.arange(4), length, seed=2))


def test_every_output_of_a_controller_moves_with_its_coefficient():
    own = position_codes(3, 10)
    own[0]["top_k_index"] = own[0]["coefficient"].long() + 100
    assignment = WindowAssignment(CAUSAL_SHUFFLE, own, torch.arange(3), 0, [(2,)], 10)
    moved = assignment.shuffled(causal=True)[0]
    assert torch.equal(moved["top_k_index"] - 100, moved["coefficient"].long())


def test_the_audit_replays_causal_shuffle_as_a_hand_built_frozen_model(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    audit = run_audit(AuditSettings(checkpoint=str(folder), **SETTINGS), tmp_path / "audit")
    assert audit is not None and CAUSAL_SHUFFLE in audit["conditions"]
    assert "causal_shuffle" in format_report(audit)
    model = load_model(folder).eval()
    data = audit["data"]["eval"]
    windows = load_windows(data["source"], AutoTokenizer.from_pretrained(folder), data["window"], data["windows"])
    length = windows.shape[1]
    drawn = sources(torch.arange(len(windows)), length, seed=SETTINGS["seed"])
    with torch.no_grad():
        own = model(windows, return_coefficients=True).coefficients
        moved = [torch.stack([c[w, drawn[w]] for w in range(len(windows))]) for c in own]
        logits = model(windows, coefficients=moved).logits
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), windows[:, 1:], reduction="none")
    expected = nll.double().mean(dim=1).mean().item()
    assert audit["conditions"][CAUSAL_SHUFFLE]["nll"] == pytest.approx(expected, abs=1e-5, rel=0)
    assert audit["conditions"][CAUSAL_SHUFFLE]["nll"] != pytest.approx(audit["conditions"]["correct"]["nll"], abs=1e-4)
