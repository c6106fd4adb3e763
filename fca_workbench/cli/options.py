"""The ``fca`` command line's options: every flag, its type (``fca_workbench.foundation.flags``) and its help, apart
from the commands that run them (``fca_workbench.cli.COMMANDS``). Nothing here imports torch, so ``fca --help``
stays fast."""

import argparse
from typing import Any, NoReturn

import fca_workbench
from fca_workbench.audit.settings import CPU_BATCH_SIZE, DEFAULT_WINDOW, DTYPE_NAMES, default
from fca_workbench.foundation import flags
from fca_workbench.results.conditions import condition_names
from fca_workbench.training.train_settings import NORMED, ROUTER_INPUTS, TrainSettings


def trained(name: str) -> object:
    """``fca train``'s default for setting ``name``, as ``TrainSettings`` declares it."""
    return flags.declared_default(TrainSettings, name)


def add_audit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval", help='eval text: UTF-8 .txt or JSONL {"text": ...} (default: shipped eval split)')
    parser.add_argument("--calib", help="calibration text for the static profiles (default: shipped split)")
    parser.add_argument(
        "--window",
        type=flags.window_size,
        default=default("window"),
        help=f"tokens per window (default: min({DEFAULT_WINDOW}, context))",
    )
    parser.add_argument(
        "--max-windows",
        type=flags.positive_int,
        default=default("max_windows"),
        help="use N windows of each set, spread evenly over it (default: all)",
    )
    parser.add_argument(
        "--per-layer",
        action="store_true",
        help="also apply every condition at each layer alone (audit.json per_layer; prefix reuse)",
    )
    add_model_options(parser)
    parser.add_argument(
        "--seed", type=flags.seed, default=default("seed"), help="seeds the derangement, shuffles and bootstrap"
    )
    parser.add_argument(
        "--batch-size",
        type=flags.positive_int,
        default=default("batch_size"),
        help=f"windows per batch (default: {CPU_BATCH_SIZE} on CPU; on CUDA as many as fit in free GPU memory)",
    )
    parser.add_argument("--out", default=None, help="output folder (default: results/audit-<checkpoint>)")
    parser.add_argument(
        "--resamples",
        type=flags.positive_int,
        default=default("resamples"),
        help=f"bootstrap resamples of the intervals (default {default('resamples')})",
    )
    parser.add_argument(
        "--latency-repeats",
        type=flags.positive_int,
        default=default("latency_repeats"),
        help=f"timed forwards of the model and of its baseline (default {default('latency_repeats')}; 1 for a quick check)",
    )
    controllers = parser.add_mutually_exclusive_group()
    controllers.add_argument(
        "--controllers",
        default=None,
        metavar="REGEX",
        help="more controller modules of a foreign model, beside those found by themselves (MoE routers, "
        "shared-expert gates, selective SSMs and gates): a regex over whole module paths inside the decoder "
        "layers, each output a tensor",
    )
    controllers.add_argument(
        "--only-controllers",
        default=None,
        metavar="REGEX",
        help="like --controllers, but these modules alone are the controllers (the built-in kinds find none)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a foreign checkpoint folder whose config needs its own code RUN THAT CODE",
    )
    parser.add_argument(
        "--lock-wait",
        type=flags.non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another audit using the same cache or output folder (default 0: stop at once)",
    )
    add_placement_options(parser)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Where the model runs and in which dtype, as every command that loads one for an audit takes them."""
    parser.add_argument("--device", default=default("device"), help=f"cpu or cuda (default {default('device')})")
    parser.add_argument(
        "--dtype", default=default("dtype"), help=f"{', '.join(DTYPE_NAMES)} (default {default('dtype')})"
    )


def add_shard_options(parser: argparse.ArgumentParser, assembled: str) -> None:
    """``--shard K/N`` and ``--assemble``: a run's audits split over N nodes, then ``assembled`` from them."""
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--shard",
        type=flags.shard,
        default=None,
        metavar="K/N",
        help="run only every N-th audit of the plan from the K-th (0-based) into --out, and record it there "
        "(docs/guides/cluster.md)",
    )
    split.add_argument(
        "--assemble",
        action="store_true",
        help=f"once every --shard K/N of the same command has finished into --out: check them, then write {assembled}",
    )


