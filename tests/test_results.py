"""Audit results as DataFrames: ``load_audit`` equals ``audit.json`` value for value on a fresh audit of each
family, its columns and dtypes are pinned, the per-token file is written through pandas with the old format,
written tables read back to their numbers, and bad folders are one-line errors."""

import gzip
import io
import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

import fca_workbench
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import tables
from fca_workbench.results import per_token as results_module
from fca_workbench.results.binding import binding
from fca_workbench.results.conditions import CONDITIONS
from fca_workbench.results.per_token import PER_TOKEN_CSV, PER_TOKEN_PARQUET, per_token_files

ARCHS = ("dense", "featuregate", "muddpythia")
BOUND = binding("0" * 64, {"eval": "1" * 64})  # what a writer is given to bind its file to


def settings(checkpoint):
    return AuditSettings(
        checkpoint=str(checkpoint), window=32, max_windows=4, batch_size=4, resamples=200, latency_repeats=1
    )


@pytest.fixture(scope="module")
def audits(tiny_checkpoints, tmp_path_factory):
    """A fresh audit folder of every family, named like a checkpoint (``<arch>-s0``)."""
    root = tmp_path_factory.mktemp("results")
    folders = {}
    for arch in ARCHS:
        checkpoint = shutil.copytree(tiny_checkpoints[arch], root / "checkpoints" / f"{arch}-s0")
        folders[arch] = root / "audits" / f"{arch}-s0"
        run_audit(settings(checkpoint), folders[arch])
    return folders


def audit_json(folder):
    return json.loads((folder / "audit.json").read_text())


@pytest.mark.parametrize("arch", ARCHS)
def test_load_audit_equals_audit_json(audits, arch):
    folder = audits[arch]
    audit, results = audit_json(folder), fca_workbench.load_audit(folder / "audit.json")
    assert (results.model, results.data, results.settings, results.verdicts) == (
        audit["model"],
        audit["data"],
        audit["settings"],
        audit["verdict"],
    )
    assert results.conditions["condition"].tolist() == list(audit["conditions"])
    for row in results.conditions.to_dict("records"):
        figures = audit["conditions"][row["condition"]]
        assert (row["nll"], row["delta"]) == (figures["nll"], figures["delta"])
        assert [row["ci95_lo"], row["ci95_hi"]] == figures["ci95"]
        assert [row["delta_ci95_lo"], row["delta_ci95_hi"]] == figures["delta_ci95"]
    assert results.retention["profile"].tolist() == list(audit["retention"])
    for row in results.retention.to_dict("records"):
        retention = audit["retention"][row["profile"]]
        expected = [retention["value"], *retention["ci95"], retention["denominator"]["value"]]
        expected += retention["denominator"]["ci95"]
        shown = [row[k] for k in ("value", "ci95_lo", "ci95_hi", "gap", "gap_ci95_lo", "gap_ci95_hi")]
        assert [None if v != v else v for v in shown] == expected  # NaN: an unresolved retention's None
    if audit["variance"] is None:
        assert results.variance.empty
    else:
        assert results.variance.iloc[0].to_dict() == {
            **audit["variance"],
            **{k: audit["variation"][k] for k in ("within_std", "cv")},
        }
    runs = {"model": audit["execution"], "positive_control": audit["execution"].get("positive_control")}
    runs = {k: v for k, v in runs.items() if v}
    assert results.execution["run"].tolist() == list(runs)
    for row in results.execution.to_dict("records"):
        assert all(row[k] == runs[row["run"]][k] for k in row if k != "run")
    assert results.per_layer is None  # this audit has no per-layer sweep


@pytest.mark.parametrize("arch", ARCHS)
def test_per_token_is_tidy_and_gives_the_audits_nll(audits, arch):
    folder = audits[arch]
    audit, per_token = audit_json(folder), fca_workbench.load_audit(folder).per_token
    windows = ReplaySession.open(settings(audit["settings"]["checkpoint"])).windows("eval")
    n, t = windows.shape
    assert len(per_token) == n * (t - 1) * len(audit["conditions"])
    for name, figures in audit["conditions"].items():
        rows = per_token[per_token["condition"] == name].sort_values(["window", "position"])
        assert rows["target_token"].tolist() == windows[:, 1:].reshape(-1).tolist()  # the tokens the audit read
        assert rows["position"].tolist() == list(range(1, t)) * n
        window_means = rows.groupby("window")["nll"].mean()
        assert math.isclose(window_means.mean(), figures["nll"], abs_tol=1e-6)


