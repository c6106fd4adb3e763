"""The execution audit: does the model skip computation because of its coefficients, and is it faster?

Coefficient variation and assignment dependence say nothing about *conditional execution*: a model can
emit input-dependent gates and still run every block on every token. This module measures what actually
runs, with forward hooks (auditing only; the models are not changed): blocks and controllers called, and
token-rows entering each branch module, plus FLOPs and latency against a shape-matched Dense. The
positive control (a FeatureGate that really skips MLP rows) shows the audit can see a saving when one
exists.
"""

import contextlib
import math
import statistics
import time
from typing import cast

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fca_workbench.adapters.families import EXACT_MIXTURE_KERNELS
from fca_workbench.adapters.kinds import top_k
from fca_workbench.adapters.placement import execution_device
from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel
from fca_workbench.audit.capture import CoefficientCache

Runnable = nn.Module | ControlledModel  # what is counted and timed: a model, its baseline, a positive control


def _device(model: Runnable) -> torch.device:
    return execution_device(cast(nn.Module, model))  # every controlled model is a module


def _batches(windows: torch.Tensor, batch_size: int):
    for start in range(0, windows.shape[0], batch_size):
        yield windows[start : start + batch_size]


def _token_rows(args, kwargs) -> int:
    """Token-rows in a module's first tensor input: every dimension but the last (features)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.numel() // value.shape[-1]
    return 0


@contextlib.contextmanager
def _counting_hooks(modules: list[nn.Module], on_call):
    """Register ``on_call(module, args, kwargs)`` as a forward hook on each module (once per module) and
    remove every hook on exit, whatever happens, so an audit never leaves the model instrumented."""
    handles = []
    try:
        for module in {id(m): m for m in modules}.values():
            handles.append(
                module.register_forward_hook(
                    lambda mod, args, kwargs, out: on_call(mod, args, kwargs), with_kwargs=True
                )
            )
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_execution(model: ControlledModel, windows: torch.Tensor, batch_size: int = 16) -> dict:
    """Run unperturbed inference over ``windows [N, T]`` and count what actually executed.

    - ``blocks_total``: blocks present per forward × forwards (one forward per batch of ``batch_size``);
      ``blocks_executed``: block forward calls observed.
    - ``controller_calls``: controller forward calls (0 for Dense).
    - ``branch_tokens_total``: token-rows present at each branch module (``model.block_branches``) summed over
      blocks and forwards, i.e. B·T per branch per forward; ``branch_tokens_executed``: token-rows that
      actually entered a branch module.
    - ``fraction_executed``: branch_tokens_executed / branch_tokens_total where branches are known,
      else blocks_executed / blocks_total.
    """
    model.eval()
    blocks = list(model.blocks)
    branches = [module for index in range(len(blocks)) for module in model.block_branches(index)]
    controllers = list(model.controllers)
    counts = dict.fromkeys(("blocks", "controllers", "rows"), 0)

    def count(key):
        def on_call(module, args, kwargs):
            counts[key] += 1

        return on_call

    def count_rows(module, args, kwargs):
        counts["rows"] += _token_rows(args, kwargs)

    forwards = present_rows = 0
    device = _device(model)
    with (
        torch.no_grad(),
        _counting_hooks(blocks, count("blocks")),
        _counting_hooks(controllers, count("controllers")),
        _counting_hooks(branches, count_rows),
    ):
        for batch in _batches(windows, batch_size):
            model(batch.to(device))
            forwards += 1
            present_rows += batch.numel() * len(branches)

    result: dict[str, float] = {
        # a looped model runs a block several times per forward: every call it made counts
        "blocks_total": max(len(blocks) * forwards, counts["blocks"]),
        "blocks_executed": counts["blocks"],
        "controller_calls": counts["controllers"],
        "branch_tokens_total": present_rows,
        "branch_tokens_executed": counts["rows"],
    }
    if present_rows:
        result["fraction_executed"] = counts["rows"] / present_rows
    else:
        result["fraction_executed"] = counts["blocks"] / result["blocks_total"] if forwards else 0.0
    return result


@contextlib.contextmanager
def _no_parameter_grads(model: Runnable):
    """Every parameter ``requires_grad=False`` for the block, put back on exit: a view of a parameter taken
    under ``no_grad`` still requires grad but has no gradient function, which ``FlopCounterMode``'s module
    tracker cannot hook (experts that index views of their weights call modules with them)."""
    wanted = [p for p in model.parameters() if p.requires_grad]
    try:
        for parameter in wanted:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter in wanted:
            parameter.requires_grad_(True)


def _grouped_mm_flops(input_shape, weight_shape, *args, out_shape, **kwargs) -> int:
    """``aten._grouped_mm`` (transformers' default experts kernel), which ``torch.utils.flop_counter`` does not
    count: rows [S, K] each through one group's [K, N] (the experts: S = tokens × k), groups along K (2-D × 2-D),
    or a batch of [M, K] × [K, N] (3-D)."""
    if len(weight_shape) == 3 and len(input_shape) == 2:
        return 2 * input_shape[0] * input_shape[1] * weight_shape[2]
    if len(weight_shape) == 2 and len(input_shape) == 2:
        return 2 * input_shape[0] * input_shape[1] * weight_shape[1]
    return 2 * math.prod(out_shape) * input_shape[-1]


def count_flops(model: Runnable, windows_batch: torch.Tensor) -> int:
    """FLOPs of one unperturbed forward of the batch, as ``torch.utils.flop_counter`` counts them (matmuls
    and attention, grouped ones too; a skipped row's matmuls are simply absent)."""
    model.eval()
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_mm_flops})
    with torch.no_grad(), _no_parameter_grads(model), counter:
        model(windows_batch.to(_device(model)))
    return int(counter.get_total_flops())


