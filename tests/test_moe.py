"""Foreign transformers models through the controlled-model protocol: MoE routers and named controllers.

Tiny models are built from their config classes with seeded random weights (no network) and saved with
``save_pretrained`` plus the shipped tokenizer.
"""

import json

import pytest
import torch
import transformers as T
import zoo

from fca_workbench import load_audit
from fca_workbench.adapters import COEFFICIENT, TransformersControlled
from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.adapters.families import EXACT_MIXTURE_KERNELS, OUTPUT_SHAPES, Family
from fca_workbench.adapters.families import MOE_FAMILIES as REGISTRY
from fca_workbench.adapters.kinds import index_dtype
from fca_workbench.adapters.routers import OUTPUTS, find_routers
from fca_workbench.audit.assignment import ConditionCoefficients
from fca_workbench.audit.execution import count_flops
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import next_token_nll

VOCAB = 4096  # the shipped tokenizer's
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)
FAMILIES = {  # config class, its MoE fields (shared/moe-routing.md), router count
    "mixtral": (T.MixtralConfig, dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (
        T.Qwen2MoeConfig,
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "qwen3_moe": (T.Qwen3MoeConfig, dict(moe_intermediate_size=32, head_dim=16, num_experts=4, num_experts_per_tok=2)),
    "olmoe": (T.OlmoeConfig, dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": (
        T.DeepseekV3Config,
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    ),
    "gpt_oss": (
        T.GptOssConfig,
        dict(intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16),
    ),
    "granitemoe": (T.GraniteMoeConfig, dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)),
    "jamba": (
        T.JambaConfig,
        dict(
            intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=1,
            expert_layer_offset=0,
        ),
    ),
}
# Qwen2: a router and a shared-expert gate per layer; Jamba: a router per layer and its mamba layer's Δ, B, C
EXPECTED_CONTROLLERS = {"qwen2_moe": 4, "deepseek_v3": 1, "jamba": 3}


def routers(model):
    return [m for _, m in model.named_modules() if type(m).__name__.lower().endswith("topkrouter")]


def build(family: str, seed: int = 0, router_scale: float = 20.0, **overrides):
    """A seeded tiny model; routers scaled so routing depends on the input (0: constant routing)."""
    config_class, fields = FAMILIES[family]
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config_class(**{**COMMON, **fields, **overrides})).eval()
    with torch.no_grad():
        for _, module in model.named_modules():
            if module in routers(model) or _.endswith("shared_expert_gate"):
                for param in module.parameters():
                    param.mul_(router_scale)
    return model


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_replays_correct_bit_exactly_without_running_a_router(family, ids, tmp_path, tokenizer):
    controlled = load_controlled(zoo.save(build(family), tmp_path / family, tokenizer))
    assert isinstance(controlled, TransformersControlled) and controlled.arch == family
    assert len(controlled.controller_names) == EXPECTED_CONTROLLERS.get(family, 2)
    with torch.no_grad():
        live = controlled(ids).logits
        captured_logits, values = controlled.capture_run(ids)
    assert torch.equal(captured_logits, live)
    for value, shape in zip(values, controlled.coefficient_slot_shapes):
        assert value[COEFFICIENT].shape == (*ids.shape, *shape)

    router_class = type(routers(controlled.model)[0])
    runs = []
    original = router_class.forward
    router_class.forward = lambda self, *a, **k: runs.append(1) or original(self, *a, **k)
    try:
        with torch.no_grad():
            for router in routers(controlled.model):
                router.weight.fill_(float("nan"))  # a router that ran would poison the logits
            replayed = controlled.replay_run(ids, values)
    finally:
        router_class.forward = original
    assert runs == [] and torch.isfinite(replayed).all()
    assert torch.equal(replayed, live)
    assert "forward" not in vars(routers(controlled.model)[0])  # the replacements were put back


