"""The `tether` command. Every flag of `serve` also reads a TETHER_* environment variable,
so a service file can configure it without arguments."""

from __future__ import annotations

import logging
import signal
import threading
import webbrowser
from pathlib import Path

import click
import uvicorn

from tether import __version__
from tether.log import StorageError
from tether.settings import Settings, is_loopback


def option(flag: str, **kwargs: object):  # noqa: ANN201 - a click decorator
    """A `serve` option that also reads TETHER_<FLAG> (e.g. --data-dir: TETHER_DATA_DIR)."""
    envvar = "TETHER_" + flag.lstrip("-").replace("-", "_").upper()
    return click.option(flag, envvar=envvar, show_envvar=True, **kwargs)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tether")
def main() -> None:
    """Tether: a self-hosted web UI for AI agents whose runs never come loose."""


@main.command()
@option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where sessions are kept (default: the per-user data directory).",
)
@option(
    "--runtime",
    type=click.Choice(["demo", "openai", "hermes"]),
    default="demo",
    show_default=True,
    help="Who answers: the offline demo or a real model.",
)
@option("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1.")
@option("--model", help="Model name to request.")
@option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable that holds the API key.",
)
@option(
    "--context-window", type=click.IntRange(min=256), help="The model's context size in tokens."
)
@option(
    "--compression-threshold",
    type=click.FloatRange(0.1, 0.99),
    default=0.8,
    show_default=True,
    help="Compress when the next request passes this share.",
)
@option(
    "--compression-mode",
    type=click.Choice(["in_place", "rotate"]),
    default="in_place",
    show_default=True,
)
@option(
    "--max-tokens",
    type=click.IntRange(min=1),
    help="Most tokens one answer may take (default: an eighth of the context window, "
    "64 to 4096; not sent when the window is unknown).",
)
@option(
    "--stream-idle-timeout",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="End a model stream that sends nothing for this many seconds (openai runtime).",
)
@option(
    "--workspace",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Folder the agent's read-only tools may read; without it they are off.",
)
@option(
    "--hermes-python",
    help="Python of the environment with hermes-agent (for --runtime hermes).",
)
@option("--password-env", help="Environment variable that holds the login password.")
@option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File whose first line is the login password.",
)
@option(
    "--insecure-no-password", is_flag=True, help="Allow a non-loopback address without a password."
)
@option("--no-browser", is_flag=True, help="Do not open a browser tab at start.")
@option(
    "--heartbeat-seconds",
    type=click.FloatRange(0.05, 5.0),
    default=5.0,
    show_default=True,
    help="Idle SSE heartbeat interval.",
)
@option(
    "--sse-write-deadline-seconds",
    type=click.FloatRange(min=0.5),
    default=30.0,
    show_default=True,
    help="Disconnect a stream subscriber that has not taken a frame for this long.",
)
@option(
    "--max-streams-per-client",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Open event streams one client address may hold.",
)
@option(
    "--cancel-reclaim-seconds",
    type=click.FloatRange(min=0.1),
    default=180.0,
    show_default=True,
    help="How long a stopped worker may take to unwind.",
)
@option(
    "--agent-sync-seconds",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="How often to look for turns other clients of the agent wrote (hermes runtime; "
    "0: only before each turn).",
)
@option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def serve(log_level: str, **options: object) -> None:
    """Serve the web UI and the API."""
    settings = Settings(**options)  # type: ignore[arg-type]
    from tether.http.auth import Authenticator, PasswordError, load_password

    try:
        password = load_password(settings)
    except PasswordError as exc:
        raise click.UsageError(str(exc)) from None
    if password is None and not is_loopback(settings.host) and not settings.insecure_no_password:
        raise click.UsageError(
            f"Refusing to listen on {settings.host} without a password: anyone who can reach "
            "it could read and drive your sessions. Use a loopback address, set a password "
            "with --password-env or --password-file, or pass --insecure-no-password if you "
            "really mean it."
        )
    if settings.password_file and settings.password_file.stat().st_mode & 0o077:
        click.echo(
            f"Warning: the password file {settings.password_file} is readable by "
            "other users; consider chmod 600.",
            err=True,
        )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")

    from tether.http.app import create_app, open_store

    try:  # a database that cannot be opened is a clear one-line error, not a traceback
        open_store(settings).close()
    except StorageError as exc:
        raise click.ClickException(str(exc)) from exc

    try:
        auth = Authenticator(settings.data_dir, password)  # keeps only the argon2 hash
    except OSError as exc:
        raise click.ClickException(f"Cannot set up login in {settings.data_dir}: {exc}") from exc
    del password
    config = uvicorn.Config(
        create_app(settings, auth),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    if not settings.no_browser:
        _open_browser_when_ready(server, f"http://{settings.host}:{settings.port}/")
    # uvicorn re-raises the signal that stopped it once it has shut down; by then every run is
    # durable, so that re-raise lands on a no-op and the process exits 0 (API.md §1).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if not server.started:
        raise SystemExit(1)


def _open_browser_when_ready(server: uvicorn.Server, url: str) -> None:
    def wait_then_open() -> None:
        for _ in range(600):
            if server.started:
                webbrowser.open(url)
                return
            if server.should_exit:
                return
            threading.Event().wait(0.05)

    threading.Thread(target=wait_then_open, daemon=True).start()
