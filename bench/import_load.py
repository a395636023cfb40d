"""Import of a large ChatGPT export while the server keeps answering (docs/api.md §12).

The issue's target: importing a 1,000-conversation `conversations.json` does not block other
requests: the p99 of `GET /api/sessions` during the import is at most 2x its p99 idle, in
the same run, and the import shows progress (`GET /api/imports/{id}`).

One real server (demo runtime) in a temporary data directory. It is seeded by importing
`--seed` conversations, so the list has rows to sort. Then, with a single client sending
`GET /api/sessions` back to back (`--gap` seconds apart):
1. idle: `--samples` requests with nothing else going on;
2. during: the same requests for as long as `POST /api/sessions/import` of `--conversations`
   conversations (`--turns` exchanges each) takes, while a third client polls its progress;
3. after: `--samples` idle requests again, now over the larger list.
The ratio of the target is during / idle (before the import: the list the requests during
the import see, since the import's rows appear in one commit at its very end); during /
after is printed too, the same list size as the import's last requests.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from benchkit import percentile, write_results  # noqa: E402 - puts tests/ on sys.path

from chatgpt_kit import many
from helpers import running_server

TARGET = 2.0


def timed_gets(
    client: httpx.Client, gap: float, stop: Any, seen: list[tuple[float, float, int]] | None = None
) -> list[float]:
    """Latencies (s) of GET /api/sessions for `stop` requests, or until `stop()` is true;
    `seen` gets (start, latency, rows listed) of each."""
    out: list[float] = []
    while (len(out) < stop) if isinstance(stop, int) else not stop():
        start = time.perf_counter()
        response = client.get("/api/sessions")
        out.append(time.perf_counter() - start)
        assert response.status_code == 200, response.text
        if seen is not None:
            seen.append((start, out[-1], response.content.count(b'"session_id"')))
        time.sleep(gap)
    return out


def _post_file(base_url: str, path: str, results: Any, go: Any) -> None:
    """The importing client, in a process of its own: its upload and its reading of the
    1,000-row answer must not take the measuring client's GIL. It starts (an interpreter
    and httpx: a core for a few hundred ms) and reads the file before the measured window,
    then posts when `go` is set."""
    with httpx.Client(base_url=base_url, timeout=600) as own:
        body = Path(path).read_bytes()
        results.put("ready")
        go.wait()
        start = time.perf_counter()
        response = own.post("/api/sessions/import", content=body, params={"import_id": "bench"})
        results.put(
            {
                "status": response.status_code,
                "seconds": time.perf_counter() - start,
                "created": response.json().get("created"),
            }
        )


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "max_ms": max(values) * 1000,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    seed = json.dumps(many(args.seed, turns=args.turns, start=1_600_000_000.0)).encode()
    export = json.dumps(many(args.conversations, turns=args.turns)).encode()
    context = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_server(Path(tmp) / "data") as server,
        httpx.Client(base_url=server.base_url, timeout=600) as client,
    ):
        file = Path(tmp) / "conversations.json"
        file.write_bytes(export)
        assert client.post("/api/sessions/import", content=seed).status_code == 201
        timed_gets(client, args.gap, 20)  # warm up
        # The measuring client's own collections (8-10 ms each, its heap of responses and
        # timings) would count as the server's latency: none while it measures.
        gc.collect()
        gc.freeze()
        gc.disable()
        idle = timed_gets(client, args.gap, args.samples)

        phases: list[tuple[str, int, int | None]] = []
        phase_at: list[tuple[float, str]] = []  # when each phase was first seen
        seen: list[tuple[float, float, int]] = []
        results = context.Queue()
        go = context.Event()
        poster = context.Process(target=_post_file, args=(server.base_url, str(file), results, go))
        finished = threading.Event()

        def watcher() -> None:
            with httpx.Client(base_url=server.base_url, timeout=60) as own:
                while not finished.is_set():
                    got = own.get("/api/imports/bench")
                    if got.status_code == 200:
                        p = got.json()
                        if not phases or phases[-1] != (p["phase"], p["done"], p["total"]):
                            phases.append((p["phase"], p["done"], p["total"]))
                        if not phase_at or phase_at[-1][1] != p["phase"]:
                            phase_at.append((time.perf_counter(), p["phase"]))
                    time.sleep(0.1)

        watching = threading.Thread(target=watcher)
        poster.start()
        assert results.get(timeout=60) == "ready"
        watching.start()
        go.set()
        timed_gets(client, args.gap, lambda: not poster.is_alive(), seen)
        poster.join()
        finished.set()
        watching.join()
        result = results.get(timeout=10)
        after = timed_gets(client, args.gap, args.samples)
        rows = len(client.get("/api/sessions").json()["sessions"])
        gc.enable()
    # A request during the import saw the list as it was (seeded rows) or, after its one
    # commit, with every imported row: each is compared with the idle list of its size.
    before_commit = [latency for _, latency, listed in seen if listed <= args.seed]
    after_commit = [latency for _, latency, listed in seen if listed > args.seed]
    by_phase: dict[str, list[float]] = {}  # before the commit: the ratio's requests
    for start, latency, listed in seen:
        if listed > args.seed:
            continue
        phase = next((name for at, name in reversed(phase_at) if at <= start), "reading")
        by_phase.setdefault(phase, []).append(latency)
    ratio = percentile(before_commit, 99) / percentile(idle, 99)
    ratio_after = (
        percentile(after_commit, 99) / percentile(after, 99) if after_commit else float("nan")
    )
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "file_mib": len(export) / 2**20,
        "seeded": args.seed,
        "rows_after": rows,
        "import": result,
        "progress_updates": len(phases),
        "progress_phases": sorted({p[0] for p in phases}),
        "idle": summary(idle),
        "during": summary([latency for _, latency, _ in seen]),
        "during, before its commit": summary(before_commit),
        "during, after its commit": summary(after_commit),
        "after": summary(after),
        "during_by_phase": {name: summary(values) for name, values in by_phase.items()},
        "p99_during_over_idle": ratio,
        "p99_after_commit_over_after": ratio_after,
        "target": TARGET,
        "met": ratio <= TARGET and not ratio_after > TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=6, help="exchanges per conversation")
    parser.add_argument("--seed", type=int, default=200, help="conversations imported first")
    parser.add_argument("--samples", type=int, default=300, help="idle requests, each phase")
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between requests")
    parser.add_argument("--quick", action="store_true", help="100 conversations, 100 samples")
    parser.add_argument("--out", type=Path, default=Path("bench/results/import_load.json"))
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.samples, args.seed = 100, 100, 50
    out = run(args)
    print(
        f"import of {out['conversations']} conversations ({out['file_mib']:.1f} MiB, "
        f"{out['turns']} exchanges each): {out['import']['seconds']:.1f} s, "
        f"status {out['import']['status']}, {out['import']['created']} created; "
        f"progress polled {out['progress_updates']} distinct states {out['progress_phases']}"
    )
    print(f"{'GET /api/sessions':<28}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    names = ("idle", "during", "during, before its commit", "during, after its commit", "after")
    rows = [(name, out[name]) for name in names]
    rows[3:3] = [(f"  before, {k}", v) for k, v in out["during_by_phase"].items()]
    for name, s in rows:
        print(f"{name:<28}{s['n']:>6}{s['p50_ms']:>10.1f}{s['p99_ms']:>10.1f}{s['max_ms']:>10.1f}")
    verdict = "met" if out["met"] else "NOT MET"
    print(
        f"p99 during the import / idle, same list: {out['p99_during_over_idle']:.2f} before "
        f"its commit, {out['p99_after_commit_over_after']:.2f} after it "
        f"(target <= {TARGET}: {verdict})"
    )
    write_results(args.out, out)
    sys.exit(0)


if __name__ == "__main__":
    main()
