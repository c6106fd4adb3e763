"""MUDDPythia: the coefficient seam, checkpoint round trips, config checks and numerical faithfulness.

Every model here is tiny (a few layers, dim 64) so the file runs in seconds on a shared CPU.
"""

import math
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_identical_models, perturbed_muddpythia

from fca_workbench.models.common import next_token_nll
from fca_workbench.models.muddpythia import (
    MUDDPythiaConfig,
    MUDDPythiaForCausalLM,
    apply_rope,
    precompute_rope,
)

TINY = dict(vocab_size=512, block_size=64, n_layer=3, n_head=4, dim=64)


def make_model(seed=0, **overrides) -> MUDDPythiaForCausalLM:
    return perturbed_muddpythia({**TINY, **overrides}, seed)


def tokens(batch=2, length=12, seed=1):
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


class CallCounter:
    """Counts forward calls of the controllers with hooks, the way the execution audit does."""

    def __init__(self, modules):
        self.calls = 0
        self.handles = [m.register_forward_hook(self._hook) for m in modules]

    def _hook(self, *_):
        self.calls += 1

    def remove(self):
        for handle in self.handles:
            handle.remove()


# ------------------------------------------------------------------------------------------------------
# the coefficient seam


def test_coefficient_shapes_per_layer():
    model = make_model()
    ids = tokens(batch=2, length=10)
    out = model(ids, return_coefficients=True)
    n_layer = TINY["n_layer"]
    assert out.logits.shape == (2, 10, TINY["vocab_size"])
    assert len(out.coefficients) == n_layer
    for i, coefficient in enumerate(out.coefficients):
        streams = 1 if i == n_layer - 1 else 4  # q, k, v, r; only the LM-head stream after the last layer
        assert coefficient.shape == (2, 10, streams, i + 2)
        assert model.coefficient_slot_shapes[i] == (streams, i + 2)
    assert len(model.controllers) == n_layer and len(model.blocks) == n_layer
    assert model.controllers[0] is model.dynamic_dense[0]
    assert model.context_length == TINY["block_size"]
    assert model(ids).coefficients is None  # only returned on request


def test_complete_coefficient_is_controller_plus_static_bias():
    model = make_model()
    ids = tokens()
    out = model(ids, return_coefficients=True)
    hidden = {}
    model.layers[1].register_forward_hook(lambda m, args, output: hidden.setdefault("x", output))
    model(ids)
    expected = model.dynamic_dense[1](hidden["x"]) + model.dense_bs[1]
    assert torch.equal(out.coefficients[1], expected)


def test_replay_own_coefficients_is_exact_and_runs_no_controller():
    model = make_model()
    ids = tokens()
    counter = CallCounter(model.controllers)
    with torch.no_grad():
        first = model(ids, return_coefficients=True)
        assert counter.calls == TINY["n_layer"]
        counter.calls = 0
        replay = model(ids, coefficients=first.coefficients)
        assert counter.calls == 0
        # neither the controllers nor the static bias may be read during replay: poison both
        for controller in model.controllers:
            controller.w1.weight.fill_(float("nan"))
        for bias in model.dense_bs:
            bias.fill_(float("nan"))
        poisoned = model(ids, coefficients=[c.clone() for c in first.coefficients])
    counter.remove()
    assert torch.equal(replay.logits, first.logits)
    assert torch.equal(poisoned.logits, first.logits)


def test_replay_with_modified_coefficients_changes_logits():
    model = make_model()
    ids = tokens()
    with torch.no_grad():
        own = model(ids, return_coefficients=True)
        for layer in range(TINY["n_layer"]):
            changed = [c.clone() for c in own.coefficients]
            changed[layer][..., 0] += 0.5  # more weight on the embeddings in every stream
            logits = model(ids, coefficients=changed).logits
            assert not torch.allclose(logits, own.logits, atol=1e-4), f"layer {layer} coefficients are ignored"


