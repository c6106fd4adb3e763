"""One frozen-replay engine: the full replay, the per-layer sweep and the dashboard's one-text replay give the same
figures, also where placement matters: a bfloat16 model (a router's float32 gate in it) and a model placed by
big-model inference with its weights offloaded to disk."""

import pytest
import torch

from fca_workbench.adapters.placement import is_placed
from fca_workbench.adapters.sites import sites
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.audit.text_replay import Text, TextReplays

BASE = dict(window=32, max_windows=4, batch_size=2, latency_repeats=1, resamples=20)


@pytest.fixture(params=["featuregate-bf16", "mixtral-bf16", "mixtral-offloaded"])
def session(request, tiny_checkpoints, tiny_mixtral, tmp_path):
    name, how = request.param.split("-")
    checkpoint = tiny_mixtral if name == "mixtral" else tiny_checkpoints[name]
    placing = {"dtype": "bfloat16"}
    if how == "offloaded":
        placing = {"device_map": "auto", "max_memory": "cpu=200KB", "offload_folder": str(tmp_path / "offload")}
        (tmp_path / "offload").mkdir()
    settings = AuditSettings(str(checkpoint), **BASE, **placing)
    opened = ReplaySession.open(settings, tmp_path / "out")
    assert (how == "offloaded") == is_placed(opened.model)
    return opened


def test_the_sweep_and_the_one_text_replay_equal_the_full_replay(session):
    windows = session.windows("eval")
    conditions = [c for c in session.conditions if c not in ("unperturbed", "correct")]
    swept, _ = session.sweep(conditions)
    replays = TextReplays(max_windows=len(windows) * 2, max_bytes=2**30)
    texts = [Text(windows[i : i + 1], i) for i in range(len(windows))]
    tolerance = 1e-6 if session.settings.dtype == "float32" else 2e-2  # bfloat16 rounding of a batch of one
    for site in sites(session.model.controller_layers):
        for condition in conditions:
            full = session.nll(condition, site.controllers).double().mean(dim=1)
            torch.testing.assert_close(swept[(site, condition)], full, rtol=0, atol=1e-6)
            one = torch.stack(
                [
                    replays.nll(session, text, condition, site.controllers, session.seed, texts[session.donor_of(i)])
                    for i, text in enumerate(texts)
                ]
            )
            torch.testing.assert_close(one.double().mean(dim=1), full, rtol=0, atol=tolerance)
