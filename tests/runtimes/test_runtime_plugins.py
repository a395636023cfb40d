"""Plugin runtimes (docs/runtimes.md): a package with an entry point in `tether.runtimes` is
listed by `tether runtimes` and selectable with `--runtime NAME`, like the built-ins; a
runtime that cannot start is refused before the server serves, with its reason and no
traceback. The example plugin in tests/plugins/ is installed for real (pip, into a scratch
directory on the server's path) and answers a turn over HTTP and SSE."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tether.runtimes import BUILT_IN

from helpers import ServerProcess, free_port, new_session, run_events, session_body, start_turn

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
PLUGIN = ROOT / "tests" / "plugins" / "tether-echo-runtime"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a Tether whose Python path holds the installed example plugin."""
    scratch = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, scratch / "source")  # the build leaves files beside it
    target = scratch / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        + ["--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    path = [str(target), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path)}


def tether(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def serve_refused(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """`tether serve` with `flags`; asserts it refused to start, returns what it printed."""
    done = tether(
        "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
        "--no-browser", *flags, env=env,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and "Application startup failed" not in out, out
    return out


def test_tether_runtimes_lists_the_built_ins_and_an_installed_plugin(
    plugin_env: dict[str, str],
) -> None:
    done = tether("runtimes", env=plugin_env)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert {"demo", "openai", "hermes", "echo"} <= set(lines)
    assert "tether-echo-runtime" in lines["echo"] and "attachments:text" in lines["echo"]
    assert "approvals" in lines["hermes"] and "agent_sync" in lines["hermes"]
    assert "could not be loaded" in lines["echo-broken"]


def test_a_turn_runs_through_the_plugin_over_http(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    server = ServerProcess(tmp_path / "data", "--runtime", "echo", env=plugin_env).start()
    try:
        with server.client() as client:
            health = client.get("/api/health").json()
            assert (health["runtime"], health["model"]) == ("echo", "echo-1")
            assert health["capabilities"] == ["streaming", "attachments:text"]
            sid = new_session(client)
            started = start_turn(client, sid, "hello over there")
            frames = run_events(client, sid, started["stream_id"])
            deltas = [f.json["data"]["text"] for f in frames if f.event == "text.delta"]
            assert "".join(deltas) == "You said: hello over there"
            assert frames[-1].json["data"]["state"] == "completed"
            [user, answer] = session_body(client, sid)["messages"]
            assert answer["content"] == "You said: hello over there"
            assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 5}
    finally:
        server.stop()


def test_a_plugin_that_fails_to_import_is_refused_before_serving(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    out = serve_refused(tmp_path, "--runtime", "echo-broken", env=plugin_env)
    assert "'echo-broken' runtime" in out and "could not be loaded" in out, out
    assert "ModuleNotFoundError" in out and "tether_echo_runtime_missing_dependency" in out


def test_an_unknown_runtime_is_refused_with_the_names_that_exist(tmp_path: Path) -> None:
    out = serve_refused(tmp_path, "--runtime", "nosuch")
    assert "no runtime 'nosuch'" in out and "demo, hermes, openai" in out, out


def test_hermes_without_its_python_is_refused_with_the_reason(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-venv" / "bin" / "python")
    out = serve_refused(tmp_path, "--runtime", "hermes", "--hermes-python", missing)
    assert f"--hermes-python {missing!r} does not exist." in out, out


def test_the_built_ins_are_registered_as_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"]["tether.runtimes"] == BUILT_IN
