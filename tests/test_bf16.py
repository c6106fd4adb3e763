"""bfloat16 as the real checkpoints are: under ``dtype="bfloat16"`` the ``correct`` replay is bit-exact against the
live run for every family (native and foreign: FeatureGate, MUDDPythia, Dense, Mixtral, OLMoE, Mamba2): ΔNLL
exactly 0, the per-token NLLs equal, and both equal to a live forward computed here; ``audit.json`` records the
dtype and the report heads every NLL with it."""

import json

import pandas as pd
import pytest
import torch
import transformers as T
import zoo

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.assignment import calibration_profiles
from fca_workbench.audit.capture import MANIFEST, capture
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.models import next_token_nll
from fca_workbench.results.audit_tables import assignment_table, per_layer_table
from fca_workbench.results.layout import split_cache
from fca_workbench.results.report import format_report

pytest.importorskip("pyarrow")  # the per-token Parquet file holds the float32 NLLs exactly

NATIVE = ("featuregate", "muddpythia", "dense")
FOREIGN = ("mixtral", "olmoe", "mamba2")
BATCH = 2
MAMBA2 = dict(state_size=8, expand=2, num_heads=8, head_dim=16, n_groups=1, chunk_size=16)


@pytest.fixture(scope="module")
def foreign(tmp_path_factory, tokenizer):
    """Tiny foreign models of the zoo (two router families, a selective SSM), saved as their checkpoints are."""
    root = tmp_path_factory.mktemp("foreign")
    torch.manual_seed(0)
    mamba2 = T.Mamba2ForCausalLM(
        T.Mamba2Config(
            vocab_size=zoo.VOCAB, hidden_size=64, num_hidden_layers=2, bos_token_id=0, eos_token_id=0, **MAMBA2
        )
    )
    models = {"mixtral": zoo.build("mixtral"), "olmoe": zoo.build("olmoe"), "mamba2": mamba2.eval()}
    return {name: zoo.save(model, root / name, tokenizer) for name, model in models.items()}


@pytest.fixture(params=[*NATIVE, *FOREIGN])
def family(request, tiny_checkpoints, foreign):
    return request.param, tiny_checkpoints.get(request.param) or foreign[request.param]


def test_bfloat16_replays_correct_bit_exactly_for_every_family(family, tmp_path):
    name, folder = family
    settings = AuditSettings(
        checkpoint=str(folder),
        dtype="bfloat16",
        window=32,
        max_windows=4,
        batch_size=BATCH,
        latency_repeats=1,
        resamples=20,
        per_layer=name in ("featuregate", "muddpythia"),  # prefix reuse replays exactly too
    )
    audit = run_audit(settings, tmp_path / "out")
    assert audit["settings"]["dtype"] == "bfloat16"
    manifest = json.loads((split_cache(None, tmp_path / "out", "eval") / MANIFEST).read_text())
    assert manifest["dtype"] == "bfloat16"  # the weights the capture ran were bfloat16
    tokens = pd.read_parquet(tmp_path / "out" / "per_token_nll.parquet")

    session = ReplaySession.open(settings)
    model, windows = session.model, session.windows("eval")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():  # the live run, batched as capture batches it
        live = torch.cat([next_token_nll(model(batch).logits, batch) for batch in windows.split(BATCH)])
    assert torch.equal(torch.tensor(tokens["unperturbed"].to_numpy()), live.flatten())
    if name == "dense":
        assert "correct" not in audit["conditions"]
    else:
        assert audit["replay_check"]["max_abs_difference"] == 0.0 and audit["replay_check"]["tolerance"] == 0.0
        assert audit["conditions"]["correct"]["delta"] == 0.0
        assert audit["conditions"]["correct"]["nll"] == audit["conditions"]["unperturbed"]["nll"]
        assert (tokens["correct"] == tokens["unperturbed"]).all()
    report = format_report(audit)
    assert "NLL (bfloat16)" in report.splitlines()[3]


def test_every_printed_nll_is_headed_with_its_dtype(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    base = dict(checkpoint=str(folder), window=32, max_windows=2, batch_size=2, latency_repeats=1, resamples=10)
    audits = [
        run_audit(AuditSettings(**base, dtype=dtype, per_layer=True), tmp_path / dtype)
        for dtype in ("float32", "bfloat16")
    ]
    assert "NLL (float32)" in format_report(audits[0]) and "NLL (bfloat16)" in format_report(audits[1])
    assert load_controlled(folder, torch.bfloat16).dtype == torch.bfloat16
    for table in (assignment_table, per_layer_table):
        assert [c.header for c in table(audits[1:]).attrs["columns"] if c.key == "nll"] == ["NLL (bfloat16)"]
        assert [c.header for c in table(audits).attrs["columns"] if c.key == "nll"] == ["NLL (bfloat16, float32)"]


@pytest.mark.parametrize("name", ["featuregate", "mixtral"])
def test_a_static_profile_equal_to_the_live_coefficients_replays_exactly_in_bfloat16(
    name, tiny_checkpoints, foreign, tmp_path
):
    """One window is its own calibration set, so its ``layer_position_mean`` profile is its live coefficients; cast
    to the dtype each controller gives them in (a Mixtral router's gate is float32 in a bfloat16 model), the
    replay is the live run exactly."""
    model = load_controlled(tiny_checkpoints.get(name) or foreign[name], torch.bfloat16)
    window = torch.randint(0, zoo.VOCAB, (1, 32), generator=torch.Generator().manual_seed(3))
    cache = capture(model, window, tmp_path / "cache", batch_size=1)
    profiles = calibration_profiles(cache, window)
    replayed = replay_nll(model, window, cache, "layer_position_mean", profiles)
    assert torch.equal(replayed, cache.nll([0]))