def test_flops_are_the_same_under_every_experts_kernel(ids):
    """``count_flops`` counts ``grouped_mm`` (which torch's counter leaves out) as eager's per-expert linears
    count the same products: the routed model and its every-expert baseline alike."""
    model = build("mixtral")
    counts = {}
    for implementation in ("eager", "grouped_mm", "batched_mm"):
        model.set_experts_implementation(implementation)
        controlled = TransformersControlled(model)
        counts[implementation] = (count_flops(controlled, ids), count_flops(controlled.latency_baseline()[1], ids))
    assert counts["grouped_mm"] == counts["batched_mm"] == counts["eager"]
    assert counts["eager"][1] > counts["eager"][0]  # every expert for every token costs more than top-2 of 4


def test_indices_are_stored_in_the_smallest_integer_type_that_holds_every_class():
    dtypes = [index_dtype(classes) for classes in (4, 256, 257, 32768, 32769)]
    assert dtypes == [torch.uint8, torch.uint8, torch.int16, torch.int16, torch.int32]


def test_reassignment_changes_nll_and_dense_gate_is_the_top_k(ids):
    controlled = TransformersControlled(build("mixtral"))
    with torch.no_grad():
        logits, values = controlled.capture_run(ids)
        donors = [{k: v.roll(1, dims=0) for k, v in value.items()} for value in values]
        crossed = controlled.replay_run(ids, donors)
    gate = values[0][COEFFICIENT]
    assert ((gate > 0).sum(-1) == 2).all() and torch.allclose(gate.sum(-1), torch.ones(gate.shape[:2]))
    assert not torch.allclose(next_token_nll(crossed, ids).mean(), next_token_nll(logits, ids).mean())


