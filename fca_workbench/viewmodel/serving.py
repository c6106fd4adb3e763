"""What one dashboard server serves, however it was started: ``fca dashboard`` (``fca_workbench.cli``) or
``panel serve dashboards/app.py --args ...`` (the app's own settings, also read from ``FCA_*`` variables).

``ServedSettings`` is the one description of those settings and their checks (``server.configure`` applies them
to the process); the names the server answers as (``ServedHosts``); the serving options (``serving_auth``:
Panel's ``basic_auth`` and ``cookie_secret``) refuse to serve a network without authentication. No torch here:
``fca dashboard`` refuses a bad flag before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fca_workbench.foundation import flags
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, read_text

DEFAULT_MAX_SESSIONS = 16  # open browser sessions per server process
DEFAULT_MODEL_IDLE_SECONDS = 600.0  # a checkpoint no session has used for this long is unloaded

# ServedSettings field -> the variable ``panel serve`` reads it from when ``--args`` does not give it
ENVIRONMENT = {
    "registry": "FCA_REGISTRY",
    "calibration_windows": "FCA_CALIBRATION_WINDOWS",
    "torch_threads": "FCA_TORCH_THREADS",
    "max_sessions": "FCA_MAX_SESSIONS",
    "model_idle_seconds": "FCA_MODEL_IDLE_SECONDS",
    "results": "FCA_RESULTS",
}


@dataclass(frozen=True)
class ServedSettings:
    """The registry file (None: the shipped checkpoints), calibration windows for the static profiles (None:
    all), torch threads (1 keeps small models fast when several sessions share the CPU; 0: torch's own
    choice), the most sessions open at once and the idle time after which a model is unloaded (0: no limit,
    never), and the results folder whose audits the results view lists (None or "": none)."""

    registry: str | None = None
    calibration_windows: int | None = None
    torch_threads: int = 1
    max_sessions: int = DEFAULT_MAX_SESSIONS
    model_idle_seconds: float = DEFAULT_MODEL_IDLE_SECONDS
    results: str | None = "results"

    def __post_init__(self) -> None:
        for flag in ("max_sessions", "model_idle_seconds"):
            value = getattr(self, flag)
            if value < 0:
                raise UserError(f"--{flag.replace('_', '-')} must be >= 0 (0: no limit), got {value}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServedSettings:
        """The settings an argparse namespace gives (a value it leaves None keeps the default)."""
        given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in given.items() if value is not None})


def served_settings(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> ServedSettings:
    """``panel serve dashboards/app.py --args ...``: each setting from ``--args``, else its ``FCA_*`` variable
    (``ENVIRONMENT``), else the default; arguments it does not know are left to Panel."""
    defaults = ServedSettings()
    parser = argparse.ArgumentParser(prog="panel serve dashboards/app.py --args")

    def default(name: str) -> object:
        return environ.get(ENVIRONMENT[name], getattr(defaults, name))

    parser.add_argument("--registry", default=default("registry"))
    parser.add_argument("--calibration-windows", type=flags.non_negative_int, default=default("calibration_windows"))
    parser.add_argument("--torch-threads", type=flags.non_negative_int, default=default("torch_threads"))
    parser.add_argument("--max-sessions", type=flags.bounded(int), default=default("max_sessions"))
    parser.add_argument("--model-idle-seconds", type=flags.bounded(float), default=default("model_idle_seconds"))
    parser.add_argument("--results", default=default("results"))
    args, _ = parser.parse_known_args(list(argv))
    args.calibration_windows = args.calibration_windows or None  # 0 or empty: every calibration window
    return ServedSettings.from_args(args)


# ------------------------------------------------------------------------------------------------ served names

WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")  # every interface: the names the machine has are not known here
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def host_name(host: str) -> str:
    """A ``Host`` header's (or ``NAME[:PORT]`` flag's) name: lower case, port dropped, IPv6 kept in brackets."""
    name = host.strip().lower()
    if name.startswith("["):
        return name[: name.find("]") + 1] if "]" in name else name
    return name.rsplit(":", 1)[0] if name.count(":") == 1 else (f"[{name}]" if ":" in name else name)


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ServedHosts:
    """The names a browser may reach the server as, the only ``Host`` (and websocket ``Origin``) it answers: a
    page of another origin whose name resolves to this server (DNS rebinding) is refused. The served address
    (``localhost`` and the loopback literals too, for a loopback one) and the names given with ``--allow-host``
    or ``--allow-websocket-origin``; behind a wildcard address also this machine's own names and any IP literal
    (a rebinding page has a name of its own, never the server's address)."""

    names: frozenset[str]
    any_ip_literal: bool = False

    @classmethod
    def of(cls, address: str, extra: Sequence[str] = ()) -> ServedHosts:
        names = {host_name(name) for name in extra if name.strip()}
        if address in WILDCARD_ADDRESSES:
            names |= {*LOOPBACK_NAMES, socket.gethostname().lower(), socket.getfqdn().lower()}
        else:
            names.add(host_name(f"[{address}]" if ":" in address and not address.startswith("[") else address))
            if is_loopback(address):
                names |= set(LOOPBACK_NAMES)
        return cls(frozenset(names), any_ip_literal=address in WILDCARD_ADDRESSES)

    def allows(self, host: str) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        name = host_name(host)
        return name in self.names or (self.any_ip_literal and is_ip_literal(name))

    def websocket_origins(self, port: int) -> list[str]:
        """Bokeh's websocket-origin allowlist (``HOST:PORT``) for these names; an IPv6 literal, which it cannot
        spell, still connects from its own page (Tornado accepts an ``Origin`` equal to the ``Host``)."""
        return sorted(f"{name}:{port or '*'}" for name in self.names if not name.startswith("["))


# ------------------------------------------------------------------------------------------------ authentication


def dashboard_secret(value: str | None, file: str | None, variable: str, flag: str) -> str | None:
    """A secret from ``--flag VALUE``, else ``--flag-file FILE``, else the environment variable ``variable``."""
    if value:
        print(
            f"fca dashboard: warning: {flag} on the command line is visible to every user in `ps`; "
            f"use {flag}-file FILE or {variable}",
            file=sys.stderr,
        )
        return value
    if file:
        return secret_file(file, f"{flag}-file")
    return os.environ.get(variable) or None


SECRET_MAX_BYTES = 64 << 10  # a password or cookie secret is tens of bytes; /dev/zero is endless


def secret_file(file: str, flag: str) -> str:
    """The one secret a file holds (surrounding whitespace dropped), read with a size cap."""
    try:
        value = read_text(Path(file), SECRET_MAX_BYTES, "a secret").strip()
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None
    if not value:
        raise UserError(f"{flag} {file} is empty")
    return value


def credentials_file(file: str, flag: str) -> str:
    """``file`` when it is a JSON object of user name -> password (what Panel's basic auth reads at each login);
    anything else is refused in one line, never taken as a password."""
    credentials = read_json(Path(file))
    assert isinstance(credentials, dict)  # read_json's default ``expect``
    if not credentials:
        raise UserError(f'{flag} {file} names no user: it must be a JSON object {{"user": "password", ...}}')
    for user, password in credentials.items():
        if not isinstance(password, str) or not user or not password:
            raise UserError(
                f"{flag} {file}: user {user[:40]!r} needs a non-empty password string "
                '(a JSON object {"user": "password", ...})'
            )
    return str(file)


def basic_auth_option(args: argparse.Namespace) -> str | None:
    """Panel's ``basic_auth``: the path of a JSON credentials file (``--basic-auth-file``; Panel reads it at each
    login), or one shared password, from ``--basic-auth-password-file`` or ``FCA_BASIC_AUTH`` (a password, or
    the path of a credentials file). A password on the command line (``--basic-auth``) is refused."""
    if args.basic_auth:
        raise UserError(
            "--basic-auth on the command line is visible to every user in `ps`: give --basic-auth-file "
            "CREDENTIALS.json (a JSON object of user -> password), --basic-auth-password-file FILE or FCA_BASIC_AUTH"
        )
    if args.basic_auth_file and args.basic_auth_password_file:
        raise UserError("--basic-auth-file and --basic-auth-password-file contradict each other: choose one")
    if args.basic_auth_file:
        return credentials_file(args.basic_auth_file, "--basic-auth-file")
    if args.basic_auth_password_file:
        return secret_file(args.basic_auth_password_file, "--basic-auth-password-file")
    value = os.environ.get("FCA_BASIC_AUTH") or None
    if value and (Path(value).is_file() or names_a_file(value)):
        return credentials_file(value, "FCA_BASIC_AUTH")
    return value


def names_a_file(value: str) -> bool:
    """Whether ``FCA_BASIC_AUTH`` names a credentials file (a ``.json`` name, or a path from ``/``, ``./``,
    or ``../``) rather than holding a password: one that is missing is an error, never a password."""
    return value.endswith(".json") or value.startswith(("/", "./", "../"))


def is_loopback(address: str) -> bool:
    """Whether only this machine can reach ``address``."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:  # a host name (or "" = every interface): assume the network can reach it
        return False


def serving_auth(args: argparse.Namespace) -> dict:
    """Panel's ``basic_auth``/``cookie_secret`` options, refusing to serve a network without authentication
    (unless ``--no-auth``) and a password without the secret that signs its login cookie."""
    basic_auth = basic_auth_option(args)
    cookie_secret = dashboard_secret(
        args.cookie_secret, args.cookie_secret_file, "FCA_COOKIE_SECRET", "--cookie-secret"
    )
    if basic_auth and args.no_auth:
        raise UserError("--no-auth contradicts --basic-auth-file (or FCA_BASIC_AUTH): choose one")
    if basic_auth and not cookie_secret:
        raise UserError("basic auth needs a --cookie-secret-file (or FCA_COOKIE_SECRET) to sign its login cookie")
    if not basic_auth and not args.no_auth and not is_loopback(args.address):
        raise UserError(
            f"--address {args.address} lets the network reach the dashboard: give --basic-auth-file "
            "CREDENTIALS.json (or FCA_BASIC_AUTH) with --cookie-secret-file FILE (or FCA_COOKIE_SECRET), or --no-auth"
        )
    return {"basic_auth": basic_auth, "cookie_secret": cookie_secret} if basic_auth else {}
