"""Token identity: ``layer_token_mean`` (the calibration's per-token mean, shrunk toward ``layer_mean``; a router's top
k of it) and ``same_token`` (each position the values another window computed at the same token id).

The known answer: a mixture of experts routed by a fixed function of the token id (hash routing, no learned router)
is static by design, so ``same_token`` costs nothing and ``layer_token_mean`` keeps all of its gap; the same model
with a learned router that reads the context, trained on text whose continuation depends on it, loses under both.
"""

import tempfile
from pathlib import Path

import pytest
import torch
import transformers as T

from fca_workbench.adapters import COEFFICIENT
from fca_workbench.adapters.controlled import controlled_view
from fca_workbench.audit.assignment import static_values
from fca_workbench.audit.inputs import CALIBRATION, EVAL
from fca_workbench.audit.interventions import layer_mean_topk
from fca_workbench.audit.lexical import (
    PRIOR_WEIGHT,
    TOKEN_IDS,
    TokenSums,
    kept_own,
    look_up,
    same_token_donors,
    shrunk_means,
)
from fca_workbench.audit.metrics import bootstrap_counts
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.text_replay import Text, TextReplays
from fca_workbench.export.request import check_request
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import (
    CROSS_INPUT,
    LAYER_MEAN,
    LAYER_TOKEN_MEAN,
    RANDOM_TOPK,
    SAME_TOKEN,
    condition_named,
)

VOCAB, EXPERTS, HIDDEN, WINDOW = 48, 4, 32, 32


def test_the_shrinkage_is_the_prior_weighted_mean_of_the_token_and_layer_means():
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, (3, 7), generator=generator)
    tokens[0, 0] = 9  # one token seen once
    coefficients = [torch.randn(3, 7, 2, 3, generator=generator), torch.randn(3, 7, 4, generator=generator)]
    ids = torch.unique(tokens)
    sums = TokenSums(ids)
    sums.add(tokens, coefficients)
    layer_mean = [c.mean(dim=(0, 1)) for c in coefficients]
    table = shrunk_means(*sums.totals(lambda t: t), layer_mean)
    for layer, c in enumerate(coefficients):
        for row, token in enumerate(ids.tolist()):
            at = c[tokens == token].double()
            n = len(at)
            expected = (n * at.mean(0) + PRIOR_WEIGHT * layer_mean[layer].double()) / (n + PRIOR_WEIGHT)
            assert torch.allclose(table[layer][row].double(), expected, atol=1e-6)
        assert torch.equal(table[layer][-1], layer_mean[layer].float())  # a token never seen: the layer mean


def test_a_token_is_looked_up_in_its_row_and_an_unseen_one_gets_the_last():
    table = [torch.tensor([[1.0], [2.0], [3.0], [-1.0]])]  # rows of tokens 4, 7, 9, then unseen
    found = look_up(table, [torch.tensor([4, 7, 9])], torch.tensor([[9, 4, 5, 7, 100]]))
    assert found[0].squeeze(-1).tolist() == [[3.0, 1.0, -1.0, 2.0, -1.0]]


def test_a_routers_per_token_profile_is_the_top_k_of_each_tokens_mean():
    tokens = torch.tensor([[0, 1, 0, 1]])
    gate = torch.tensor([[[0.7, 0.3, 0.0], [0.0, 0.4, 0.6], [0.5, 0.5, 0.0], [0.0, 0.2, 0.8]]])
    sums = TokenSums(torch.tensor([0, 1]))
    sums.add(tokens, [gate])
    means = shrunk_means(*sums.totals(lambda t: t), [gate.mean(dim=(0, 1))])
    cut = layer_mean_topk(means, [1])[0]
    for row in range(3):
        expected = torch.zeros(3)
        expected[means[0][row].argmax()] = means[0][row].sum()
        assert torch.allclose(cut[row], expected)


def reference_donors(tokens: torch.Tensor) -> dict[tuple[int, int], set[tuple[int, int]]]:
    """Per (window, position), every position of another window holding its token."""
    where: dict[int, list[tuple[int, int]]] = {}
    for w, t in torch.cartesian_prod(torch.arange(tokens.shape[0]), torch.arange(tokens.shape[1])).tolist():
        where.setdefault(int(tokens[w, t]), []).append((w, t))
    return {
        (w, t): {(v, s) for v, s in where[int(tokens[w, t])] if v != w}
        for w, t in torch.cartesian_prod(torch.arange(tokens.shape[0]), torch.arange(tokens.shape[1])).tolist()
    }