def test_parquet_and_csv_hold_the_same_per_token_nll(audits, tmp_path):
    with_parquet = fca_workbench.load_audit(audits["featuregate"]).per_token
    csv_only = shutil.copytree(
        audits["featuregate"], tmp_path / "csv", ignore=shutil.ignore_patterns("cache", "*.parquet")
    )
    from_csv = fca_workbench.load_audit(csv_only).per_token
    assert (audits["featuregate"] / PER_TOKEN_PARQUET).is_file() and not (csv_only / PER_TOKEN_PARQUET).exists()
    assert from_csv.drop(columns="nll").equals(with_parquet.drop(columns="nll"))
    assert np.abs(from_csv["nll"] - with_parquet["nll"]).max() <= 5e-7 + 1e-12  # 6 decimals, rounded


def test_per_token_writer_keeps_the_format_and_is_deterministic(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 1000, (3, 9), generator=generator)
    per_token = {name: torch.rand(3, 8, generator=generator) * 10 for name in CONDITIONS}
    files = per_token_files(per_token, windows, BOUND)
    assert files == per_token_files(per_token, windows, BOUND)
    assert files[PER_TOKEN_CSV][4:8] == b"\0\0\0\0"  # gzip mtime 0
    expected = ["window,position,target_token," + ",".join(CONDITIONS)] + [
        f"{w},{t + 1},{int(windows[w, t + 1])}," + ",".join(f"{float(per_token[c][w, t]):.6f}" for c in CONDITIONS)
        for w in range(3)
        for t in range(8)
    ]
    assert gzip.decompress(files[PER_TOKEN_CSV]).decode() == "\n".join(expected) + "\n"
    wide = pd.read_parquet(io.BytesIO(files[PER_TOKEN_PARQUET]))
    for name in CONDITIONS:  # Parquet holds the exact float32 values
        assert np.array_equal(wide[name].to_numpy(), per_token[name].reshape(-1).numpy())
    monkeypatch.setattr(results_module, "_has_pyarrow", lambda: False)  # without the parquet extra: the CSV only
    assert per_token_files(per_token, windows, BOUND) == {PER_TOKEN_CSV: files[PER_TOKEN_CSV]}


def test_per_layer_rows_when_the_audit_has_them(audits, tmp_path):
    folder = shutil.copytree(audits["featuregate"], tmp_path / "swept", ignore=shutil.ignore_patterns("cache"))
    audit = audit_json(folder)
    audit["per_layer"] = [
        {"layer": l, "condition": c, "nll": 5.0 + l + i / 8, "delta": l - i / 3, "delta_ci95": [l - 1.0, l + 0.5 + i]}
        for l in range(2)
        for i, c in enumerate(("cross_input", "layer_mean"))
    ]
    (folder / "audit.json").write_text(json.dumps(audit))
    frame = fca_workbench.load_audit(folder).per_layer
    assert frame.to_dict("records") == [
        {
            "layer": r["layer"],
            "condition": r["condition"],
            "nll": r["nll"],
            "delta": r["delta"],
            "delta_ci95_lo": r["delta_ci95"][0],
            "delta_ci95_hi": r["delta_ci95"][1],
        }
        for r in audit["per_layer"]
    ]
    collection = fca_workbench.load_audits([folder, audits["dense"]])
    assert collection.per_layer["model"].tolist() == ["featuregate-s0"] * 4  # the Dense audit has none


