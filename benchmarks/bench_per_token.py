"""Writing ``per_token_nll``: the pandas writer against the per-value Python loop it replaced.

    .venv/bin/python benchmarks/bench_per_token.py [--windows 727] [--window 256] [--repeats 3]

On synthetic NLL tensors of the full eval set's shape (727 windows x 255 predicted positions x 8 conditions),
times the old loop (kept here verbatim as the reference), the new gzip CSV and the new Parquet, checks
that the old and new CSV text is identical, and writes the ratios (best of ``--repeats``) to
benchmarks/results/bench_per_token.json and .md.
"""

import argparse
import gzip
import io

import torch
from results_file import write_results
from timing import best_of

from fca_workbench.results.binding import binding, binding_text
from fca_workbench.results.conditions import CONDITIONS
from fca_workbench.results.per_token import per_token_csv, per_token_frame, per_token_parquet

BOUND = binding_text(binding("0" * 64, {"eval": "0" * 64}))  # a binding of the size a real one has


def loop_writer(per_token: dict[str, torch.Tensor], windows: torch.Tensor) -> bytes:
    """The writer before pandas (fca_workbench/audit.py ``per_token_table``), one formatted value at a time."""
    names = list(per_token)
    columns = torch.stack([per_token[name].float() for name in names], dim=-1)  # [N, T-1, C]
    text = io.StringIO()
    text.write("window,position,target_token," + ",".join(names) + "\n")
    for w in range(columns.shape[0]):
        for t in range(columns.shape[1]):
            values = ",".join(f"{v:.6f}" for v in columns[w, t].tolist())
            text.write(f"{w},{t + 1},{int(windows[w, t + 1])},{values}\n")
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        gz.write(text.getvalue().encode())
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=727)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 50_000, (args.windows, args.window), generator=generator)
    per_token = {c: torch.rand(args.windows, args.window - 1, generator=generator) * 12 for c in CONDITIONS}

    loop_s, old = best_of(args.repeats, lambda: loop_writer(per_token, windows))
    csv_s, new = best_of(args.repeats, lambda: per_token_csv(per_token_frame(per_token, windows), BOUND))
    if gzip.decompress(old) != gzip.decompress(new):
        raise SystemExit("the pandas CSV differs from the loop's text")
    parquet_s, parquet = best_of(args.repeats, lambda: per_token_parquet(per_token_frame(per_token, windows), BOUND))
    rows = args.windows * (args.window - 1)
    result = {
        "shape": [args.windows, args.window - 1, len(CONDITIONS)],
        "rows": rows,
        "repeats": args.repeats,
        "loop_csv_s": loop_s,
        "pandas_csv_s": csv_s,
        "pandas_parquet_s": parquet_s,
        "csv_bytes": len(new),
        "parquet_bytes": len(parquet),
        "identical_csv_text": True,
        "speedup_csv_loop_over_pandas": loop_s / csv_s,
        "speedup_loop_csv_over_parquet": loop_s / parquet_s,
    }
    lines = [
        f"# per_token_nll writer ({args.windows} windows x {args.window - 1} positions x {len(CONDITIONS)} conditions, "
        f"{rows:,} rows, best of {args.repeats})",
        "",
        "| writer | seconds | loop / this | size |",
        "|---|---:|---:|---:|",
        f"| per-value Python loop, gzip level 9 CSV (before) | {loop_s:.2f} | 1.00 | {len(old) / 2**20:.1f} MiB |",
        f"| pandas, gzip level 1 CSV (now; identical text) | {csv_s:.2f} | {loop_s / csv_s:.2f} | {len(new) / 2**20:.1f} MiB |",
        f"| pandas, Parquet (now, with pyarrow) | {parquet_s:.2f} | {loop_s / parquet_s:.2f} | "
        f"{len(parquet) / 2**20:.1f} MiB |",
        "",
        "Each time includes building the DataFrame from the tensors; an audit with pyarrow writes both files.",
    ]
    write_results("bench_per_token", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