def installed_version() -> str:
    """The installed distribution's version (what a bug report needs); a checkout run uninstalled has only the
    source's ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fca-workbench")
    except PackageNotFoundError:
        return fca_workbench.__version__


class VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for, so building the parser stays a blink."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"{parser.prog} {installed_version()}")
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse, with its errors (a bad flag value, a missing argument) one ``fca: error:`` line, exit 2, like
    every other user error; ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fca: error: {self.prog}: {message}\n")


def add_train_options(train: argparse.ArgumentParser) -> None:
    train.add_argument("--seed", type=flags.seed, default=0, help="seeds the weights and the batches (default 0)")
    train.add_argument("--out", required=True, help="checkpoint folder (rerun to resume)")
    train.add_argument("--train", default=None, help="training text (default: the shipped train split)")
    train.add_argument("--layers", type=flags.positive_int, default=None, help="--arch only (default 4)")
    train.add_argument("--width", type=flags.positive_int, default=None, help="--arch only (default 96)")
    train.add_argument("--heads", type=flags.positive_int, default=None, help="--arch only (default 4)")
    train.add_argument(
        "--gate-groups", type=flags.positive_int, default=None, help="FeatureGate groups (default: --heads)"
    )
    train.add_argument(
        "--gate-range", choices=["2sigmoid", "sigmoid", "1+tanh"], default=None, help="FeatureGate (default 2sigmoid)"
    )
    train.add_argument(
        "--gate-input",
        choices=["normed", "raw", "detached"],
        default=None,
        help="what a FeatureGate controller reads: rmsnorm(h) (default), h, or rmsnorm(h) without its gradient",
    )
    train.add_argument(
        "--controller-weight-decay",
        type=flags.non_negative_float,
        default=None,
        help="the controllers' (default: the model's, 0.1)",
    )
    train.add_argument(
        "--controller-lr-mult", type=flags.positive_float, default=1.0, help="controller lr = lr × this (default 1)"
    )
    add_router_options(train)
    for flag, parse, what in (
        ("window", flags.window_size, "tokens per training window"),
        ("steps", flags.positive_int, "optimizer steps in all"),
        ("batch_size", flags.positive_int, "windows per step"),
        ("lr", flags.positive_float, "peak learning rate"),
        ("warmup", flags.positive_int, "linear warm-up steps before the cosine"),
        ("save_every", flags.positive_int, "checkpoint every N steps, and at the end"),
    ):
        declared = trained(flag)
        train.add_argument(
            f"--{flag.replace('_', '-')}", type=parse, default=declared, help=f"{what} (default {declared})"
        )
    train.add_argument(
        "--stop-after",
        type=flags.positive_int,
        default=None,
        help="stop (checkpointed) after N steps of this run (default: run to --steps)",
    )
    train.add_argument("--device", default=trained("device"), help=f"cpu or cuda (default {trained('device')})")
    train.add_argument(
        "--audit-every",
        type=flags.positive_int,
        default=None,
        metavar="N",
        help="mini-audit every N steps and at the end, appended to OUT/audit_log.csv (default: none)",
    )
    train.add_argument(
        "--audit-windows",
        type=flags.bounded(int),  # its range is the mini-audit's (2 windows up to what the texts give)
        default=16,
        metavar="M",
        help="evenly spread eval and calibration windows per mini-audit (default 16)",
    )


def add_router_options(train: argparse.ArgumentParser) -> None:
    """The router-design flags of a ``--hf-config`` mixture of experts (``fca_workbench.training.routing``)."""
    train.add_argument(
        "--router-z-loss",
        type=flags.non_negative_float,
        default=None,
        metavar="WEIGHT",
        help="add WEIGHT x the router z-loss, mean logsumexp(router logits)^2 (default 0)",
    )
    train.add_argument(
        "--router-input",
        choices=ROUTER_INPUTS,
        default=None,
        help=f"what the router reads: the normed hidden state ({NORMED}, default) or it without its gradient",
    )
    train.add_argument(
        "--freeze-routers",
        action="store_true",
        default=None,
        help="keep the routers' weights as they start (an --init static export's zero routers stay zero; default: "
        "they train)",
    )


def add_dashboard_options(dash: argparse.ArgumentParser) -> None:
    dash.add_argument("--port", type=flags.port, default=5006)
    dash.add_argument(
        "--address",
        default="127.0.0.1",
        help="interface to listen on (default: this machine only; any other needs auth or --no-auth)",
    )
    dash.add_argument(
        "--registry",
        default=None,
        help='JSON file {"name": "checkpoint folder", ...} (default: the shipped checkpoints)',
    )
    dash.add_argument(
        "--allow-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a name browsers may reach the server as, besides --address (repeatable); any other Host gets 403",
    )
    dash.add_argument(
        "--allow-websocket-origin",
        action="append",
        default=None,
        metavar="HOST[:PORT]",
        help="a host browsers may reach the server as, and open its websocket from (repeatable)",
    )
    dash.add_argument("--num-threads", type=flags.positive_int, default=None, help="Panel's callback thread pool size")
    dash.add_argument("--basic-auth", default=None, help=argparse.SUPPRESS)  # refused: visible in ps
    dash.add_argument(
        "--basic-auth-file",
        default=None,
        metavar="CREDENTIALS.json",
        help='Panel basic auth: a JSON object {"user": "password", ...} (default: $FCA_BASIC_AUTH)',
    )
    dash.add_argument(
        "--basic-auth-password-file",
        default=None,
        metavar="FILE",
        help="Panel basic auth with one shared password (any user name): a file holding only that password",
    )
    dash.add_argument(
        "--cookie-secret",
        default=None,
        help="secret that signs the login cookie, needed with auth (visible in ps: prefer the next)",
    )
    dash.add_argument(
        "--cookie-secret-file",
        default=None,
        metavar="FILE",
        help="a file holding the cookie secret (default: $FCA_COOKIE_SECRET)",
    )
    dash.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback --address without authentication (anyone who reaches it may use it)",
    )
    dash.add_argument(
        "--max-sessions",
        type=flags.bounded(int),  # its range is ServedSettings' (shared with panel serve)
        default=None,
        help="sessions open at once; one more is shown a 'server is full' page (default 16, 0: no limit)",
    )
    dash.add_argument(
        "--model-idle-seconds",
        type=flags.bounded(float),  # its range is ServedSettings' (shared with panel serve)
        default=None,
        help="unload a checkpoint no session has used for this long (default 600, 0: never)",
    )
    dash.add_argument(
        "--calibration-windows",
        type=flags.positive_int,
        default=None,
        help="calibration windows for the static profiles (default: all)",
    )
    dash.add_argument(
        "--torch-threads", type=flags.non_negative_int, default=1, help="torch intra-op threads (default 1)"
    )
    dash.add_argument(
        "--results",
        default="results",
        metavar="DIR",
        help="folder whose finished audits the results view lists; nothing outside it is read (default: results)",
    )


def add_eval_parser(commands: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """``fca eval``: its parser and every flag (the command is ``cli.eval.cmd_eval``)."""
    parser = commands.add_parser(
        "eval", help="downstream tasks (lm-evaluation-harness) under static FCA conditions: downstream.json"
    )
    parser.add_argument("checkpoint")
    parser.add_argument(
        "--tasks",
        required=True,
        help="comma-separated lm-eval tasks: the shipped fca_next_line and fca_play_choice (offline), or any task lm-eval has",
    )
    parser.add_argument(
        "--conditions",
        default="correct,global_mean,layer_mean",
        help=f"comma-separated static conditions: correct, {', '.join(condition_names(lambda c: c.static))} (correct and "
        "global_mean always run: the retention's two ends; layer_mean_topk brings random_topk, its reference)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="audit folder to write downstream.json into (default: "
        "results/audit-<checkpoint>, beside fca audit's audit.json)",
    )
    parser.add_argument("--limit", type=flags.positive_int, default=None, help="the first N documents of each task")
    parser.add_argument("--calib", help="calibration text for the static profiles (default: shipped split)")
    parser.add_argument(
        "--window",
        type=flags.window_size,
        default=default("window"),
        help="tokens per calibration window, and the longest input a task gets "
        f"(default: min({DEFAULT_WINDOW}, context))",
    )
    parser.add_argument(
        "--max-windows",
        type=flags.positive_int,
        default=default("max_windows"),
        help="calibration windows, spread evenly (default: all)",
    )
    add_model_options(parser)
    parser.add_argument("--seed", type=flags.seed, default=default("seed"), help="lm-eval's seeds (few-shot sampling)")
    parser.add_argument("--batch-size", type=flags.positive_int, default=None, help="texts per forward")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="run the code a foreign checkpoint folder ships"
    )
    return parser


def add_export_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """``fca export``: a checkpoint with its controller folded away into one static profile."""
    export = sub.add_parser(
        "export", help="fold one static profile into a checkpoint's weights: the model without its controller"
    )
    export.add_argument("checkpoint")
    export.add_argument(
        "--profile",
        required=True,
        help="global_mean, layer_scalar, layer_mean, or layer_mean_topk (routers: each layer's k static experts)",
    )
    export.add_argument("--out", required=True, help="new folder for the exported checkpoint (must not hold anything)")
    source = export.add_mutually_exclusive_group()
    source.add_argument(
        "--audit", default=None, metavar="DIR", help="take the profile a finished audit of this checkpoint saved"
    )
    source.add_argument(
        "--calib", default=None, help="estimate the profile from this calibration text (default: shipped split)"
    )
    export.add_argument(
        "--max-windows", type=flags.positive_int, default=None, help="calibration windows, spread evenly (default: all)"
    )
    export.add_argument(
        "--seed",
        type=flags.seed,
        default=0,
        help="recorded in the model card; a static profile draws nothing at random (default 0)",
    )
    return export


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    """Models bigger than one device: accelerate's big-model inference (docs/guides/big-models.md)."""
    parser.add_argument(
        "--device-map",
        default=None,
        metavar="auto|balanced|sequential|FILE.json",
        help="place the model across the GPUs (--device cuda), the CPU and disk with accelerate: a strategy, or "
        "a JSON file of module name -> device (default: the whole model on --device)",
    )
    parser.add_argument(
        "--max-memory",
        default=None,
        metavar="DEVICE=SIZE,...",
        help="what each device may hold under --device-map, e.g. cpu=200MB or 0=10GiB,cpu=30GiB "
        "(default: the free memory of each); the rest is offloaded to disk",
    )
    parser.add_argument(
        "--offload-folder",
        default=None,
        metavar="DIR",
        help="where the weights offloaded to disk go, in a new subfolder removed afterwards (default: the "
        "system's temporary folder); never inside the checkpoint, --out or --cache",
    )