def test_columns_and_dtypes_are_pinned(audits):
    results = fca_workbench.load_audit(audits["featuregate"])
    dtypes = {
        name: {c: str(t) for c, t in getattr(results, name).dtypes.items()}
        for name in ("conditions", "retention", "variance", "execution", "per_token")
    }
    f8, i8 = "float64", "int64"
    assert dtypes == {
        "conditions": {
            "condition": "str",
            "nll": f8,
            "ci95_lo": f8,
            "ci95_hi": f8,
            "delta": f8,
            "delta_ci95_lo": f8,
            "delta_ci95_hi": f8,
        },
        "retention": {
            "profile": "str",
            **{k: f8 for k in ("value", "ci95_lo", "ci95_hi", "gap", "gap_ci95_lo", "gap_ci95_hi")},
        },
        "variance": {
            "r2_layer": f8,
            "r2_layer_slot": f8,
            "r2_layer_slot_position": f8,
            "r2_layer_slot_window": f8,
            "within_std": f8,
            "cv": f8,
        },
        "execution": {
            "run": "str",
            "blocks_executed": i8,
            "blocks_total": i8,
            "fraction_executed": f8,
            "controller_calls": i8,
            "flops": i8,
            "latency_ms": f8,
            "dense_latency_ms": f8,
            "latency_ratio_vs_dense": f8,
        },
        "per_token": {"window": i8, "position": i8, "target_token": i8, "condition": "category", "nll": f8},
    }
    assert list(results.per_token["condition"].cat.categories) == list(CONDITIONS)
    collection = fca_workbench.load_audits(audits["featuregate"].parent)
    for name in ("conditions", "retention", "variance", "execution", "per_token"):
        frame = getattr(collection, name)
        assert list(frame.columns[:2]) == ["model", "arch"]
        assert {c: str(t) for c, t in frame.dtypes.items() if c not in ("model", "arch")} == dtypes[name]


def test_load_audits_concatenates_with_a_model_column(audits):
    collection = fca_workbench.load_audits(audits["dense"].parent)
    names = [f"{arch}-s0" for arch in ARCHS]
    assert [a.name for a in collection.audits] == names
    conditions = collection.conditions
    for name, arch in zip(names, ARCHS):
        own = conditions[conditions["model"] == name]
        assert set(own["arch"]) == {arch}
        assert own["delta"].tolist() == [f["delta"] for f in audit_json(audits[arch])["conditions"].values()]
    assert len(collection.per_token) == sum(len(a.per_token) for a in collection.audits)
    ranked = conditions.sort_values("delta", ascending=False)
    assert ranked["delta"].is_monotonic_decreasing and ranked.iloc[0]["condition"] != "correct"


NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?")


def parse_numbers(cell: str) -> list[float]:
    return [float(m.replace(",", "").rstrip("%")) / (100 if m.endswith("%") else 1) for m in NUMBER.findall(cell)]


def shown_values(column, row) -> list:
    """The exact values a rounded cell shows: both CI ends, mean and (over 2+ seeds) sd, or the value."""
    values = [row[p] for p in column.parts]
    if column.form == "msd":
        return values[:2] if values[2] >= 2 else values[:1]
    return values


def tolerance(column, value) -> float:
    if column.kind == "int":
        return 0.0
    if column.kind == "sci":
        return abs(value) * 0.5 * 10 ** -(column.digits - 1) + 1e-12
    return (
        0.5 * 10 ** -(column.digits - (2 if column.kind == "pct" else 0)) * (0.01 if column.kind == "pct" else 1)
        + 1e-12
    )


def latex_cells(text: str) -> list[list[str]]:
    body = text.split("\\midrule\n")[1].split("\\bottomrule")[0]
    plain = body.replace("$\\pm$", "±").replace("\\%", "%").replace("\\_", "_")
    return [[cell.strip() for cell in line.rstrip(" \\").split(" & ")] for line in plain.strip().splitlines()]