def test_static_profile_equal_to_live_routing_replays_exactly(ids):
    """A coefficient-only value (static mixture path) equal to constant live routing costs exactly 0."""
    controlled = TransformersControlled(build("mixtral", router_scale=0.0))
    with torch.no_grad():
        logits, values = controlled.capture_run(ids)
        static = controlled.replay_run(ids, [{COEFFICIENT: v[COEFFICIENT]} for v in values])
    assert torch.equal(static, logits)


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
def test_correct_replays_exactly_under_every_experts_kernel_and_only_eager_mixes_exactly(implementation, tokenizer):
    """Capture and replay run the model's own experts kernel (transformers' default ``grouped_mm`` unless the
    model sets another): ``correct`` is bit-exact under each; a dense gate equal to the live top-3 routing is
    exact only under the kernels ``EXACT_MIXTURE_KERNELS`` names (grouped_mm and batched_mm sum a token's slots)."""
    model = build("qwen3_moe", num_experts_per_tok=3)
    assert model.get_experts_implementation() == {"": "grouped_mm"}  # transformers' default
    model.set_experts_implementation(implementation)
    controlled = TransformersControlled(model)
    assert controlled.experts_implementation == implementation
    ids = torch.randint(1, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        live, values = controlled.capture_run(ids)
        correct = controlled.replay_run(ids, values)
        dense = controlled.replay_run(ids, [{COEFFICIENT: v[COEFFICIENT]} for v in values])
    assert torch.equal(correct, live)
    assert torch.equal(dense, live) == (implementation in EXACT_MIXTURE_KERNELS)


def audit(folder, tmp_path, **settings):
    args = dict(checkpoint=str(folder), window=16, max_windows=6, batch_size=3, resamples=50, latency_repeats=1)
    return run_audit(AuditSettings(**{**args, **settings}), tmp_path / "audit")


def test_constant_routing_costs_nothing_and_counts_k_over_e(tmp_path, tokenizer):
    result = audit(zoo.save(build("mixtral", router_scale=0.0), tmp_path / "m", tokenizer), tmp_path)
    conditions = result["conditions"]
    assert "layer_mean_topk" in conditions
    for name in ("cross_input", "token_shuffle", "layer_mean", "layer_mean_topk"):
        assert abs(conditions[name]["delta"]) < 1e-6, name
    assert result["model"]["controllers"] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert result["model"]["slot_labels"] == [["expert 0", "expert 1", "expert 2", "expert 3"]] * 2
    execution = result["execution"]
    assert execution["expert_fraction_executed"] == 2 / 4
    assert execution["experts"]["fraction_executed"] == [0.5, 0.5]
    assert all(abs(sum(load) - 2) < 1e-9 for load in execution["experts"]["load"])
    assert execution["baseline"] == "static_mixture"
    assert execution["baseline_flops"] > execution["flops"]  # every expert for every token costs more


def test_routed_audit_is_input_dependent_and_k_over_e(tmp_path, tokenizer):
    result = audit(zoo.save(build("olmoe"), tmp_path / "o", tokenizer), tmp_path)
    assert result["model"]["arch"] == "olmoe"
    assert result["conditions"]["correct"]["delta"] == 0.0
    # an untrained model's mean ΔNLL may fall either side of 0; per token, reassignment must move the NLL
    per_token = load_audit(tmp_path / "audit").per_token.pivot_table(
        index=["window", "position"], columns="condition", values="nll", observed=True
    )
    assert (per_token["cross_input"] - per_token["correct"]).abs().max() > 1e-3
    assert result["execution"]["expert_fraction_executed"] == 2 / 4
    load = result["execution"]["experts"]["load"][0]
    assert max(load) > min(load)  # routing is not uniform


def test_correct_replay_through_the_cache_equals_the_live_nll(tmp_path, tokenizer):
    """capture → shards → ConditionCoefficients → replay_run: the whole router output round-trips bit-exactly."""
    from fca_workbench.audit.capture import capture

    controlled = load_controlled(zoo.save(build("qwen2_moe"), tmp_path / "q", tokenizer))
    windows = torch.randint(1, VOCAB, (4, 10), generator=torch.Generator().manual_seed(2))
    cache = capture(controlled, windows, tmp_path / "cache", batch_size=2)
    values = ConditionCoefficients("correct", cache).values(torch.arange(2))
    assert set(values[0]) == {COEFFICIENT, "router_logits", "top_k_weights", "top_k_index"}
    # stored once: the gate, the index as uint8 (4 experts), the weights and logits as their dtypes alone
    assert values[0]["top_k_index"].dtype == torch.uint8
    assert values[0]["top_k_weights"].numel() == values[0]["router_logits"].numel() == 0
    with torch.no_grad():
        nll = next_token_nll(controlled.replay_run(windows[:2], values), windows[:2])
    assert torch.equal(nll, cache.nll(torch.arange(2)))


def test_controllers_regex_on_a_plain_gating_module(ids, tmp_path, tokenizer):
    torch.manual_seed(0)
    llama = T.LlamaForCausalLM(T.LlamaConfig(**COMMON, intermediate_size=32)).eval()
    folder = zoo.save(llama, tmp_path / "llama", tokenizer)
    assert load_controlled(folder).controller_names == []  # no built-in kind: a model without controllers
    controlled = load_controlled(folder, controllers=r"model\.layers\.\d+\.mlp\.gate_proj")
    assert controlled.controller_names == ["model.layers.0.mlp.gate_proj", "model.layers.1.mlp.gate_proj"]
    assert controlled.coefficient_slot_shapes == [(32,), (32,)]
    with torch.no_grad():
        logits, values = controlled.capture_run(ids)
        assert torch.equal(controlled.replay_run(ids, values), logits)
        shuffled = [{COEFFICIENT: v[COEFFICIENT].flip(1)} for v in values]
        assert not torch.allclose(controlled.replay_run(ids, shuffled), logits)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_refusals(tmp_path, tokenizer):
    folder = zoo.save(build("mixtral"), tmp_path / "m", tokenizer)
    with pytest.raises(UserError) as excinfo:
        load_controlled(folder, controllers=r"no\.such\.module")
    assert "matches no module" in one_line(excinfo)
    with pytest.raises(UserError) as excinfo:
        load_controlled(folder, controllers=r"model\.layers\.\d+\.self_attn")  # returns a tuple
    assert "cannot use" in one_line(excinfo)

    config = json.loads((folder / "config.json").read_text())
    remote = tmp_path / "remote"
    remote.mkdir()
    for path in folder.iterdir():
        (remote / path.name).write_bytes(path.read_bytes())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "x.Model"}}))
    with pytest.raises(UserError) as excinfo:
        load_controlled(remote)
    assert "--trust-remote-code" in one_line(excinfo)

    (remote / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    with pytest.raises(UserError) as excinfo:
        load_controlled(remote)
    assert "no-such-model" in one_line(excinfo)

    bare = tmp_path / "bare"
    build("mixtral").save_pretrained(bare)  # no tokenizer files
    with pytest.raises(UserError) as excinfo:
        audit(bare, tmp_path)
    assert "no tokenizer files" in one_line(excinfo)


def test_a_registered_kind_finds_the_controllers_of_a_model_class_of_ones_own(ids, tmp_path, tokenizer, monkeypatch):
    """The README's example: register a kind, then load."""
    from fca_workbench.adapters import kinds, register_kind, tensor_kind

    monkeypatch.setattr(kinds, "KINDS", list(kinds.KINDS))
    monkeypatch.setattr("fca_workbench.adapters.hf.KINDS", kinds.KINDS)
    torch.manual_seed(0)
    folder = zoo.save(
        T.LlamaForCausalLM(T.LlamaConfig(**COMMON, intermediate_size=32)).eval(), tmp_path / "l", tokenizer
    )
    register_kind(tensor_kind(r"model\.layers\.\d+\.mlp\.up_proj"))
    controlled = load_controlled(folder)
    assert controlled.controller_names == ["model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"]
    with torch.no_grad():
        logits, values = controlled.capture_run(ids)
        assert torch.equal(controlled.replay_run(ids, values), logits)


def test_cuda_batch_size_of_a_transformers_model_follows_its_config(monkeypatch):
    """``audit_batch_size`` on CUDA sizes a foreign model from its config (no ``sizes()``), ``mem_get_info``
    stubbed: the per-window estimate written out from the Mixtral's own numbers."""
    import fca_workbench.audit.budget as budget

    controlled = TransformersControlled(build("mixtral"))  # width 64, 2 layers, 4 heads, FFN 64 (< 4·64), fp32
    window, element = 64, 4
    per_window = (
        (2 + 1 + 8) * window * 64 + 2 * window * (3 * 256 // 2) + 4 * 4 * window * window
    ) * element + window * VOCAB * (element + 12)
    weights = sum(p.numel() * 4 for p in controlled.parameters())  # on the CPU: still to be moved
    assert budget.window_bytes(controlled, window) == per_window
    for free, expected in [(budget.RESERVE_BYTES + weights + 7.5 * 1.5 * per_window, 7), (2**40, 64), (2**20, 1)]:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, free))
        assert budget.audit_batch_size(controlled, window, "cuda") == expected
    assert budget.audit_batch_size(controlled, window, "cpu") == 16


