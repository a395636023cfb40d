"""Auth overhead: what `--auth accounts` costs a request against the single-password mode.

What is measured: the wall time of `GET /api/sessions` (the sidebar list, which the ownership
filter walks session by session) and of `GET /api/session/status` (one session, one owner
lookup), each over real HTTP to a `tether serve` subprocess, as

- the baseline: `--password-env`, a signed-in cookie, the person's N sessions in the log;
- `--auth accounts` with a cookie: the same N sessions of the person, plus N of another
  person in the same log (hidden by the filter), so the filter does real work;
- `--auth accounts` with an API token (`Authorization: Bearer`), the same data.

Each request in the user modes reads the account store once (the cookie's user and epoch, or
the token's hash), so a logout or a revocation holds on every replica at the next request;
the ratio shows what that costs. The three are measured alternately, after warm-up, and the
medians compared. Target: the accounts modes within 1.5x of the baseline's median.

    python bench/auth_overhead.py            # 200 sessions each, 300 requests per mode
    python bench/auth_overhead.py --quick    # 20 sessions, 40 requests: a few seconds
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchkit import percentile, write_results  # noqa: E402 - puts tests/ on sys.path

from accounts_kit import add_user, bearer, new_token, sign_in  # noqa: E402
from helpers import ServerProcess, new_session  # noqa: E402

PW = "bench-password-1"


def timed(client: httpx.Client, path: str, params: dict | None = None) -> float:
    start = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        sys.exit(f"{path} answered {response.status_code}: {response.text[:200]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=None, help="sessions per person")
    parser.add_argument("--requests", type=int, default=None, help="requests per mode and route")
    parser.add_argument("--quick", action="store_true", help="small defaults, for smoke tests")
    parser.add_argument("--out", type=Path, default=Path("bench/results/auth_overhead.json"))
    args = parser.parse_args()
    sessions = args.sessions or (20 if args.quick else 200)
    requests = args.requests or (40 if args.quick else 300)

    with tempfile.TemporaryDirectory() as tmp:
        base = ServerProcess(
            Path(tmp) / "pw", "--password-env", "BENCH_PW", env={"BENCH_PW": PW}
        ).start()
        data = Path(tmp) / "acc"
        add_user(data, "alice", admin=True)
        add_user(data, "bob")
        accounts = ServerProcess(data, "--auth", "accounts").start()
        try:
            cookie_pw = httpx.Client(base_url=base.base_url, timeout=30)
            assert cookie_pw.post("/api/auth/login", json={"password": PW}).status_code == 200
            alice, bob = sign_in(accounts, "alice"), sign_in(accounts, "bob")
            token = bearer(accounts, new_token(alice)["token"])
            sid_pw = sid_acc = ""
            for _ in range(sessions):
                sid_pw = new_session(cookie_pw, "bench")
                sid_acc = new_session(alice, "bench")
                new_session(bob, "hidden")
            clients = {"password cookie": (cookie_pw, sid_pw)}
            clients["accounts cookie"] = (alice, sid_acc)
            clients["accounts token"] = (token, sid_acc)
            routes = {"GET /api/sessions": None, "GET /api/session/status": "status"}
            times: dict[tuple[str, str], list[float]] = {
                (m, r): [] for m in clients for r in routes
            }
            for round_ in range(requests + 10):
                for mode, (client, sid) in clients.items():
                    for route in routes:
                        if route.endswith("sessions"):
                            took = timed(client, "/api/sessions")
                        else:
                            took = timed(client, "/api/session/status", {"session_id": sid})
                        if round_ >= 10:  # warm-up rounds are not counted
                            times[(mode, route)].append(took)
        finally:
            base.stop()
            accounts.stop()

    print(f"{sessions} sessions per person, {requests} requests per mode and route\n")
    print(f"{'route':<26} {'mode':<17} {'median ms':>10} {'p95 ms':>8}")
    results: dict[str, dict[str, float]] = {}
    for (mode, route), values in times.items():
        median, p95 = statistics.median(values) * 1000, percentile(values, 95) * 1000
        results[f"{route} | {mode}"] = {"median_ms": median, "p95_ms": p95}
        print(f"{route:<26} {mode:<17} {median:>10.2f} {p95:>8.2f}")
    print()
    ratios = {}
    for route in routes:
        baseline = statistics.median(times[("password cookie", route)])
        for mode in ("accounts cookie", "accounts token"):
            ratio = statistics.median(times[(mode, route)]) / baseline
            ratios[f"{route}: {mode} / password cookie"] = ratio
            verdict = "met" if ratio <= 1.5 else "NOT MET"
            print(f"{route}: {mode} / password cookie = {ratio:.2f}x (target <= 1.5x: {verdict})")
    write_results(
        args.out,
        {
            "sessions": sessions,
            "requests": requests,
            "python": platform.python_version(),
            "results": results,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