def test_same_token_donors_hold_the_same_token_in_another_window_and_singletons_keep_their_own():
    tokens = torch.randint(12, (6, 20), generator=torch.Generator().manual_seed(3))
    tokens[2, 5] = 40  # in no other window: kept
    tokens[4, 1] = tokens[4, 9] = 41  # twice, but in one window only: kept
    windows = torch.arange(6)
    donor_window, donor_position = same_token_donors(tokens, windows, tokens, seed=1)
    allowed = reference_donors(tokens)
    kept = 0
    for w in range(6):
        for t in range(20):
            donor = (int(donor_window[w, t]), int(donor_position[w, t]))
            if allowed[(w, t)]:
                assert donor in allowed[(w, t)]
                assert tokens[donor] == tokens[w, t] and donor[0] != w
            else:
                assert donor == (w, t)
                kept += 1
    assert kept >= 3 and kept_own(tokens, seed=1) == kept
    part = same_token_donors(tokens[3:5], windows[3:5], tokens, seed=1)  # a window's donors: not its batch's
    assert torch.equal(part[0], donor_window[3:5]) and torch.equal(part[1], donor_position[3:5])
    other = same_token_donors(tokens, windows, tokens, seed=2)
    assert not torch.equal(other[0], donor_window)  # seeded


def test_same_token_draws_every_candidate():
    tokens = torch.zeros(4, 3, dtype=torch.long)  # one token everywhere: 9 candidates per position
    donors = [same_token_donors(tokens, torch.arange(4), tokens, seed)[0][0, 0].item() for seed in range(200)]
    assert set(donors) == {1, 2, 3}


def test_a_text_outside_the_eval_set_draws_from_every_window():
    pool = torch.tensor([[1, 2, 3], [3, 2, 1]])
    donor_window, donor_position = same_token_donors(torch.tensor([[2, 7]]), torch.tensor([-1]), pool, seed=0)
    assert pool[donor_window[0, 0], donor_position[0, 0]] == 2
    assert (donor_window[0, 1].item(), donor_position[0, 1].item()) == (-1, 1)  # token 7 is nowhere: its own


def test_the_conditions_are_registered_with_their_roles():
    same, token_mean = condition_named(SAME_TOKEN), condition_named(LAYER_TOKEN_MEAN)
    assert same.seeded and same.uses_same_token and not same.needs_donor
    assert token_mean.static and token_mean.retention and token_mean.per_token and not token_mean.routers_only
    assert token_mean.reference == RANDOM_TOPK and not token_mean.exportable


def test_export_refuses_the_per_token_profile_in_one_line():
    with pytest.raises(UserError) as refused:
        check_request(LAYER_TOKEN_MEAN, None, None, None)
    assert "lookup by token id" in str(refused.value) and "\n" not in str(refused.value)


def windows_of(count: int, seed: int) -> torch.Tensor:
    """Text whose next token is one of two permutations of the current one, the window's mode (10% noise): the
    continuation depends on the context, not on the token alone."""
    generator = torch.Generator().manual_seed(seed)
    permutations = torch.stack([torch.randperm(VOCAB, generator=torch.Generator().manual_seed(99 + m)) for m in (0, 1)])
    mode = torch.randint(2, (count,), generator=generator)
    windows = torch.empty(count, WINDOW, dtype=torch.long)
    windows[:, 0] = torch.randint(VOCAB, (count,), generator=generator)
    for t in range(1, WINDOW):
        noise = torch.rand(count, generator=generator) < 0.1
        windows[:, t] = torch.where(
            noise, torch.randint(VOCAB, (count,), generator=generator), permutations[mode, windows[:, t - 1]]
        )
    return windows


def hash_route(model: T.MixtralForCausalLM) -> None:
    """Routing a fixed function of the token id: each token's embedding carries its expert (token id mod E) in E
    channels that nothing else writes (attention and experts leave them zero), and every router reads those channels
    only, so its top-1 expert is the token's (the RMS norm scales the logits, not their order)."""
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[:, :EXPERTS] = 0
        embedding[torch.arange(VOCAB), torch.arange(VOCAB) % EXPERTS] = 3.0
        for layer in model.model.layers:
            layer.mlp.gate.weight.zero_()
            layer.mlp.gate.weight[:, :EXPERTS] = 10 * torch.eye(EXPERTS)
            layer.self_attn.o_proj.weight[:EXPERTS] = 0
            layer.mlp.experts.down_proj[:, :EXPERTS] = 0
            layer.post_attention_layernorm.weight[:EXPERTS] = 1


