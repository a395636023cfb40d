"""The `tether` command. Every flag of `serve` also reads a TETHER_* environment variable,
so a service file can configure it without arguments."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import webbrowser
from collections.abc import Callable
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

import click
import uvicorn

from tether import __version__
from tether import cli_checks as checks
from tether.log import StorageError
from tether.log.dirlock import lock_data_dir
from tether.runtimes import load_runtime, registered, runtime_class
from tether.runtimes.base import RuntimeUnavailable
from tether.settings import Settings, is_loopback

LET_GO_SECONDS = 1.0  # for the tasks left once the shutdown is done (`_serve_then_let_go`)

# Each knob's default lives in Settings only; the flags show it.
_DEFAULTS = {f.name: f.default for f in fields(Settings) if f.default is not MISSING}


def option(flag: str, *names: str, envvar: str | None = None, **kwargs: Any):  # noqa: ANN201
    """A `serve` option that also reads TETHER_<FLAG> (e.g. --data-dir: TETHER_DATA_DIR),
    with the default of the Settings field of the same name."""
    name = flag.lstrip("-").replace("-", "_")
    default = _DEFAULTS.get(names[0] if names else name)
    if default is not None and not kwargs.get("is_flag"):
        kwargs.update(default=default, show_default=bool(default) or not kwargs.get("multiple"))
    envvar = envvar or "TETHER_" + name.upper()
    return click.option(flag, *names, envvar=envvar, show_envvar=True, **kwargs)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tether")
def main() -> None:
    """Tether: a self-hosted web UI for AI agents whose runs never come loose."""


@main.command()
@option("--host", help="Address to listen on.")
@option("--port", type=click.IntRange(0, 65535))
@option(
    "--allowed-host",
    "allowed_hosts",
    envvar="TETHER_ALLOWED_HOSTS",
    multiple=True,
    type=checks.CommaListed("host name", checks.host_name),
    help="A host name the server may be reached by, besides loopback and --host (repeatable; "
    "* allows any). Other Host headers get 421.",
)
@option(
    "--trusted-proxy",
    "trusted_proxies",
    envvar="TETHER_TRUSTED_PROXIES",
    multiple=True,
    type=checks.CommaListed("proxy address", checks.proxy_address),
    help="Address or network of a reverse proxy whose X-Forwarded-For and X-Forwarded-Proto "
    "are believed (repeatable; default: none).",
)
@option(
    "--header-timeout-seconds",
    type=click.FloatRange(min=0.1),
    help="Close a connection whose request headers have not all arrived in this time.",
)
@option(
    "--body-timeout-seconds",
    type=click.FloatRange(min=0.1),
    help="Answer 408 to a request whose body has not all arrived in this time.",
)
@option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where sessions are kept (default: the per-user data directory).",
)
@option(
    "--database-url",
    callback=lambda _ctx, _param, value: checks.database_url_of(value),
    help="Keep the log in PostgreSQL (postgresql://user@host/db) instead of the data "
    "directory, so several replicas can share it (needs tether[postgres]).",
)
@option(
    "--runtime",
    help="Who answers: demo, openai, hermes or an installed plugin (see `tether runtimes`).",
)
@option("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1.")
@option("--model", help="Model name to request.")
@option(
    "--system-prompt",
    callback=lambda _ctx, _param, value: checks.system_prompt_of(value),
    help="The system prompt of every session that has none of its own (at most 20,000 characters).",
)
@option(
    "--api-key-env",
    help="Environment variable that holds the API key.",
)
@option(
    "--context-window", type=click.IntRange(min=256), help="The model's context size in tokens."
)
@option(
    "--compression-threshold",
    type=click.FloatRange(0.1, 0.99),
    help="Compress when the next request passes this share.",
)
@option(
    "--compression-mode",
    type=click.Choice(["in_place", "rotate"]),
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
@option(
    "--auth",
    type=click.Choice(["password", "accounts", "trusted-header", "oidc"]),
    help="Who may sign in: one password (or none on loopback), people with accounts "
    "(`tether users add`), the user a trusted reverse proxy names, or an OpenID Connect "
    "provider's.",
)
@option(
    "--oidc-issuer",
    callback=lambda _ctx, _param, value: checks.oidc_issuer(value),
    help="The OpenID Connect provider's issuer URL (--auth oidc).",
)
@option("--oidc-client-id", help="Tether's client id at the provider (--auth oidc).")
@option(
    "--oidc-client-secret-env",
    help="Environment variable that holds Tether's client secret at the provider (--auth oidc).",
)
@option(
    "--oidc-allowed-group",
    "oidc_allowed_groups",
    envvar="TETHER_OIDC_ALLOWED_GROUPS",
    multiple=True,
    type=checks.CommaListed("group", lambda v: None),
    help="Only people whose `groups` claim names this group may sign in (repeatable; "
    "default: anyone the provider signs in).",
)
@option(
    "--oidc-session-hours",
    type=click.FloatRange(min=0, min_open=True),
    help="How long an OpenID Connect sign-in lasts; then the page goes back through the "
    "provider, which checks the person and --oidc-allowed-group anew (--auth oidc).",
)
@option(
    "--trusted-header",
    callback=lambda _ctx, _param, value: checks.header_name(value),
    help="The header a --trusted-proxy names the signed-in user in (--auth trusted-header).",
)
@option(
    "--hermes-agents",
    type=click.IntRange(min=1),
    help="Idle Hermes agents the sidecar keeps; beyond it the least recently used is closed "
    "and built again at its session's next turn (for --runtime hermes).",
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
    help="Idle SSE heartbeat interval.",
)
@option(
    "--sse-write-deadline-seconds",
    type=click.FloatRange(min=0.5),
    help="Disconnect a stream subscriber that has not taken a frame for this long.",
)
@option(
    "--max-streams-per-client",
    type=click.IntRange(min=1),
    help="Open event streams one client address may hold.",
)
@option(
    "--cancel-reclaim-seconds",
    type=click.FloatRange(min=0.1),
    help="How long a stopped worker may take to unwind.",
)
@option(
    "--agent-sync-seconds",
    type=click.FloatRange(min=0),
    help="How often to look for turns other clients of the agent wrote (hermes runtime; "
    "0: only before each turn).",
)
@option(
    "--max-import-bytes",
    type=click.IntRange(min=1),
    help="The largest file POST /api/sessions/import takes (a Tether or ChatGPT export).",
)
@option(
    "--attachment-cache-bytes",
    type=click.IntRange(min=1),
    help="With --database-url: how many bytes of attachments this replica keeps copies of in "
    "its data directory; beyond it the least recently read go (fetched again when needed).",
)
@option(
    "--database-pool-size",
    type=click.IntRange(min=2),
    help="With --database-url: how many connections this replica's log opens at most (the "
    "writer takes one; reads share the rest).",
)
@option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
def serve(log_level: str, **options: object) -> None:
    """Serve the web UI and the API."""
    settings = Settings(**options)  # type: ignore[arg-type]
    from tether.http.auth import Authenticator

    password, secret = _refuse_before_writing(settings)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")

    from tether.http.app import create_app
    from tether.http.slow_clients import header_deadline_protocol
    from tether.services import open_store

    made = checks.first_missing(settings.data_dir)
    try:  # a database that cannot be opened is a clear one-line error, not a traceback
        # One process per SQLite data directory, held until this process ends (log/dirlock.py).
        dir_lock = None if settings.database_url else lock_data_dir(settings.data_dir)
        asyncio.run(open_store(settings).aclose())
    except StorageError as exc:
        if settings.database_url:  # a PostgreSQL server that cannot be reached: the local
            checks.remove_made(settings.data_dir, made)  # directory made for it goes again
        raise click.ClickException(str(exc)) from exc
    try:  # so is a runtime that cannot start, before anything is served
        runtime = load_runtime(settings)
    except RuntimeUnavailable as exc:
        raise click.ClickException(str(exc)) from None

    try:
        auth = Authenticator(settings.data_dir, password)  # keeps only the argon2 hash
    except OSError as exc:
        raise click.ClickException(f"Cannot set up login in {settings.data_dir}: {exc}") from exc
    del password
    config = uvicorn.Config(
        create_app(settings, auth, runtime, oidc_secret=secret),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=10,
        http=header_deadline_protocol(settings.header_timeout_seconds),
        proxy_headers=False,  # uvicorn would trust 127.0.0.1's X-Forwarded-For; the app decides
    )
    server = uvicorn.Server(config)
    if not settings.no_browser:
        _open_browser_when_ready(server, settings.host)
    # uvicorn re-raises the signal that stopped it once it has shut down; by then every run is
    # durable, so that re-raise lands on a no-op and the process exits 0 (docs/api.md §1).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # as server.run()
        runner.run(_serve_then_let_go(server))
    if dir_lock is not None:
        dir_lock.close()
    if not server.started:
        raise SystemExit(1)


async def _serve_then_let_go(server: uvicorn.Server) -> None:
    """Serve until a signal, then leave without waiting for a task that ignores cancellation.
    By the time `serve` returns the app's shutdown has given the runs in flight their grace
    (runs/maintenance.py `shutdown`), recorded every one still open as interrupted and
    closed the log. The event loop's own exit would then wait for every task left to end:
    a runtime that swallows its cancellation (an agent stuck in a tool, the demo's
    `/stubborn 40`) kept the process alive until it gave up, past systemd's TimeoutStopSec
    and its SIGKILL. The tasks left get LET_GO_SECONDS; a task still running after that
    ends with the process (exit 0, as a clean shutdown's: nothing of the log is pending)."""
    await server.serve()
    current = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    if not left:
        return
    _, stuck = await asyncio.wait(left, timeout=LET_GO_SECONDS)
    if stuck:
        logging.getLogger("tether").warning(
            "exiting without waiting for %d task(s) that ignore cancellation (a runtime "
            "stuck in a tool); every run in flight is already recorded",
            len(stuck),
        )
        logging.shutdown()
        os._exit(0 if server.started else 1)  # the loop's exit would wait for them


def _refuse_before_writing(settings: Settings) -> tuple[str | None, str | None]:
    """Every check of the configuration that needs no data directory, so a refused one leaves
    nothing on disk; the login password and the OIDC client secret, read once."""
    from tether.http.auth import PasswordError, load_password

    _check_auth_mode(settings)
    try:
        password = load_password(settings)
    except PasswordError as exc:
        raise click.UsageError(str(exc)) from None
    if (
        password is None
        and settings.auth == "password"
        and not is_loopback(settings.host)
        and not settings.insecure_no_password
    ):
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
    from tether.http.oidc import OIDCConfigError, client_secret

    try:
        secret = client_secret(settings) if settings.auth == "oidc" else None
    except OIDCConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:  # a misspelt or broken runtime, before the data directory is made
        runtime_class(settings.runtime)
    except RuntimeUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    checks.check_can_listen(settings.host, settings.port)
    return password, secret


def _check_auth_mode(settings: Settings) -> None:
    if settings.auth == "password":
        return
    if settings.password_env or settings.password_file:
        raise click.UsageError(
            f"--auth {settings.auth} signs people in one by one: --password-env and "
            "--password-file are for --auth password (give each person a password with "
            "`tether users add`)."
        )
    if settings.auth == "oidc" and not (
        settings.oidc_issuer and settings.oidc_client_id and settings.oidc_client_secret_env
    ):
        raise click.UsageError(
            "--auth oidc needs --oidc-issuer, --oidc-client-id and --oidc-client-secret-env."
        )
    if settings.auth == "trusted-header" and not settings.trusted_proxies:
        raise click.UsageError(
            "--auth trusted-header needs --trusted-proxy: the header is believed only from "
            "the proxy's address."
        )


@main.command()
def runtimes() -> None:
    """List the runtimes this installation offers and what each can do."""
    for name, entry in sorted(registered().items()):
        try:
            cls = runtime_class(name)
        except RuntimeUnavailable as exc:
            click.echo(f"{name:<12} {entry.distribution}: {exc}")
            continue
        capabilities = ", ".join(cls.capabilities.names())
        click.echo(f"{name:<12} {entry.distribution}: {cls.description} [{capabilities}]")


def _browser_url(server: uvicorn.Server, host: str) -> str:
    """An address the browser can reach: the port actually bound (--port 0 picks one), an
    IPv6 address in brackets, loopback for a listen-on-everything address."""
    port = server.servers[0].sockets[0].getsockname()[1]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _open_browser_when_ready(server: uvicorn.Server, host: str) -> None:
    def wait_then_open() -> None:
        for _ in range(600):
            if server.started:
                webbrowser.open(_browser_url(server, host))
                return
            if server.should_exit:
                return
            threading.Event().wait(0.05)

    threading.Thread(target=wait_then_open, daemon=True).start()


_data_dir_option = click.option(
    "--data-dir",
    envvar="TETHER_DATA_DIR",
    show_envvar=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The data directory of the server (default: the per-user data directory).",
)


_users_database_option = click.option(
    "--database-url",
    envvar="TETHER_DATABASE_URL",
    show_envvar=True,
    callback=lambda _ctx, _param, value: checks.database_url_of(value),
    help="The PostgreSQL database of the server's --database-url (its users are kept there).",
)


def _settings(data_dir: Path | None, database_url: str | None = None) -> Settings:
    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    return replace(settings, database_url=database_url) if database_url else settings


@main.group()
def users() -> None:
    """The people who sign in to `tether serve --auth accounts` (docs/api.md §15)."""


def _new_password(password_env: str | None) -> Callable[[], str]:
    """How to get the new password: the variable is read and checked now (refused before
    anything is opened); the prompt is put only once the name has been checked."""
    from tether import cli_users

    if password_env:
        password = os.environ.pop(password_env, None)
        if password is None:
            raise click.UsageError(f"The environment variable {password_env} is not set.")
        try:
            cli_users.check_password(password)
        except cli_users.Refused as exc:
            raise click.ClickException(str(exc)) from None
        return lambda: password
    return lambda: click.prompt("Password", hide_input=True, confirmation_prompt=True)


@users.command("add")
@click.argument("name")
@click.option(
    "--admin",
    is_flag=True,
    help="May manage users (the first admin also owns the sessions made before accounts).",
)
@click.option("--password-env", help="Environment variable holding the password (else: a prompt).")
@_data_dir_option
@_users_database_option
def users_add(
    name: str,
    admin: bool,
    password_env: str | None,
    data_dir: Path | None,
    database_url: str | None,
) -> None:
    """Add a user; works without a running server (the first admin of a headless one)."""
    from tether import cli_users

    try:
        cli_users.check_name(name)
    except cli_users.Refused as exc:
        raise click.ClickException(str(exc)) from None
    ask = _new_password(password_env)
    try:
        claimed = cli_users.add_user(_settings(data_dir, database_url), name, ask, admin)
    except (cli_users.Refused, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Added {'admin ' if admin else ''}{name}.")
    if claimed:
        click.echo(f"{name} now owns the {claimed} session(s) made before accounts.")


@users.command("list")
@_data_dir_option
@_users_database_option
def users_list(data_dir: Path | None, database_url: str | None) -> None:
    """List the users, oldest first."""
    from tether import cli_users

    try:
        found = cli_users.list_users(_settings(data_dir, database_url))
    except (cli_users.Refused, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    for user in found:
        click.echo(f"{user.username}{' (admin)' if user.admin else ''}")


@users.command("password")
@click.argument("name")
@click.option("--password-env", help="Environment variable holding the password (else: a prompt).")
@_data_dir_option
@_users_database_option
def users_password(
    name: str, password_env: str | None, data_dir: Path | None, database_url: str | None
) -> None:
    """Give a user a new password: their sign-ins end; their sessions and tokens stay."""
    from tether import cli_users

    ask = _new_password(password_env)
    try:
        cli_users.set_password(_settings(data_dir, database_url), name, ask)
    except (cli_users.Refused, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Changed the password of {name}; their earlier sign-ins have ended.")


@users.command("remove")
@click.argument("name")
@_data_dir_option
@_users_database_option
def users_remove(name: str, data_dir: Path | None, database_url: str | None) -> None:
    """Remove a user: their tokens and logins end; their sessions are kept, shown to no one."""
    from tether import cli_users

    try:
        cli_users.remove_user(_settings(data_dir, database_url), name)
    except (cli_users.Refused, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Removed {name}.")