def test_fca_audit_on_the_shipped_moe(tmp_path):
    """``fca audit data/checkpoints/moe-s0`` on its first 4 windows: the frozen replay of the cached router
    outputs reproduces the live NLL, and top-2 of 8 experts ran."""
    from fca_workbench.cli import main
    from fca_workbench.data.corpus import DATA_DIR

    assert main(["audit", str(DATA_DIR / "checkpoints" / "moe-s0"), "--max-windows", "4", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "audit.json").read_text())
    conditions = result["conditions"]
    assert abs(conditions["correct"]["nll"] - conditions["unperturbed"]["nll"]) < 1e-6
    assert conditions["cross_input"]["delta"] > 0.01 and "layer_mean_topk" in conditions
    assert result["model"]["controllers"] == [f"model.layers.{l}.mlp.gate" for l in range(4)]
    assert result["execution"]["expert_fraction_executed"] == 2 / 8
    assert result["execution"]["baseline"] == "static_mixture"


# Routers by role: every output shape transformers uses, replayed without running a router (tests/zoo.py builds)
UNUSUAL = [
    "dbrx",
    "doge",
    "hunyuan_v1_moe",
    "inkling_text",
    "jetmoe",
    "llama4_text",
    "longcat_flash",
    "zaya",
    "gemma4_text",
]