def test_wrong_coefficient_shapes_are_refused():
    model = make_model()
    ids = tokens()
    coefficients = model(ids, return_coefficients=True).coefficients
    with pytest.raises(ValueError, match="layer 2"):
        model(ids, coefficients=coefficients[:2] + [coefficients[2].expand(-1, -1, 4, -1)])
    with pytest.raises(ValueError, match="longer than the model's context"):
        model(torch.zeros(1, TINY["block_size"] + 1, dtype=torch.long))


# ------------------------------------------------------------------------------------------------------
# training and checkpoints


def test_training_step_gives_loss_and_gradients():
    torch.manual_seed(0)
    model = MUDDPythiaForCausalLM(MUDDPythiaConfig(**TINY)).train()
    ids = tokens()
    out = model(ids, labels=ids)
    assert torch.allclose(out.loss, next_token_nll(out.logits, ids).mean())
    assert math.isclose(out.loss.item(), math.log(TINY["vocab_size"]), rel_tol=0.1)  # near-uniform at init
    out.loss.backward()
    for i in range(TINY["n_layer"]):
        # w2 starts at zero (so w1 gets no gradient yet); w2 and the static bias must learn
        assert model.dynamic_dense[i].w2.weight.grad.abs().sum() > 0
        assert model.dense_bs[i].grad.abs().sum() > 0
    assert model.tok_embeddings.weight.grad.abs().sum() > 0


def test_init_starts_as_a_plain_residual_stack():
    """Silent controllers and one-hot static biases: every stream is the newest layer output."""
    torch.manual_seed(0)
    model = MUDDPythiaForCausalLM(MUDDPythiaConfig(**TINY))
    for i, bias in enumerate(model.dense_bs):
        expected = torch.zeros_like(bias)
        expected[:, -1] = 1
        assert torch.equal(bias.detach(), expected)
        assert torch.count_nonzero(model.dynamic_dense[i].w2.weight) == 0
    coefficients = model(tokens(), return_coefficients=True).coefficients
    assert all(torch.equal(c, b.expand_as(c)) for c, b in zip(coefficients, model.dense_bs))


def test_save_and_load_round_trip_is_bit_exact(tmp_path):
    model = make_model(use_qk_norm=True)
    model.save_pretrained(tmp_path)
    loaded = MUDDPythiaForCausalLM.from_pretrained(tmp_path).eval()
    ignore = {"_name_or_path"}
    assert {k: v for k, v in loaded.config.to_dict().items() if k not in ignore} == {
        k: v for k, v in model.config.to_dict().items() if k not in ignore
    }
    assert_identical_models(model, loaded, tokens())


# ------------------------------------------------------------------------------------------------------
# config


def test_project_tiny_config_builds():
    config = MUDDPythiaConfig(vocab_size=4096, block_size=256, n_layer=4, n_head=4, dim=96)
    assert (config.head_dim, config.n_local_heads, config.intermediate_size) == (24, 4, 384)
    with torch.device("meta"):
        model = MUDDPythiaForCausalLM(config)
    widths = [layer.feed_forward.w1.out_features for layer in model.layers]
    # 384 * (i/3 + 0.5) rounded to 128 with the reference's float arithmetic (447.99.. -> 384 on layer 2)
    assert widths == [256, 256, 384, 512]


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(dense_type="l"), "dense_type='l'"),
        (dict(dense=False), "dense=False"),
        (dict(tie_word_embeddings=True), "tie_word_embeddings"),
        (dict(n_local_heads=2), "n_local_heads"),
        (dict(n_layer=1), "n_layer"),
    ],
)
def test_bad_config_is_refused_clearly(bad, words):
    with pytest.raises(ValueError, match="not a MUDDPythia config") as info:
        MUDDPythiaConfig(**{**TINY, **bad})
    assert words in str(info.value)