def markdown_cells(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")][2:]  # header, rule
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_written_tables_read_back_to_their_numbers(audits, tmp_path):
    dicts = [audit_json(audits[arch]) for arch in ARCHS]
    checked = 0
    for table in (
        tables.assignment_table(dicts),
        tables.retention_table(dicts),
        tables.execution_table(dicts),
        tables.retention_seed_table(dicts + dicts),
        tables.variation_seed_table(dicts),
    ):
        paths = tables.write_table(table, tmp_path)
        exact = pd.read_csv(paths["csv"])
        assert list(exact.columns) == list(table.columns)
        for column in table.columns:  # CSV: every number as it is
            if table[column].dtype != "str":
                assert exact[column].tolist() == pytest.approx(
                    table[column].astype("float64").tolist(), rel=0, abs=0, nan_ok=True
                )
        columns = table.attrs["columns"]
        for cells in (markdown_cells(paths["md"].read_text()), latex_cells(paths["tex"].read_text())):
            assert len(cells) == len(table)
            for row_cells, row in zip(cells, table.to_dict("records")):
                for cell, column in zip(row_cells, columns):
                    if column.kind == "text":
                        assert cell == row[column.key]
                        continue
                    expected = shown_values(column, row)
                    if any(pd.isna(v) for v in expected):
                        assert cell == "n/a"
                        continue
                    parsed = parse_numbers(cell)
                    assert len(parsed) == len(expected), (cell, column)
                    for got, want in zip(parsed, expected):
                        assert abs(got - want) <= tolerance(column, want), (cell, want, column)
                        checked += 1
    assert checked > 100


def test_bad_folders_are_one_line_errors(audits, tmp_path):
    good = (audits["featuregate"] / "audit.json").read_text()
    cases = {
        "missing": None,
        "empty": "",
        "truncated": good[: len(good) // 2],
        "foreign": json.dumps({"rows": [1]}),
        "a list": "[1, 2]",
        "incomplete": json.dumps({**json.loads(good), "execution": {"flops": 1}}),
    }
    expected = {
        "missing": "no audit.json",
        "empty": "not a complete audit.json",
        "truncated": "not a complete audit.json",
        "foreign": "not an FCA audit",
        "a list": "not an FCA audit",
        "incomplete": "not a valid FCA audit",
    }
    for name, text in cases.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        if text is not None:
            (folder / "audit.json").write_text(text)
        with pytest.raises(UserError) as error:
            fca_workbench.load_audit(folder)
        assert expected[name] in str(error.value) and "\n" not in str(error.value), str(error.value)
    with pytest.raises(UserError, match="no audit folders"):
        fca_workbench.load_audits(tmp_path / "missing")
    damaged = shutil.copytree(
        audits["featuregate"], tmp_path / "damaged", ignore=shutil.ignore_patterns("cache", "*.parquet")
    )
    data = (damaged / PER_TOKEN_CSV).read_bytes()
    (damaged / PER_TOKEN_CSV).write_bytes(data[: len(data) // 2])
    results = fca_workbench.load_audit(damaged)  # the figures load; the per-token file fails when asked for
    assert len(results.conditions) == len(CONDITIONS)
    with pytest.raises(UserError, match="cannot be read") as error:
        _ = results.per_token
    assert "\n" not in str(error.value)


def test_profiles_that_are_one_tensor_save_and_load(tmp_path):
    """A controller that routes to no experts has ``layer_mean_topk`` equal to ``layer_mean`` (one tensor);
    the profiles file keeps both, each with its own values."""
    from safetensors.torch import load_file

    from fca_workbench.results.profiles import profiles_from_tensors, save_profiles

    shared = torch.arange(6.0).reshape(2, 3)
    save_profiles(tmp_path / "p.safetensors", {"layer_mean": [shared], "layer_mean_topk": [shared]}, BOUND)
    loaded = profiles_from_tensors(load_file(tmp_path / "p.safetensors"))
    assert torch.equal(loaded["layer_mean"][0], shared) and torch.equal(loaded["layer_mean_topk"][0], shared)


def test_notebook_tables_are_safe_in_a_spreadsheet_and_keep_their_rows(tmp_path):
    """``tables/*.csv`` as the dashboard's downloads: a model named like a formula is shown as text, a line
    break in a name neither splits the CSV row nor adds a Markdown row."""
    import csv as csv_module

    from fca_workbench.results.tabular import Column, make_table, write_table

    names = ["@SUM(1)", "\t=1+1", "two\nlines", "-0.5"]
    columns = [Column("model", "model", "text"), Column("nll", "NLL")]
    table = make_table("names", "Names", columns, [{"model": n, "nll": float(i)} for i, n in enumerate(names)])
    paths = write_table(table, tmp_path)
    rows = list(csv_module.reader(paths["csv"].read_text().splitlines(keepends=True)))
    assert [row[0] for row in rows[1:]] == ["'@SUM(1)", "'\t=1+1", "two\nlines", "-0.5"]
    assert [row[1] for row in rows[1:]] == ["0.0", "1.0", "2.0", "3.0"]
    markdown = [line for line in paths["md"].read_text().splitlines() if line.startswith("|")]
    assert len(markdown) == 2 + len(names) and "two lines" in markdown[4]