def context_route(model: T.MixtralForCausalLM) -> None:
    """A learned router that reads the context only: the embedding writes half of the channels, the experts the same
    half, and every router reads the other half, which only attention writes. (A router that also reads the
    embedding, trained on this text, comes out nearly lexical: retention 0.87 to 1.04 over three seeds.)"""
    half = HIDDEN // 2
    with torch.no_grad():
        model.model.embed_tokens.weight[:, half:] = 0
        for layer in model.model.layers:
            layer.mlp.gate.weight[:, :half] = 0
            layer.mlp.experts.down_proj[:, half:] = 0


def trained(route, seed: int = 0, steps: int = 400) -> T.MixtralForCausalLM:
    """A tiny top-1 Mixtral trained on ``windows_of`` text, ``route`` imposing its routing design at every step."""
    torch.manual_seed(seed)
    config = T.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_local_experts=EXPERTS,
        num_experts_per_tok=1,
        max_position_embeddings=WINDOW,
    )
    model = T.MixtralForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    text = windows_of(512, seed + 1)
    draws = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        route(model)
        batch = text[torch.randint(len(text), (32,), generator=draws)]
        optimizer.zero_grad()
        model(batch, labels=batch).loss.backward()
        optimizer.step()
    route(model)
    return model.eval()


def audited(model: T.MixtralForCausalLM):
    """The session's audit figures of ``model`` on 32 eval and 64 calibration windows, and the session."""
    eval_windows, calibration = windows_of(32, 100), windows_of(64, 200)
    with controlled_view(model) as view, tempfile.TemporaryDirectory(prefix="fca-lexical-") as folder:
        splits = {EVAL: lambda: (None, eval_windows), CALIBRATION: lambda: (None, calibration)}
        session = ReplaySession(view, splits, cache_root=Path(folder), batch_size=8)
        session.capture_all()
        figures = session.figures(session.replay(session.conditions), bootstrap_counts(32, 500, 0))
        yield session, figures


@pytest.fixture(scope="module")
def hashed():
    yield from audited(trained(hash_route, steps=200))


def test_a_hash_routed_model_is_static_by_token(hashed):
    session, figures = hashed
    conditions, retention = figures["conditions"], figures["retention"][LAYER_TOKEN_MEAN]
    assert abs(conditions[SAME_TOKEN]["delta"]) < 1e-6
    assert conditions[SAME_TOKEN]["delta_ci95"][0] <= 0 <= conditions[SAME_TOKEN]["delta_ci95"][1]
    assert conditions[CROSS_INPUT]["delta_ci95"][0] > 0  # the routing matters: moving it across windows costs
    assert conditions[SAME_TOKEN]["kept_own"] == kept_own(session.windows(EVAL), session.seed)
    assert retention["reference"] == RANDOM_TOPK and retention["resolved"]
    assert retention["value"] >= 0.99


def test_the_dashboards_text_replay_and_fca_eval_assign_what_the_audit_does(hashed):
    session, _ = hashed
    window = 5
    ids = session.windows(EVAL)[window : window + 1]
    for condition in (SAME_TOKEN, LAYER_TOKEN_MEAN):
        audit = session.values(condition, torch.tensor([window]))
        text = TextReplays(4, 2**30).values(session, Text(ids, window), condition, session.seed, None, None)
        for mine, theirs in zip(audit, text):
            assert torch.equal(mine[COEFFICIENT], theirs[COEFFICIENT].cpu())
    shapes = session.model.coefficient_slot_shapes
    anywhere = static_values(LAYER_TOKEN_MEAN, session.profiles, shapes, 1, WINDOW, ids)
    for mine, theirs in zip(session.values(LAYER_TOKEN_MEAN, torch.tensor([window])), anywhere):
        assert torch.equal(mine[COEFFICIENT], theirs[COEFFICIENT])
    assert len(session.profiles[TOKEN_IDS][0]) + 1 == len(session.profiles[LAYER_TOKEN_MEAN][0])
    assert torch.allclose(session.profiles[LAYER_TOKEN_MEAN][0][-1].sum(), session.profiles[LAYER_MEAN][0].sum())


def test_a_router_of_the_context_depends_on_more_than_the_token():
    for _, figures in audited(trained(context_route, seed=1)):
        conditions, retention = figures["conditions"], figures["retention"][LAYER_TOKEN_MEAN]
        assert conditions[SAME_TOKEN]["delta_ci95"][0] > 0  # the hash-routed model's: exactly 0
        assert conditions[LAYER_TOKEN_MEAN]["delta"] > 1e-3
        assert retention["value"] is None or retention["value"] < 0.99