def _time_forward(model: Runnable, batch: torch.Tensor) -> float:
    """Milliseconds of one forward: CUDA events around it on GPU (kernels are asynchronous), else wall time."""
    if batch.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        model(batch)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    model(batch)
    return (time.perf_counter() - began) * 1000.0


def _interleaved_latencies(models: list[Runnable], batch: torch.Tensor, repeats: int, warmup: int) -> list[float]:
    """Median forward latency (ms) of each model, repeats interleaved (a, b, a, b, ...) so that load drifting
    on a shared machine hits every model alike."""
    for model in models:
        model.eval()
    batch = batch.to(_device(models[0]))
    times: list[list[float]] = [[] for _ in models]
    with torch.no_grad():
        for _ in range(warmup):
            for model in models:
                _time_forward(model, batch)
        for _ in range(repeats):
            for model, samples in zip(models, times):
                samples.append(_time_forward(model, batch))
    return [statistics.median(samples) for samples in times]


def measure_latency(model: Runnable, batch: torch.Tensor, repeats: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of a no-grad forward of ``batch``, after ``warmup`` untimed forwards."""
    return _interleaved_latencies([model], batch, repeats, warmup)[0]


def execution_audit(model: ControlledModel, windows: torch.Tensor, batch_size: int = 16, repeats: int = 10) -> dict:
    """The ``execution`` section of ``audit.json``: counts over all windows; FLOPs and latency on the first
    ``batch_size`` windows, latency measured against the model's ``latency_baseline`` (a fresh shape-matched
    Dense for the native families, the static mixture for routers) in the same call on the same batch."""
    result = count_execution(model, windows, batch_size)
    batch = windows[:batch_size]
    baseline, baseline_model = model.latency_baseline()
    latency, baseline_latency = _interleaved_latencies([model, baseline_model], batch, repeats, warmup=2)
    return {
        "baseline": baseline,
        "baseline_flops": count_flops(baseline_model, batch),
        "blocks_total": result["blocks_total"],
        "blocks_executed": result["blocks_executed"],
        "fraction_executed": result["fraction_executed"],
        "controller_calls": result["controller_calls"],
        "flops": count_flops(model, batch),
        "latency_ms": latency,
        "dense_latency_ms": baseline_latency,  # audit.json names the baseline's latency so, whatever the baseline
        "latency_ratio_vs_dense": latency / baseline_latency,
        "branch_tokens_total": result["branch_tokens_total"],
        "branch_tokens_executed": result["branch_tokens_executed"],
    }


def expert_execution(model: ControlledModel, cache: CoefficientCache) -> dict:
    """For models whose controllers select experts (routers), from the cached routing of every eval window
    (no extra forward): ``expert_fraction_executed`` = expert evaluations run / (tokens × experts), overall
    and per router (k/E for top-k), each router's per-expert load (tokens routed to the expert / tokens), and
    ``zero_computation``: the share of its k routing slots that went to zero-computation experts (which run
    nothing and are not among the E experts); the experts kernel capture and replay ran through, and whether a
    static mixture is exact under it. Empty for models without routers."""
    counts: dict[int, torch.Tensor] = {}
    slots: dict[int, int] = {}  # routing slots (tokens × k) per router
    tokens = 0
    if not model.controllers:
        return {}
    for indices in cache.shard_indices():
        tokens += len(indices) * cache.manifest["window"]
        for index, value in enumerate(cache.values(indices)):
            count = model.expert_counts(index, value)
            if count is not None:
                counts[index] = count if index not in counts else counts[index] + count
                slots[index] = slots.get(index, 0) + value[COEFFICIENT].shape[:2].numel() * (top_k(value) or 0)
    if not counts:
        return {}
    names = cache.manifest.get("controllers") or list(model.controller_names)
    implementation = model.experts_implementation
    run = sum(int(c.sum()) for c in counts.values())
    present = sum(tokens * len(c) for c in counts.values())
    return {
        "expert_fraction_executed": run / present,
        "experts": {
            "controllers": [names[i] for i in counts],
            "experts": [len(c) for c in counts.values()],
            "fraction_executed": [int(c.sum()) / (tokens * len(c)) for c in counts.values()],
            "load": [(c.double() / tokens).tolist() for c in counts.values()],
            "zero_computation": [(slots[i] - int(c.sum())) / slots[i] if slots[i] else 0.0 for i, c in counts.items()],
            "implementation": implementation,
            "static_mixture_exact": None if implementation is None else implementation in EXACT_MIXTURE_KERNELS,
        },
    }
