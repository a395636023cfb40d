"""DNS rebinding: a request whose Host is not one this server answers to is refused before any
route, the event streams and the login included (docs/security.md, "Host names")."""

from __future__ import annotations

from pathlib import Path

import httpx

from helpers import ServerProcess, new_session, running_server

FOREIGN_ROUTES = [
    ("GET", "/api/sessions"),
    ("GET", "/api/events"),
    ("GET", "/api/health"),
    ("GET", "/"),
    ("GET", "/api/openapi.json"),
    ("POST", "/api/sessions"),
    ("POST", "/api/auth/login"),
]


def assert_refused(response: httpx.Response, host: str) -> None:
    assert response.status_code == 421, (host, response.status_code, response.text)
    body = response.json()
    assert body["code"] == "host_not_allowed"
    assert "--allowed-host" in body["message"]


def session_count(client: httpx.Client) -> int:
    return len(client.get("/api/sessions").json()["sessions"])


def test_a_rebound_host_name_is_refused_everywhere(server: ServerProcess) -> None:
    with server.client() as client:
        new_session(client, "private")
        before = session_count(client)
        for host in ["evil.example", f"evil.example:{server.port}", "localhost.evil.example"]:
            for method, path in FOREIGN_ROUTES:
                body = {"password": "x"} if path == "/api/auth/login" else {}
                response = client.request(
                    method, path, headers={"Host": host}, json=body, timeout=5
                )
                assert_refused(response, host)
        assert session_count(client) == before


def test_the_session_stream_is_refused_for_a_foreign_host(server: ServerProcess) -> None:
    with server.client() as client:
        sid = new_session(client)
        with client.stream(
            "GET", f"/api/sessions/{sid}/events", headers={"Host": "evil.example"}
        ) as response:
            assert response.status_code == 421  # before reading: a served stream never ends
            response.read()
            assert_refused(response, "evil.example")


def test_loopback_names_with_and_without_port_are_answered(server: ServerProcess) -> None:
    port = server.port
    with server.client() as client:
        for host in [
            "127.0.0.1",
            f"127.0.0.1:{port}",
            "localhost",
            f"localhost:{port}",
            f"LOCALHOST:{port}",
            "localhost.",
            "[::1]",
            f"[::1]:{port}",
        ]:
            response = client.get("/api/sessions", headers={"Host": host})
            assert response.status_code == 200, (host, response.text)


def test_allowed_hosts_from_the_flag_and_the_variable(tmp_path: Path) -> None:
    with (
        running_server(
            tmp_path / "data",
            "--allowed-host",
            "tether.example.com",
            env={"TETHER_ALLOWED_HOSTS": ""},
        ) as server,
        server.client() as client,
    ):
        assert client.get("/api/sessions", headers={"Host": "tether.example.com"}).is_success
        assert client.get("/api/sessions", headers={"Host": "Tether.Example.com:443"}).is_success
        assert_refused(client.get("/api/sessions", headers={"Host": "other.example"}), "other")
    with (
        running_server(
            tmp_path / "data2", env={"TETHER_ALLOWED_HOSTS": "a.example, b.example,"}
        ) as server,
        server.client() as client,
    ):
        for host in ("a.example", "b.example:8080"):
            assert client.get("/api/sessions", headers={"Host": host}).is_success, host
        assert_refused(client.get("/api/sessions", headers={"Host": "c.example"}), "c")


def test_a_malformed_host_header_is_refused(server: ServerProcess) -> None:
    with server.client() as client:
        for host in ["127.0.0.1:80x", "[::1", "[evil.example]", "127.0.0.1@evil.example"]:
            assert_refused(client.get("/api/sessions", headers={"Host": host}), host)