def extra_gates(model_type: str) -> int:
    """Gates of the coefficient beyond the routed experts' (Inkling's shared-expert gamma)."""
    return 1 if model_type == "inkling_text" else 0


@pytest.mark.parametrize("model_type", UNUSUAL)
def test_every_router_shape_replays_bit_exactly_without_running_a_router(model_type, ids):
    controlled = TransformersControlled(zoo.build(model_type))
    names = list(find_routers(controlled.model))
    routers = [controlled.controller_names.index(name) for name in names]  # beside them: gates (Doge's mask)
    assert names and [controlled.controller_names[i] for i in routers] == names
    with torch.no_grad():
        live = controlled(ids).logits
        _, values = controlled.capture_run(ids)
        for name in names:  # a router that ran would poison the logits
            for parameter in controlled.model.get_submodule(name).parameters():
                parameter.fill_(float("nan"))
        replayed = controlled.replay_run(ids, values)
        crossed = controlled.replay_run(ids, [{k: v.roll(1, dims=0) for k, v in value.items()} for value in values])
    assert torch.equal(replayed, live)
    assert torch.isfinite(crossed).all() and not torch.equal(crossed, live)
    for value in (values[i] for i in routers):  # the dense gate: at most k routing classes per token
        assert ((value[COEFFICIENT] != 0).sum(-1) <= zoo.routed_k(model_type) + extra_gates(model_type)).all()
    assert all("forward" not in vars(controlled.model.get_submodule(name)) for name in names)


def test_a_routing_step_split_out_of_a_forward_computes_what_the_forward_did(ids):
    """Doge's block computes its product-key routing inline; the adapter's split forward gives the same logits."""
    model = zoo.build("doge")
    with torch.no_grad():
        pristine = model(input_ids=ids, use_cache=False).logits
        controlled = TransformersControlled(model)
        assert "route_product_keys" in vars(model.get_submodule("model.layers.0.mlp"))
        assert torch.equal(controlled(ids).logits, pristine)
    routers = [i for i, kind in enumerate(controlled.kinds) if kind.name.startswith("router:")]
    assert [controlled.coefficient_slot_shapes[i] for i in routers] == [(16,), (16,)]  # one per product-key expert


def test_zero_computation_experts_are_counted_apart_and_longcat_has_blocks(tmp_path):
    """LongCat-Flash: routing classes ≥ E are zero-computation experts; counted from the raw router output."""
    from fca_workbench.audit.capture import capture
    from fca_workbench.audit.execution import count_execution, expert_execution

    controlled = TransformersControlled(zoo.build("longcat_flash"))
    assert len(controlled.blocks) == 2  # num_hidden_layers is 2 × num_layers
    windows = torch.randint(1, VOCAB, (4, 10), generator=torch.Generator().manual_seed(3))
    raw = []
    hooks = [
        controlled.model.get_submodule(n).register_forward_hook(lambda m, a, out: raw.append(out[2]))
        for n in controlled.controller_names
    ]
    with torch.no_grad():
        controlled.model(input_ids=windows, use_cache=False)
    for hook in hooks:
        hook.remove()
    cache = capture(controlled, windows, tmp_path / "cache", batch_size=4)
    experts = expert_execution(controlled, cache)["experts"]
    for index, zero in zip(raw, experts["zero_computation"]):
        assert zero == (index >= zoo.EXPERTS).sum().item() / index.numel()
    assert experts["experts"] == [zoo.EXPERTS] * 2 and 0 < max(experts["zero_computation"]) < 1
    assert count_execution(controlled, windows)["fraction_executed"] == 1.0


