"""From a load run's raw `Outcome` to what `load_test.py` prints and writes: the delivery
check (exactly 1..last_seq per subscriber, in order), the summary figures and the text
report."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from benchkit import percentile  # noqa: E402 - puts tests/ on sys.path
from load_run import Monitor, Outcome

SLICE_SECONDS = 10.0


# -- statistics -----------------------------------------------------------------------------


def dist_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
    }


# -- checking and reporting -----------------------------------------------------------------


def check_delivery(outcome: Outcome) -> dict[str, Any]:
    """Every subscriber holds exactly 1..last_seq of its session, in order."""
    lost = duplicated = out_of_order = bad_subs = 0
    problems: list[str] = []
    for sub in outcome.subscribers:
        expected = outcome.last_seqs[sub.session_id]
        got = sub.seqs
        distinct = set(got)
        sub_lost = len(set(range(1, expected + 1)) - distinct)
        sub_dup = len(got) - len(distinct)
        extra = len([s for s in distinct if s < 1 or s > expected])
        disorder = sum(1 for a, b in zip(got, got[1:], strict=False) if b != a + 1)
        lost += sub_lost
        duplicated += sub_dup
        out_of_order += disorder
        if sub_lost or sub_dup or extra or disorder or sub.snapshots or sub.mismatched_ids:
            bad_subs += 1
            if len(problems) < 10:
                problems.append(
                    f"subscriber {sub.index} ({sub.session_id}): expected 1..{expected}, got "
                    f"{len(got)} frames, {sub_lost} lost, {sub_dup} duplicated, {extra} beyond "
                    f"last_seq, {disorder} out of order, {sub.snapshots} snapshots, "
                    f"{sub.mismatched_ids} id/seq mismatches"
                )
    return {
        "subscribers": len(outcome.subscribers),
        "subscribers_with_problems": bad_subs,
        "lost": lost,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "reconnects": sum(s.reconnects for s in outcome.subscribers),
        "problems": problems,
        "ok": bad_subs == 0,
    }


def rss_summary(monitor: Monitor, w: dict[str, float]) -> dict[str, Any]:
    samples = [s for s in monitor.samples if s.t >= w["baseline_start"]]
    mib = [(s.t, s.rss_kib / 1024.0) for s in samples]
    load = [(t, v) for t, v in mib if w["load_start"] <= t <= w["drained"]]
    slices = []
    t = w["load_start"]
    while t < w["drained"]:
        chunk = [v for ts, v in load if t <= ts < t + SLICE_SECONDS]
        if chunk:
            slices.append(round(max(chunk), 1))
        t += SLICE_SECONDS
    before = [v for ts, v in mib if ts <= w["load_start"]]
    second_half = [(ts, v) for ts, v in load if ts >= (w["load_start"] + w["drained"]) / 2]
    slope = float("nan")
    if len(second_half) >= 3:
        xs = [ts for ts, _ in second_half]
        ys = [v for _, v in second_half]
        slope = statistics.linear_regression(xs, ys).slope * 60.0
    return {
        "samples": len(mib),
        "start_mib": before[-1] if before else mib[0][1],
        "peak_mib": max(v for _, v in mib),
        "end_mib": mib[-1][1],
        "peak_per_slice_mib": slices,
        "slice_seconds": SLICE_SECONDS,
        "second_half_slope_mib_per_min": slope,
        # What the sessions hold at the end, as `GET /api/session` JSON: the folds the server
        # keeps warm (an LRU of 128 sessions) grow with this, by design.
        "session_views_mib_at_end": w["view_bytes"] / 1024.0 / 1024.0,
    }


def summarize(outcome: Outcome, args: argparse.Namespace) -> dict[str, Any]:
    w = outcome.window
    duration = w["drained"] - w["load_start"]
    in_load = [p for p in outcome.probes if w["load_start"] <= p[0] <= w["deadline"]]
    idle = [p for p in outcome.probes if p[0] < w["load_start"]]
    probes: dict[str, Any] = {}
    for phase, chosen in (("idle", idle), ("load", in_load)):
        for path in ("/api/sessions", "/api/session"):
            values = [p[2] for p in chosen if p[1] == path]
            errors = sum(1 for p in chosen if p[1] == path and p[3] != 200)
            probes[f"{phase} {path}"] = {**dist_ms(values), "errors": errors}
    latencies = [v for sub in outcome.subscribers for v in sub.latencies]
    delivered = sum(len(sub.latencies) for sub in outcome.subscribers)
    turns = outcome.turns

    def lag_load(samples):
        return [v for t, v in samples if w["load_start"] <= t <= w["deadline"]]

    cpu = outcome.monitor.cpu_percent(w["load_start"], w["deadline"])
    in_deadline = w["deadline"] - w["load_start"]
    # CPU cost of the work itself, independent of how much CPU other processes left over.
    cost = {}
    if "server" in cpu and turns.durations:
        cost = {
            "server_cpu_ms_per_turn": cpu["server"] * 10.0 / (turns.started / duration),
            "server_loop_cpu_ms_per_turn": cpu.get("server_loop", 0)
            * 10.0
            / (turns.started / duration),
            "client_cpu_ms_per_turn": cpu.get("client", 0) * 10.0 / (turns.started / duration),
            "window_s": in_deadline,
        }
    return {
        "duration_s": duration,
        "turns": {
            "started": turns.started,
            "completed": turns.states.get("completed", 0),
            "states": dict(turns.states),
            "per_s": turns.started / duration,
            "busy_retries": turns.busy_retries,
            "model_requests": outcome.fake_requests,
            "duration": dist_ms(turns.durations),
        },
        "throughput": {
            "appended_events": w["appended"],
            "appended_per_s": w["appended"] / duration,
            "delivered_events": delivered,
            "delivered_per_s": delivered / duration,
            "events_per_turn": w["appended"] / max(1, turns.started),
        },
        "event_latency": dist_ms(latencies),
        "probes": probes,
        "rss": rss_summary(outcome.monitor, w),
        "cpu_percent_of_one_core": cpu,
        "cpu_cost": cost,
        "client_loop_lag": dist_ms(lag_load(outcome.client_lag)),
        "prober_loop_lag": dist_ms(lag_load(outcome.prober_lag)),
    }


def fmt_dist(d: dict[str, float]) -> str:
    return f"{d['p50_ms']:>8.1f} {d['p90_ms']:>8.1f} {d['p99_ms']:>8.1f} {d['max_ms']:>8.1f}"


def report(
    s: dict[str, Any], delivery: dict[str, Any], targets: dict[str, Any], header: str
) -> str:
    t, th = s["turns"], s["throughput"]
    lines = [header, ""]
    lines.append(
        f"{'load window (first start .. last run finished)':<48} {s['duration_s']:>9.1f} s"
    )
    lines.append(
        f"{'turns started / completed':<48} {t['started']:>9} / {t['completed']}"
        + (f"   other states: {t['states']}" if len(t["states"]) > 1 else "")
    )
    lines.append(f"{'turns per second':<48} {t['per_s']:>9.1f}")
    lines.append(
        f"{'events appended (last_seq growth)':<48} {th['appended_events']:>9}"
        f"   {th['appended_per_s']:>8.0f} /s   ({th['events_per_turn']:.1f} per turn)"
    )
    lines.append(
        f"{'events delivered (all subscribers)':<48} {th['delivered_events']:>9}"
        f"   {th['delivered_per_s']:>8.0f} /s"
    )
    lines += ["", f"{'latency':<48} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}"]
    lines.append(f"{'event: arrival - envelope.at':<48} {fmt_dist(s['event_latency'])}")
    lines.append(f"{'turn: start request -> run.finished received':<48} {fmt_dist(t['duration'])}")
    for key, d in s["probes"].items():
        label = f"GET {key.split(' ', 1)[1]} ({key.split(' ', 1)[0]})"
        err = f"  {d['errors']} errors" if d["errors"] else ""
        lines.append(f"{label:<48} {fmt_dist(d)}{err}")
    lines.append(
        f"{'client event loop lag (SSE readers, drivers)':<48} {fmt_dist(s['client_loop_lag'])}"
    )
    lines.append(f"{'prober event loop lag':<48} {fmt_dist(s['prober_loop_lag'])}")
    rss = s["rss"]
    slices = ", ".join(f"{v:.0f}" for v in rss["peak_per_slice_mib"])
    lines += [
        "",
        f"{'server RSS: start / peak / end':<48} {rss['start_mib']:>7.1f} / "
        f"{rss['peak_mib']:.1f} / {rss['end_mib']:.1f} MiB",
        f"{'server RSS peak per 10 s of load':<48} {slices} MiB",
        f"{'server RSS slope, second half of the load':<48} "
        f"{rss['second_half_slope_mib_per_min']:>7.1f} MiB/min",
        f"{'all sessions as GET /api/session JSON, at end':<48} "
        f"{rss['session_views_mib_at_end']:>7.1f} MiB",
    ]
    cpu = s["cpu_percent_of_one_core"]
    if cpu:
        cores = os.cpu_count() or 1
        lines += ["", f"CPU during the load, % of one core ({cores} cores = {100 * cores}%):"]
        server = (
            f"  server {cpu.get('server', 0):.0f}% (event loop thread "
            f"{cpu.get('server_loop', 0):.0f}%, other threads "
            f"{cpu.get('server_other_threads', 0):.0f}%)"
        )
        client = (
            f"  client {cpu.get('client', 0):.0f}% (main loop: SSE readers + drivers "
            f"{cpu.get('client_loop', 0):.0f}%, fake model {cpu.get('fake_model', 0):.0f}%,"
            f" prober {cpu.get('prober', 0):.0f}%)"
        )
        lines += [server, client]
        if "machine" in cpu:
            lines.append(
                f"  whole machine {cpu['machine']:.0f}%, of which other processes "
                f"{cpu.get('other_processes', 0):.0f}%"
            )
        cost = s["cpu_cost"]
        if cost:
            lines.append(
                f"  CPU per turn: server {cost['server_cpu_ms_per_turn']:.1f} ms (event "
                f"loop {cost['server_loop_cpu_ms_per_turn']:.1f} ms), client "
                f"{cost['client_cpu_ms_per_turn']:.1f} ms"
            )
    lines += ["", f"{'target':<48} {'p99 ms':>8}  verdict"]
    for key, target in targets.items():
        verdict = "MET" if target["met"] else "NOT MET"
        lines.append(f"{key:<48} {target['p99_ms']:>8.1f}  < {target['max_ms']:g} ms  {verdict}")
    lines += [
        "",
        f"delivery: {delivery['subscribers']} subscribers, {delivery['lost']} lost, "
        f"{delivery['duplicated']} duplicated, {delivery['out_of_order']} out of order, "
        f"{delivery['reconnects']} reconnects",
    ]
    return "\n".join(lines)
