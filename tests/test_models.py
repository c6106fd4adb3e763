"""The coefficient seam, for every family: replay exactness, zero controller calls, save/load."""

import pytest
import torch
from conftest import tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

import fca_workbench.models  # noqa: F401  (registers the Auto classes)
from fca_workbench.models import FAMILIES, common, head_nll, next_token_nll


def count_controller_calls(model):
    calls = []
    handles = [c.register_forward_hook(lambda *_: calls.append(1)) for c in model.controllers]
    return calls, handles


def test_replay_with_own_coefficients_reproduces_logits_without_controller(arch, windows):
    model = tiny_model(arch)
    calls, handles = count_controller_calls(model)
    live = model(windows, return_coefficients=True)
    assert len(calls) == len(model.controllers)
    calls.clear()
    replay = model(windows, coefficients=live.coefficients)
    assert calls == []
    assert torch.equal(live.logits, replay.logits)
    for handle in handles:
        handle.remove()


def test_coefficients_are_batch_first_with_declared_slot_shapes(arch, windows):
    model = tiny_model(arch)
    out = model(windows, return_coefficients=True)
    assert [tuple(c.shape) for c in out.coefficients] == [
        (*windows.shape, *slot) for slot in model.coefficient_slot_shapes
    ]
    if model.controllers:  # coefficients are input-dependent, and changing them changes the output
        assert out.coefficients[0].std(dim=(0, 1)).max() > 0
        changed = [c.flip(0) for c in out.coefficients]
        assert not torch.allclose(model(windows, coefficients=changed).logits, out.logits)


def test_wrongly_shaped_coefficients_are_refused(arch, windows):
    model = tiny_model(arch)
    if not model.controllers:
        pytest.skip("Dense takes no coefficients")
    coefficients = model(windows, return_coefficients=True).coefficients
    with pytest.raises(ValueError, match="shape"):
        model(windows, coefficients=[c[:, :-1] for c in coefficients])
    with pytest.raises(ValueError, match="layers"):
        model(windows, coefficients=coefficients[:-1])


def test_window_longer_than_context_is_refused(arch):
    model = tiny_model(arch)
    with pytest.raises(ValueError, match="longer than the model's context"):
        model(torch.zeros(1, model.context_length + 1, dtype=torch.long))


def test_save_load_round_trip_is_bit_exact_through_auto_classes(arch, windows, tmp_path):
    model = tiny_model(arch)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert isinstance(AutoConfig.from_pretrained(tmp_path), FAMILIES[arch][0])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is FAMILIES[arch][1]
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    assert all(torch.equal(original[k], reloaded[k]) for k in original)
    assert torch.equal(model(windows).logits, loaded(windows).logits)


def test_featuregate_gates_start_at_one_so_untrained_model_equals_dense(windows):
    torch.manual_seed(0)
    gate_config = FAMILIES["featuregate"][0].from_sizes(vocab_size=64, layers=2, width=32, heads=4, window=16)
    gated = FAMILIES["featuregate"][1](gate_config).eval()
    coefficients = gated(windows, return_coefficients=True).coefficients
    assert all(torch.equal(c, torch.ones_like(c)) for c in coefficients)
    dense_config = FAMILIES["dense"][0].from_sizes(vocab_size=64, layers=2, width=32, heads=4, window=16)
    dense = FAMILIES["dense"][1](dense_config).eval()
    shared = {k: v for k, v in gated.state_dict().items() if "controller" not in k}
    dense.load_state_dict(shared)
    assert torch.allclose(dense(windows).logits, gated(windows).logits, atol=1e-6)


def reference_nll(logits, ids):
    """Per-token next-token NLL by log-softmax and gather, computed here rather than by the workbench."""
    return -logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_next_token_nll_is_the_cross_entropy_of_the_shifted_rows(windows, dtype):
    logits = torch.randn(*windows.shape, 64, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
    nll = next_token_nll(logits, windows)
    assert nll.shape == (windows.shape[0], windows.shape[1] - 1) and nll.dtype == torch.float32
    shifted = logits[:, :-1].float()  # the copy next_token_nll avoids: the same arithmetic, bit for bit
    sliced = torch.nn.functional.cross_entropy(shifted.reshape(-1, 64), windows[:, 1:].reshape(-1), reduction="none")
    assert torch.equal(nll, sliced.view_as(nll))
    torch.testing.assert_close(nll.double(), reference_nll(logits.detach().float(), windows), rtol=0, atol=1e-5)
    nll.sum().backward()  # training differentiates it: the last position of each window gets no gradient
    assert logits.grad[:, -1].abs().max() == 0 and logits.grad[:, :-1].abs().max() > 0


@pytest.mark.parametrize("chunk_rows", [1, 7, 10**6])  # one row, chunks across window borders, all at once
def test_head_nll_equals_the_nll_of_the_full_logits(arch, windows, monkeypatch, chunk_rows):
    model = tiny_model(arch)
    monkeypatch.setattr(common, "logits_rows", lambda width, vocab, device: chunk_rows)
    with torch.no_grad():
        output, _, _ = model.run_blocks(model.embed(windows), 0, None)
        got = head_nll(model, output, windows)
        full = model(windows).logits
    assert got.shape == (windows.shape[0], windows.shape[1] - 1)
    torch.testing.assert_close(got.double(), reference_nll(full, windows), rtol=0, atol=1e-5)
    torch.testing.assert_close(got, next_token_nll(full, windows), rtol=0, atol=1e-6)


def test_head_nll_takes_as_many_rows_as_the_budget_holds_but_never_fewer_than_the_head_is_wide(windows, monkeypatch):
    """A narrow head's chunk is what the byte budget holds (its logits still in cache for the softmax); a wide
    one's never has fewer rows than the head is wide (a matrix product over fewer is slower than over the
    whole logits). The head sees exactly those chunks, the last holding the rest."""
    cpu = torch.device("cpu")
    assert common.logits_rows(96, 4096, cpu) == common.CPU_LOGITS_CHUNK_BYTES // (4 * 4096) == 1024
    assert common.logits_rows(4096, 32000, cpu) == 4096
    assert common.logits_rows(4096, 32000, torch.device("cuda")) == 2**30 // (4 * 32000)
    model = tiny_model("featuregate")
    width = model.config.n_embd
    monkeypatch.setattr(common, "CPU_LOGITS_CHUNK_BYTES", 1)
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, output: rows.append(output.shape[0]))
    with torch.no_grad():
        head_nll(model, model.run_blocks(model.embed(windows), 0, None)[0], windows)
    total = windows.numel()
    assert rows == [width] * (total // width) + ([total % width] if total % width else [])


def test_loading_a_checkpoint_hides_transformers_weight_bar_and_restores_the_users_setting():
    """In a notebook, transformers' "Loading weights" bar widget left the explorer's output unable to draw: the
    workbench's loads hide it, and put back whatever the user had."""
    from transformers.utils import logging as transformers_logging

    from fca_workbench.models.loading import quiet_weight_loading

    for users in (True, False):
        (transformers_logging.enable_progress_bar if users else transformers_logging.disable_progress_bar)()
        with quiet_weight_loading():
            assert not transformers_logging.is_progress_bar_enabled()
        assert transformers_logging.is_progress_bar_enabled() is users
    transformers_logging.enable_progress_bar()