def test_a_router_no_kind_claims_is_refused_in_one_line(monkeypatch):
    """A module that looks like a router but is not where its family says: refused, never "No controller"."""
    monkeypatch.setitem(REGISTRY, "mixtral", Family(router_names=("router",)))
    with pytest.raises(UserError) as excinfo:
        TransformersControlled(build("mixtral"))
    assert "looks like a router" in one_line(excinfo) and "model.layers.0.mlp.gate" in one_line(excinfo)


def test_every_router_output_shape_is_described_for_the_docs():
    assert set(OUTPUT_SHAPES) == set(OUTPUTS)
    assert {family.output for family in REGISTRY.values()} <= set(OUTPUTS)


def test_flops_of_dbrx_count_and_leave_the_parameters_as_they_were():
    from fca_workbench.audit.execution import count_flops

    controlled = TransformersControlled(zoo.build("dbrx"))
    assert count_flops(controlled, torch.randint(1, VOCAB, (2, 8))) > 0
    assert all(parameter.requires_grad for parameter in controlled.parameters())


def test_a_causal_lm_outside_the_auto_mapping_loads_and_an_encoder_decoder_is_refused(ids, tmp_path, tokenizer):
    """Mistral-4 and Qwen3-VL-MoE are not in AutoModelForCausalLM's mapping: the first loads as its own causal
    LM, the second as its image-text-to-text model run on text alone; Switch Transformers is refused."""
    torch.manual_seed(0)
    mistral4 = T.Mistral4ForCausalLM._from_config(zoo.tiny_config("mistral4"))
    controlled = load_controlled(zoo.save(mistral4, tmp_path / "m4", tokenizer))
    assert type(controlled.model).__name__ == "Mistral4ForCausalLM" and controlled.controller_names
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
    config = T.Qwen3VLMoeConfig(text_config=zoo.tiny_config("qwen3_vl_moe_text").to_dict(), vision_config=vision)
    torch.manual_seed(0)
    multimodal = load_controlled(zoo.save(T.Qwen3VLMoeForConditionalGeneration(config), tmp_path / "vl", tokenizer))
    assert multimodal.controller_names == [f"model.language_model.layers.{i}.mlp.gate" for i in range(2)]
    with torch.no_grad():
        logits, values = multimodal.capture_run(ids)
        assert torch.equal(multimodal.replay_run(ids, values), logits)
    switch_config = T.SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=64, d_ff=64, d_kv=16, num_heads=4, num_layers=2, num_decoder_layers=2, num_experts=4
    )
    switch = T.SwitchTransformersForConditionalGeneration(switch_config)
    with pytest.raises(UserError) as excinfo:
        load_controlled(zoo.save(switch, tmp_path / "switch", tokenizer))
    assert "encoder-decoder" in one_line(excinfo)


def test_a_skip_routing_round_trips_also_for_an_expert_whose_weight_underflowed():
    """Zaya masks a token routed to its skip class as expert 0 with weight 0; a real expert 2 whose weight
    underflowed to 0 must come back as expert 2 (the live experts computed it)."""
    from fca_workbench.adapters.routers import OUTPUTS

    unpack, pack = OUTPUTS["skip_class"]
    logits = torch.zeros(3, 5)
    weights, index = torch.tensor([[0.0], [0.0], [0.7]]), torch.tensor([[0], [2], [1]])
    states = torch.zeros(1, 3, 8)
    _, _, canonical, rest = unpack((logits, weights, index, states))
    assert canonical.flatten().tolist() == [4, 2, 1]  # the skip class is E = 4
    replayed = pack(logits, weights, canonical, rest)
    assert torch.equal(replayed[1], weights) and torch.equal(replayed[2], index) and replayed[3] is states
