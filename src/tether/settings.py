"""Tether's configuration: one object built by the CLI (flags and TETHER_* variables) and
read by every layer. docs/configuration.md lists every knob."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import platformdirs

MiB = 1024 * 1024


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("tether", appauthor=False))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8787
    allowed_hosts: tuple[str, ...] = ()
    trusted_proxies: tuple[str, ...] = ()
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    data_dir: Path = None  # type: ignore[assignment]  # filled by __post_init__
    database_url: str | None = None  # PostgreSQL instead of <data_dir>/tether.db
    runtime: str = "demo"
    base_url: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    context_window: int | None = None
    compression_threshold: float = 0.8
    compression_mode: str = "in_place"
    stream_idle_timeout: float = 300.0
    max_tokens: int | None = None
    workspace: Path | None = None
    hermes_python: str | None = None
    auth: str = "password"  # password | accounts | trusted-header (docs/configuration.md)
    trusted_header: str = "X-Forwarded-User"
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret_env: str | None = None
    oidc_allowed_groups: tuple[str, ...] = ()
    oidc_session_hours: float = 12.0
    hermes_agents: int = 16
    password_env: str | None = None
    password_file: Path | None = None
    insecure_no_password: bool = False
    no_browser: bool = False
    heartbeat_seconds: float = 5.0
    sse_write_deadline_seconds: float = 30.0
    max_streams_per_client: int = 32
    cancel_reclaim_seconds: float = 180.0
    agent_sync_seconds: float = 5.0
    # One attachment at its limit is 26.7 MiB as base64, and the longest message up to 2.4 MB
    # of JSON (a character outside the BMP escaped as two \uXXXX): both fit in one request.
    max_body_bytes: int = 30 * MiB
    max_attachment_bytes: int = 20 * MiB
    max_attachments: int = 10
    max_message_chars: int = 200_000
    max_import_bytes: int = 200 * MiB
    attachment_cache_bytes: int = 1024 * MiB  # with database_url: the local copies' budget
    database_pool_size: int = 16  # with database_url: the log's connections, at most

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir) if self.data_dir else default_data_dir()

    @property
    def database_path(self) -> Path:
        return self.data_dir / "tether.db"
