"""benchmarks/bench_real_shapes.py at small widths (``--tiny``): every shape runs through the audit's own
capture and replay, and its JSON holds every figure the results page shows, each ratio finite and positive."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RATIOS = {
    "capture_over_forward_nll",
    "first_capture_over_forward_nll",
    "replay_over_forward_nll",
    "cache_over_coefficients",
    "cache_over_stored_tensors",
    "peak_rss_over_weights_batch",
    "forward_peak_rss_over_weights_batch",
}
ROUTED = {"mixtral-8x7b-2l", "olmoe-1b-7b-2l"}
# per token: layers x routing classes (or slot width) x 4 bytes (fp32), from the tiny configs
COEFFICIENT_BYTES = {"mixtral-8x7b-2l": 2 * 8 * 4, "olmoe-1b-7b-2l": 2 * 16 * 4, "mamba-2.8b-2l": 2 * (4 + 2 * 8) * 4}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The script as a module (its folder on ``sys.path``, as when it is run), and its results of one round
    per shape in float32."""
    folder = str(ROOT / "benchmarks")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(folder)
        spec = importlib.util.spec_from_file_location("bench_real_shapes", ROOT / "benchmarks" / "bench_real_shapes.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = tmp_path_factory.mktemp("real_shapes")
        for shape in module.SHAPES:
            assert (
                module.main(["--tiny", "--shape", shape, "--dtype", "float32", "--repeats", "1", "--out", str(out)])
                == 0
            )
    return module, json.loads((out / "real_shapes.json").read_text()), (out / "real_shapes.md").read_text()


def test_every_shape_gives_every_ratio_finite_and_positive(bench):
    module, results, _ = bench
    assert set(results["runs"]) == {f"{s}/float32/cpu" for s in module.SHAPES}
    for key, run in results["runs"].items():
        shape = run["shape"]
        expected = RATIOS | ({"eager_over_default_experts"} if shape in ROUTED else set())
        assert set(run["ratios"]) == expected, key
        assert all(math.isfinite(v) and v > 0 for v in run["ratios"].values()), (key, run["ratios"])
        assert run["tiny"] and run["threads"] == module.THREADS and run["batch"] == [1, module.SHAPES[shape][4]]
        assert run["correct_equals_unperturbed"], key  # the audit's correct replay repeats capture bit for bit
        assert (run["static_exactness"] is not None) == (shape in ROUTED), key


def test_the_coefficient_bytes_are_the_slots_in_fp32(bench):
    _, results, _ = bench
    for shape, per_token in COEFFICIENT_BYTES.items():
        run = results["runs"][f"{shape}/float32/cpu"]
        assert run["coefficient_bytes_per_token"] == per_token
        # the cache stores at least the coefficients, and every stored tensor plus headers and manifest
        assert run["cache_bytes_per_token"] > run["stored_tensor_bytes_per_token"] >= per_token


def test_the_routed_shapes_compare_the_default_experts_on_every_static_condition(bench):
    module, results, markdown = bench
    for shape in ROUTED:
        run = results["runs"][f"{shape}/float32/cpu"]
        assert run["default_experts_implementation"] == {"": "grouped_mm"}
        assert set(run["static_exactness"]) == set(module.STATIC)
        for found in run["static_exactness"].values():
            assert found["bit_identical"] == (found["max_abs_diff"] == 0)
    assert markdown.count("(tiny)") == len(results["runs"]) and "layer_mean_topk" in markdown


PROBE = """
import hashlib, resource, torch
from fca_workbench.foundation.fingerprints import fingerprint_tensor
weights = torch.randn(64, 1024, 1024)  # 256 MiB, as one expert tensor of a real MoE is GiBs
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
digest = fingerprint_tensor(weights)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
expected = hashlib.sha256(b"(64, 1024, 1024)|torch.float32" + weights.numpy().tobytes()).hexdigest()
print(digest == expected, grown)
"""


def test_fingerprinting_weights_hashes_their_bytes_without_a_copy_of_them():
    """The model fingerprint every capture takes raised the audit's peak RSS by its largest tensor (a bytes copy)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    same, grown_mib = out.stdout.split()
    assert same == "True"
    assert float(grown_mib) < 32, f"peak RSS grew {grown_mib} MiB hashing 256 MiB"
