"""``fca dashboard``: serve ``dashboards/app.py`` (the checkout's, or the copy bundled in the wheel)."""

import argparse
import importlib.util
import sys

from fca_workbench.cli.flag_settings import DashboardServing
from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.resources import shipped
from fca_workbench.viewmodel.pool import load_registry
from fca_workbench.viewmodel.serving import ServedHosts, is_loopback


def cmd_dashboard(args: argparse.Namespace, serving: DashboardServing) -> None:
    quiet_transformers()
    app_path = shipped("dashboards") / "app.py"
    if not app_path.is_file():
        raise UserError(f"dashboard app not found at {app_path}; reinstall the workbench")
    options = dict(serving.auth)
    hosts = ServedHosts.of(args.address, [*(args.allow_host or []), *(args.allow_websocket_origin or [])])
    load_registry(args.registry)  # a bad registry is a one-line error here, before any server starts
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

    def announce() -> None:  # once the port answers: the checkpoint is loaded and the event loop turns
        print(f"fca dashboard: serving on http://{args.address}:{args.port}/ (Ctrl-C stops it)", flush=True)

    app.serve(serving.settings, port=args.port, address=args.address, hosts=hosts, on_ready=announce, **options)