# The official MUDDPythia-1.4B config.json (github.com/Caiyun-AI/MUDDFormer, pytorch/muddpythia/config_1p4b.json).
OFFICIAL_1P4B = {
    "architectures": ["MUDDPythia"],
    "auto_map": {
        "AutoConfig": "configuration_muddpythia.MUDDPythiaConfig",
        "AutoModelForCausalLM": "modeling_muddpythia.MUDDPythia",
    },
    "block_size": 2048,
    "bos_token_id": 0,
    "dense": True,
    "dense_type": "qkvr",
    "dim": 2048,
    "dynamic_dense": True,
    "eos_token_id": 0,
    "expand_last": True,
    "head_dim": 128,
    "intermediate_size": 8192,
    "is_training": False,
    "model_type": "muddpythia",
    "n_head": 16,
    "n_layer": 24,
    "n_local_heads": 16,
    "norm_eps": 1e-05,
    "rope_base": 10000,
    "rotary_pct": 0.25,
    "round64": True,
    "sepln": True,
    "stack_hidden": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0",
    "use_gradient_checkpointing": False,
    "use_layer_cache": True,
    "use_linear_bias": True,
    "use_parallel_residual": True,
    "use_qk_norm": True,
    "vocab_size": 50432,
}


def test_official_config_gives_the_checkpoint_layout():
    """Built on the meta device (no memory): names and shapes the 1.4B safetensors must match."""
    with torch.device("meta"):
        model = MUDDPythiaForCausalLM(MUDDPythiaConfig(**OFFICIAL_1P4B))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert len(shapes) == 600
    assert shapes["tok_embeddings.weight"] == (50432, 2048) and shapes["output.weight"] == (50432, 2048)
    assert shapes["layers.0.attention_norm.weight"] == (2048,)
    assert shapes["layers.1.attention_norms.2.bias"] == (2048,)
    assert shapes["layers.5.attention.q_norm.weight"] == (128,)
    assert shapes["layers.0.feed_forward.w1.weight"] == (4096, 2048)  # 0.5 x 8192
    assert shapes["layers.23.feed_forward.w2.weight"] == (2048, 12288)  # 1.5 x 8192
    assert shapes["dense_bs.0"] == (4, 2) and shapes["dense_bs.23"] == (1, 25)
    assert shapes["dynamic_dense.0.w1.weight"] == (64, 2048)  # 8 -> round64 -> 64
    assert shapes["dynamic_dense.23.w1.weight"] == (128, 2048)  # 25 * 4 (expand_last) -> 128
    assert shapes["dynamic_dense.23.w2.weight"] == (25, 128)
    assert not any("rope" in k or "mask" in k or "cache" in k for k in shapes)
    assert sum(p.numel() for p in model.parameters()) == 1_419_950_149


# ------------------------------------------------------------------------------------------------------
# numerical faithfulness


def test_rope_table_is_fp16_and_rotation_pairs_half_channels():
    table = precompute_rope(16, 8, 10000)
    assert table.dtype == torch.float16 and table.shape == (16, 4, 2)
    x = torch.randn(1, 16, 2, 8)
    out = apply_rope(x, table)
    cos, sin = table[..., 0].float()[None, :, None], table[..., 1].float()[None, :, None]
    first, second = x[..., :4], x[..., 4:]  # channel j pairs with j + 4
    assert torch.allclose(out[..., 0::2], first * cos - second * sin)  # written back interleaved
    assert torch.allclose(out[..., 1::2], second * cos + first * sin)


def independent_forward(model: MUDDPythiaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """The architecture written out again without the module's helpers: complex-number rotary (outputs in
    the usual half layout), SDPA attention, einsum stream mixing over a stacked hidden tensor."""
    cfg, p = model.config, dict(model.named_parameters())
    T, H, D = ids.shape[1], cfg.n_head, cfg.head_dim
    R = int(D * cfg.rotary_pct)
    theta = cfg.rope_base ** (-torch.arange(0, R, 2).float() / R)
    angle = torch.arange(T).float()[:, None] * theta
    # the reference stores its table in fp16; do the same so the comparison is tight
    rot = torch.complex(angle.cos().half().float(), angle.sin().half().float())[None, :, None]

    def ln(x, name):
        return F.layer_norm(x, (cfg.dim,), p[f"{name}.weight"], p[f"{name}.bias"], cfg.norm_eps)

    def lin(x, name):
        return F.linear(x, p[f"{name}.weight"], p.get(f"{name}.bias"))

    def rope(x):
        z = torch.complex(x[..., : R // 2], x[..., R // 2 : R]) * rot
        return torch.cat([z.real, z.imag, x[..., R:]], dim=-1)

    def heads(x, name, norm):
        x = lin(x, name).view(-1, T, H, D)
        if cfg.use_qk_norm and norm:
            x = F.rms_norm(x, (D,), p[f"{norm}.weight"], cfg.norm_eps)
        return x

    hiddens = [p["tok_embeddings.weight"][ids]]
    streams = [hiddens[0]] * 4
    for i in range(cfg.n_layer):
        a = f"layers.{i}.attention"
        normed = [
            ln(s, f"layers.{i}.attention_norm" if i == 0 else f"layers.{i}.attention_norms.{c}")
            for c, s in enumerate(streams[:3])
        ]
        q = rope(heads(normed[0], f"{a}.wq", f"{a}.q_norm")).transpose(1, 2)
        k = rope(heads(normed[1], f"{a}.wk", f"{a}.k_norm")).transpose(1, 2)
        v = heads(normed[2], f"{a}.wv", None).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(-1, T, cfg.dim)
        res = streams[3]
        h = res + lin(y, f"{a}.wo")
        mlp_in = ln(res if cfg.use_parallel_residual else h, f"layers.{i}.ffn_norm")
        x = h + lin(F.gelu(lin(mlp_in, f"layers.{i}.feed_forward.w1")), f"layers.{i}.feed_forward.w2")
        hiddens.append(x)
        dd = f"dynamic_dense.{i}"
        C = p[f"dense_bs.{i}"].shape[0]
        w = lin(F.gelu(lin(F.rms_norm(x, (cfg.dim,), eps=cfg.norm_eps), f"{dd}.w1")), f"{dd}.w2")
        w = w.view(*x.shape[:2], C, i + 2) + p[f"dense_bs.{i}"]
        streams = list(torch.einsum("btcl,lbtd->cbtd", w, torch.stack(hiddens)))
    return lin(ln(streams[0], "norm"), "output")


@pytest.mark.parametrize("overrides", [{}, dict(use_qk_norm=True, use_parallel_residual=False, rotary_pct=1.0)])
def test_matches_an_independent_forward(overrides):
    model = make_model(**overrides)
    ids = tokens(length=20)
    with torch.no_grad():
        expected = independent_forward(model, ids)
        actual = model(ids).logits
    assert torch.allclose(actual, expected, atol=1e-4, rtol=1e-4), (actual - expected).abs().max()


def _load_reference(folder: str):
    """Import the reference's modeling file; it needs einops only for one rearrange, so shim it if absent."""
    if "einops" not in sys.modules:
        try:
            import einops  # noqa: F401  (only whether it is installed)
        except ImportError:
            shim = types.ModuleType("einops")

            def rearrange(x, pattern, C):
                assert pattern == "B T (C L) -> C B T L"
                return x.unflatten(-1, (C, -1)).permute(2, 0, 1, 3)

            shim.rearrange = rearrange
            sys.modules["einops"] = shim
    sys.path.insert(0, folder)
    try:
        import configuration_muddpythia
        import modeling_muddpythia
    finally:
        sys.path.remove(folder)
    return configuration_muddpythia.MUDDPythiaConfig, modeling_muddpythia.MUDDPythia


@pytest.mark.skipif(
    not os.environ.get("MUDDPYTHIA_REFERENCE"),
    reason="set MUDDPYTHIA_REFERENCE to a copy of the reference's pytorch/muddpythia folder",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_exact_against_the_reference_code(dtype):
    """Opt-in: load our weights strictly into the reference implementation and compare logits bit for bit."""
    RefConfig, RefModel = _load_reference(os.environ["MUDDPYTHIA_REFERENCE"])
    overrides = dict(use_qk_norm=True, round64=True, expand_last=True)
    model = make_model(**overrides).to(dtype)
    reference = RefModel(RefConfig(**TINY, **overrides)).eval()
    reference.load_state_dict(model.state_dict(), strict=True)
    reference.to(dtype).setup_caches(max_batch_size=2, max_seq_length=TINY["block_size"], dtype=dtype)
    ids = tokens(length=20)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids, return_tensor=True))
