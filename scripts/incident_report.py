"""Plots and docs for the incident replay (scripts/incident.py calls write_all).

Writes docs/incident/results.json, docs/incident/*.png, docs/incident.md and
docs/incident-readme-section.md from one run's results. Every number in them comes from
that run.
"""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RATE = 1000


def by_name(results):
    return {r["name"]: r for r in results["runs"]}


def smooth_1s(series):
    """Trailing 1 s sum of 100 ms bins (calls in the last second, a rate per second)."""
    out = []
    for i in range(len(series)):
        out.append(sum(series[max(0, i - 9): i + 1]) * (10 / min(10, i + 1)))
    return out


def plot_partner(results, runs, path, title, failure=False, pin=False):
    sc = results["scenario"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        s = r["series_sent_100ms"]
        t = [i / 10 + 0.05 for i in range(len(s))]
        ax.plot(t, [v * 10 for v in s], color="0.75", lw=0.8, label="per 100 ms (×10)")
        ax.plot([i / 10 + 0.1 for i in range(len(s))], smooth_1s(s), color="C0", lw=1.6, label="last 1 s")
        ax.axhline(RATE, color="red", ls="--", lw=1.2, label="quota 1000/s")
        if pin and "pin" in r:
            p = r["pin"]
            ax.axvline(p["pinned_s"], color="purple", ls="-.", lw=1, label="RL.PIN")
            ax.hlines(p["rate"], p["pinned_s"], sc["duration"], color="purple", ls="--", lw=1.2,
                      label=f"pinned {p['rate']:g}/s")
        ax.axvline(sc["scale_at"], color="0.3", ls=":", lw=1)
        ax.axvspan(0, sc["warmup"], color="0.93")
        if failure and "failure" in r:
            f = r["failure"]
            ax.axvspan(f["sigstop_s"], f["sigcont_s"], color="orange", alpha=0.2, label="Redis SIGSTOPped")
            if f["killed"]:
                ax.axvline(f["killed"][0]["at_us"] / 1e6, color="purple", ls="-.", lw=1, label="instance dies")
        top = 3000
        peak = max(v * 10 for v in s)
        ax.set_ylim(0, top)
        if peak > top:  # a 100 ms spike off the scale: say how high
            i = max(range(len(s)), key=lambda k: s[k])
            ax.annotate(f"{peak:,}/s in 100 ms", (i / 10 + 0.05, top), xytext=(i / 10 + 0.3, top * 0.85),
                        fontsize=7, arrowprops=dict(arrowstyle="->", lw=0.6))
        ax.set_ylabel("calls/s")
        ax.set_title(r["label"], fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    if failure or pin:
        axes[-1, 0].legend(fontsize=7, loc="upper center", ncol=3)
    else:
        axes[0, 0].legend(fontsize=7, loc="upper right", ncol=3)
    axes[-1, 0].set_xlabel("seconds (grey band: warm-up, excluded from the means; dotted: 8 → 16 instances)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_central(results, runs, path):
    sc = results["scenario"]
    fig, ax = plt.subplots(figsize=(10, 4))
    styles = ["-", "--", "-.", ":"]
    for k, r in enumerate(r for r in runs if r["kind"] != "local"):
        pts = [p for p in r["series_central_calls"] if p[0] >= 0.2]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [max(p[1], 1) for p in pts], lw=1.3, ls=styles[k % 4],
                label=f"{r['label']}: {r['central_calls_per_s']:,.0f}/s mean")
    ax.set_yscale("log")
    ax.axvline(sc["scale_at"], color="0.3", ls=":", lw=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("central Redis calls/s (100 ms samples)")
    ax.set_title("Calls the limiter makes to Redis (INFO commandstats), same trace; the local split makes none",
                 fontsize=10)
    ax.set_ylim(1, 10000)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_shares(results, r, path):
    """Each instance's share (tokens/s) over time: hot instances red, the other first 8 blue,
    the 8 added at the scale-out green."""
    sc = results["scenario"]
    hot = set(results["instances"]["hot"])
    base = results["instances"]["before"]
    series = r["shares"]["series"]
    fig, ax = plt.subplots(figsize=(10, 4))
    n = max((len(rates) for _, rates in series), default=0)
    for i in range(n):
        pts = [(t, rates[i]) for t, rates in series if rates[i] is not None]
        if not pts:
            continue
        color = "C3" if i in hot else ("C0" if i < base else "C2")
        label = None
        if i == min(hot):
            label = "hot instances (700/s, then 400/s demand)"
        elif i == min(set(range(base)) - hot):
            label = "cold instances (80/s, then 100/s)"
        elif i == base:
            label = "added at the scale-out (100/s)"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=1, alpha=0.8, label=label)
    fair = r["shares"]["fair_share_16"]
    ax.axhline(min(fair.values()), color="0.4", ls="--", lw=0.8, label=f"fair share with 16: {min(fair.values()):.1f}/s")
    ax.axvline(sc["scale_at"], color="0.3", ls=":", lw=1)
    if "failure" in r:
        f = r["failure"]
        ax.axvspan(f["sigstop_s"], f["sigcont_s"], color="orange", alpha=0.2, label="Redis SIGSTOPped")
    ax.set_xlabel("seconds (dotted: 8 → 16 instances)")
    ax.set_ylabel("share, tokens/s")
    reached = r["shares"]["fair_after_scale_s"]
    ax.set_title(f"{r['label']}: each instance's share (fair within 10 % "
                 f"{'%.1f s' % reached if reached is not None else 'never'} after the scale-out)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_moving(r, path):
    """(i): the fleet's let-out (per 100 ms and over the last 1 s) against the quota and the
    97 % target, and each instance's share, the hot spot's moves marked."""
    mv = r["moving"]
    sc = mv["scenario"]
    every, dur = sc["move_every"], sc["duration"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    s = r["series_sent_100ms"]
    top.plot([i / 10 + 0.05 for i in range(len(s))], [v * 10 for v in s], color="0.75", lw=0.8,
             label="per 100 ms (×10)")
    top.plot([i / 10 + 0.1 for i in range(len(s))], smooth_1s(s), color="C0", lw=1.6, label="last 1 s")
    top.axhline(RATE, color="red", ls="--", lw=1.2, label="quota 1000/s")
    top.axhline(RATE * mv["target"], color="C2", ls=":", lw=1.2, label=f"{100 * mv['target']:.0f} %")
    top.axvspan(0, sc["warmup"], color="0.93")
    top.set_ylim(0, 1600)
    top.set_ylabel("sent to the partner, calls/s")
    top.set_title(f"{r['label']}: {100 * mv['utilisation']:.1f} % of the quota from "
                  f"{sc['warmup']:g} s on", fontsize=9, loc="left")
    top.legend(fontsize=7, loc="lower right", ncol=4)
    series = r["shares"]["series"]
    n = max((len(rates) for _, rates in series), default=0)
    for i in range(n):
        pts = [(t, rates[i]) for t, rates in series if rates[i] is not None]
        if pts:
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, color=f"C{i % 10}",
                        label=f"instance {i}")
    bottom.axhline(mv["fair_hot"], color="0.4", ls="--", lw=0.8,
                   label=f"the hot one's fair share: {mv['fair_hot']:.0f}/s")
    bottom.set_ylabel("share, tokens/s")
    bottom.set_xlabel(f"seconds (dotted: the hot spot moves to the next instance, every {every:g} s)")
    bottom.legend(fontsize=6, loc="upper right", ncol=5)
    for ax in (top, bottom):
        k = 1
        while k * every < dur:
            ax.axvline(k * every, color="0.3", ls=":", lw=1)
            k += 1
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def moving_section(r):
    """(i): the page's section for the moving hot spot, from its own run."""
    mv = r["moving"]
    sc = mv["scenario"]
    m = r["machine"]
    every = sc["move_every"]
    secs = " | ".join(f"{k}–{k + 1} s" for k in range(len(mv["per_second"])))
    rows = [f"| | {secs} |", "|---|" + "---:|" * len(mv["per_second"]),
            "| sent to the partner | " + " | ".join(f0(x) for x in mv["per_second"]) + " |"]
    conv = ", ".join(f"{c['after_s']:.2f} s" if c["after_s"] is not None else "not within the move"
                     for c in mv["converge"])
    windows = ["| window | most sent | bound `cap + rate × t + holders` |", "|---:|---:|---:|"]
    for w, most, bound in mv["windows"]:
        label = f"{w * 1000:g} ms" if w < 1 else f"{w:g} s"
        windows.append(f"| {label} | {f0(most)} | {f0(bound)}{'' if most <= bound else ' (EXCEEDED)'} |")
    ok = [c["after_s"] for c in mv["converge"] if c["after_s"] is not None]
    why = ""
    if mv["utilisation"] < mv["target"]:
        shift = mv["fair_hot"] - mv["demand"]["cold"]
        why = f"""- **Why under the target**: a move shifts {shift:.0f}/s of share from one holder to another,
  and until both have called the cooled holder holds share it no longer uses while the heated
  one is refused: the tenths of a second after each move in the table. The shares plot
  shows the steps: the cooled holder sees its fall within a few 25 ms ticks and reports its
  level since the fall once 100 ms of it are measured; the server counts its old share for
  the call's 250 ms hold (it may still be using it while the call is under way); the heated
  holder, cut to what is free at its early call, is sent back when that hold ends. About
  0.4 s per move costs about {shift:.0f}/s × 0.4 s ÷ {every:g} s ≈ {100 * shift * 0.4 / every / RATE:.0f} % of the
  quota; the light instances' measured demands (Poisson, about ±10 % over a second, no
  headroom) leave a few more % between what some are given and what they use. The skew
  bench's moving case (4 processes, 900/s and 200/s: 200/s shifts, paced demands) loses
  less.
"""
    return f"""
## (i) The hot spot moves (RL.SHARE)

The seed's 8 instances, one of them hot at the seed's {mv['demand']['hot']:g}/s and the other 7 at
{mv['demand']['cold']:g}/s ({mv['demand']['total']:,.0f}/s in all against 1000/s, so someone is always short); every
{every:g} s the hot spot moves to the next instance (instance 0 first, then 1, 2, ...). No
scale-out. Its own trace, from the same seed and generator ({r['trace']['arrivals']:,} arrivals over
{sc['duration']:g} s, sha256 `{r['trace']['sha256'][:16]}…`), replayed with the same driver and
`ShareLimiter` settings as (g) (period 1 s, default settings). Max-min fair, the hot instance
gets {mv['fair_hot']:.0f}/s and every other its 80/s. Its own run: {m['date_utc']}, commit
`{m['commit']}`, load average {m['load_average_at_start'][0]} when it started.

![moving hot spot](incident/share_moving.png)

{chr(10).join(rows)}

- **Utilisation** from {sc['warmup']:g} s on: **{100 * mv['utilisation']:.1f} %** of the quota
  (target ≥ {100 * mv['target']:.0f} % while anyone is short). The first second is low because
  every local bucket starts empty (the bound needs it).
- **Converged** (the newly hot instance lets out {100 * 0.95:.0f} % of its {mv['fair_hot']:.0f}/s in a
  200 ms window) after each move: {conv}{f' (median {sorted(ok)[len(ok) // 2]:.2f} s)' if ok else ''}. The
  instance that cooled reports its fall early (its demand strayed by more than a quarter),
  as its level since the fall, and gives its share back; the one that heated asks for its
  new demand early the same way.
{why}- **Redis calls**: {f1(r['central_calls_per_s'])}/s `RL.SHARE` for the 8 instances, against
  8/s for one call per instance per period: the early calls after each move.
- **The bound**: every prefix of the sends within `cap + rate × t + holders` (worst of sent −
  (cap + rate × t): {f1(r['bound_excess'])}), and every window:

{chr(10).join(windows)}
"""


def f0(x):
    return "–" if x is None else f"{x:,.0f}"


def f1(x):
    return "–" if x is None else f"{x:,.1f}"


def ms(us):
    return "–" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")


def write_all(results, root):
    d = os.path.join(root, "docs", "incident")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    runs = [r for r in results["runs"] if r["available"]]
    main = [r for r in runs if r["kind"] not in ("failure", "share_failure", "pin", "share_moving")]
    moving = [r for r in runs if r["kind"] == "share_moving"]
    if moving:
        plot_moving(moving[0], os.path.join(d, "share_moving.png"))
    pinned = [r for r in runs if r["kind"] == "pin"]
    if pinned:
        plot_partner(results, pinned, os.path.join(d, "pins.png"),
                     f"The partner asks for {pinned[0]['pin']['rate']:g}/s at "
                     f"{pinned[0]['pin']['pinned_s']:.1f} s: RL.PIN on the shared key", pin=True)
    fail = [r for r in runs if r["kind"] == "failure"]
    share_fail = [r for r in runs if r["kind"] == "share_failure"]
    share = by_name(results).get("share")
    if share and share["available"]:
        plot_shares(results, share, os.path.join(d, "shares.png"))
    if share_fail:
        plot_partner(results, share_fail, os.path.join(d, "share_failures.png"),
                     f"ShareLimiter: the largest holder dies ({results['scenario']['kill_at']:g} s), Redis stopped 8–10 s",
                     failure=True)
    plot_partner(results, main, os.path.join(d, "partner_rate.png"),
                 "Calls reaching the partner, same 2500/s skewed trace, quota 1000/s")
    plot_central(results, main, os.path.join(d, "central_calls.png"))
    if fail:
        plot_partner(results, fail, os.path.join(d, "failures.png"),
                     f"PrefetchLimiter: an instance dies holding its lease ({results['scenario']['kill_at']:g} s), Redis stopped 8–10 s", failure=True)
    with open(os.path.join(root, "docs", "incident.md"), "w") as f:
        f.write(markdown(results))
    with open(os.path.join(root, "docs", "incident-readme-section.md"), "w") as f:
        f.write(readme_section(results))


def main_table(results):
    sc = results["scenario"]
    w, s, e = sc["warmup"], sc["scale_at"], sc["duration"]
    rows = [
        f"| approach | partner mean, {w:g}–{e:g} s | 8 instances ({w:g}–{s:g} s) | 16 instances ({s:g}–{e:g} s) "
        "| max in any 1 s | over quota (max 1 s) | worst of sent − (cap + rate × t) | central calls/s | Redis command µs/s | Redis CPU | "
        "added latency p50 / p99 | denied | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"]:
        if r["kind"] in ("failure", "share_failure", "pin", "share_moving"):
            continue
        if not r["available"]:
            rows.append(f"| {r['label']} | not available in this build (the server does not know the command) "
                        "| | | | | | | | | | | |")
            continue
        over = r["over_issue_max_1s"]
        rows.append(
            f"| {r['label']} | {f0(r['partner_mean'])}/s | {f0(r['partner_mean_8'])}/s | "
            f"{f0(r['partner_mean_16'])}/s | {f0(r['partner_max_1s'])} | "
            f"{'+' + f0(over) + f' (+{over / 10:.0f} %)' if over > 0 else f0(over)} | "
            f"{f1(r['bound_excess'])} | "
            f"{f0(r['central_calls_per_s'])} | {f0(r['redis_cmd_us_per_s'])} | {f1(r['redis_cpu_pct'])} % | "
            f"{ms(r['latency_p50_us'])} / {ms(r['latency_p99_us'])} | {f0(r['denied'])} | {f0(r['errors'])} |")
    return "\n".join(rows)


def failure_table(results):
    rows = [
        "| policy | dead instance: tokens it held | its lease gone on the server after | partner during the outage: 1st s / 2nd s "
        "| over quota during the 2 s | max in any 1 s around the outage | local decisions until | p99 added latency during the outage | denied during the outage |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"]:
        if r["kind"] != "failure" or not r["available"]:
            continue
        f = r["failure"]
        k = f["killed"][0] if f["killed"] else {"held_tokens": None, "instance": None}
        over = f["excess_over_quota_during_outage"]
        rows.append(
            f"| {r['label'].split(', ')[-1]} | {f0(k['held_tokens'])} (instance {k['instance']}) | "
            f"{f1(f['leases_expired_after_death_s'])} s ({f['leases_expired_within_ttl']} lease(s)) | {f0(f['outage_rate_first_1s'])} / {f0(f['outage_rate_second_1s'])} | "
            f"{'+' + f0(over) if over > 0 else f0(over)} | {f0(f['max_1s_around_outage'])} | "
            f"{f1(f['fallback_ends_after_sigcont_s'] * 1000 if f['fallback_ends_after_sigcont_s'] is not None else None)} ms after SIGCONT | "
            f"{ms(f['latency_p99_during_outage_us'])} | {f0(f['denied_during_outage'])} |")
    return "\n".join(rows)


def share_failure_table(results):
    rows = [
        "| policy | dead holder: its share | its share back to the others after | partner during the outage: 1st s / 2nd s "
        "| over quota during the 2 s | max in any 1 s around the outage | fallback decisions (granted) | denied during the outage |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"]:
        if r["kind"] != "share_failure" or not r["available"]:
            continue
        f = r["failure"]
        k = f["killed"][0] if f["killed"] else {"held_tokens": None, "instance": None}
        over = f["excess_over_quota_during_outage"]
        rows.append(
            f"| {r['label'].split(', ')[-1]} | {f0(k['held_tokens'])}/s (instance {k['instance']}) | "
            f"{f1(r['shares'].get('dead_share_back_after_s'))} s | {f0(f['outage_rate_first_1s'])} / {f0(f['outage_rate_second_1s'])} | "
            f"{'+' + f0(over) if over > 0 else f0(over)} | {f0(f['max_1s_around_outage'])} | "
            f"{f0(f['fallback_decisions'])} ({f0(f['fallback_granted'])}) | {f0(f['denied_during_outage'])} |")
    return "\n".join(rows)


def markdown(results):
    m = results["machine"]
    sc = results["scenario"]
    R = by_name(results)
    ls, lr = R.get("local_static"), R.get("local_recompute")
    take, lua, pf = R.get("take"), R.get("lua"), R.get("prefetch")
    res = R.get("reserve")
    pf_tok = pf["client"].get("lease_tokens", 0) / max(1, pf["client"].get("leases", 1)) if pf else 0
    reserve_note = (
        "RL.RESERVE was **not available in this build** (the server did not know the command, by "
        "`COMMAND INFO`), so row (e) has no numbers. The driver sends "
        f"`RL.RESERVE key 1000 1000 1 {results['max_wait_ms']}`, sleeps `wait_ms` and then sends; rerun "
        "`scripts/incident` on a build that has it and the row fills in."
        if res and not res["available"] else
        f"RL.RESERVE pacing (max wait {results['max_wait_ms']} ms): the call is granted now and sent after "
        "`wait_ms`; its added latency includes that wait.")
    hot_before = sum(v for k, v in results["demand_per_s"]["before"].items() if int(k) in results["instances"]["hot"])
    hot_after = sum(v for k, v in results["demand_per_s"]["after"].items() if int(k) in results["instances"]["hot"])
    out = f"""# The incident, replayed

Regenerated by `scripts/incident` (a few minutes, loopback only). Every number on this page
comes from one run (but (i), the moving hot spot, which gives its own): **{m['date_utc']}**, {m['cpu']}, {m['cores']} cores shared with other
work, Linux {m['kernel']}, {m['redis']}, module `{os.path.basename(results['module'])}`,
commit `{m['commit']}`, load average {m.get('load_average_at_start', ['?'])[0]} when it started. Absolute latencies and CPU figures vary from run to run on a shared
machine; the partner-side counts and the bounds do not depend on timing.
Raw results: [incident/results.json](incident/results.json).

## The scenario

- **Quota**: 1000 calls/s to the partner, burst 1000 (`rate 1000, cap 1000`).
- **Fleet**: 8 instances at first. At {sc['scale_at']:g} s the autoscaler, reacting to the three
  saturated instances, adds 8 more (16 in all).
- **Demand**: 2500 calls/s in total throughout, Poisson arrivals per instance. With 8
  instances the 3 hot ones carry {hot_before:.0f}/s ({hot_before / 25:.0f} %: 700/s each) and the other
  5 carry 80/s each. After the scale-out the hot 3 keep their long-lived client connections
  and {hot_after:.0f}/s (400/s each); the other 13 carry 100/s each.
- **One trace**: generated once from seed {results['seed']} ({results['arrivals']:,} arrivals over
  {sc['duration']:g} s, sha256 `{results['trace_sha256'][:16]}…`) and replayed unchanged for every
  approach. Each instance is a separate task with its own Redis connection and its own
  limiter; each request is its own task. The load driver is
  [`client/examples/incident.rs`](../client/examples/incident.rs) (rl-client), orchestrated by
  [`scripts/incident.py`](../scripts/incident.py).
- **The partner** is a counter: each instance records when it sent a call (after any pacing
  wait). Rates are per second, from those timestamps. The first {sc['warmup']:g} s are
  warm-up (every bucket starts full, so the first second lets out up to cap + rate = 2000
  under any approach); means and maxima are over {sc['warmup']:g}–{sc['duration']:g} s.
- **Central cost**: `INFO commandstats` and `INFO cpu` sampled every 100 ms: calls/s of the
  limiter's commands (EVALSHA, RL.*), their server time (µs per second) and the
  redis-server process's CPU (user + sys, % of one core).
- **Added latency**: from the request handing its decision to the limiter until it may
  send (including any pacing wait).

## Results

![partner rate](incident/partner_rate.png)

{main_table(results)}

![central calls](incident/central_calls.png)

## How the over-issue was reproduced, and what the source documents get wrong

The incident retrospective says the 3 hot instances "each let out their full 125, and
that already added up to more than 1000". That arithmetic cannot hold: 3 × 125 = 375, and 8
local buckets of 125/s cannot let out more than 8 × 125 = 1000/s on average whatever the
skew (plus at most 8 × 125 tokens of burst, once). The replay shows what skew alone does:
with 8 instances the local split let out **{f0(ls['partner_mean_8'])}/s** — *under* the quota —
while the hot instances refused most of their traffic (the other 5 had unused allowance
they could not lend). Skew makes a static split unfair and wasteful, not over-issuing.

The over-issue needs the denominator to move, which is the mechanism the follow-up analysis describes
(the instance count is not a controlled denominator; a scale-out doubles it while the
per-instance limits still assume the old count, "the total let out is the sum of the
per-instance shares"). In the replay the autoscaler adds 8 instances at {sc['scale_at']:g} s:

- **(a) limit configured as 125/s per instance** (a static number, computed for 8): the 16
  instances may let out 2000/s together; on this trace the partner received
  **{f0(ls['partner_mean_16'])}/s** on average after the scale-out (max **{f0(ls['partner_max_1s'])}** in
  one second, **+{ls['over_issue_max_1s'] / 10:.0f} %** over the quota). The incident's 1780 is the
  same shape; the exact figure depends on how the demand spread, which the documents do not
  give.
"""
    if lr:
        out += f"""- **(a') new instances divide by the new count** (1000/16 = 62.5/s), old ones keep 125/s
  until they restart, as the follow-up analysis describes for a scale-out or rolling deploy: **{f0(lr['partner_mean_16'])}/s**
  after the scale-out (max **{f0(lr['partner_max_1s'])}** in one second). The transient right after
  the scale-out is the worst second: each new instance starts with a full local bucket.
"""
    out += f"""
Every shared-bucket approach ((b)–(e)) replays the same trace, the same scale-out and the
same skew, and the partner stays at the quota: the bucket does not know how many instances
there are, so there is no denominator to get wrong.

## Reading the rows

- **(b) Lua script and (c) RL.TAKE** both hold the partner to 1000/s ({f0(lua['partner_mean'] if lua else None)}/s
  and {f0(take['partner_mean'] if take else None)}/s) at one Redis call per request: {f0(lua['central_calls_per_s'] if lua else None)} and
  {f0(take['central_calls_per_s'] if take else None)} calls/s, i.e. the full demand, denied requests included.
  Server time per second: {f0(lua['redis_cmd_us_per_s'] if lua else None)} µs for the script,
  {f0(take['redis_cmd_us_per_s'] if take else None)} µs for RL.TAKE (command time only; the process CPU column
  adds networking, which dominates at these rates). "Max in any 1 s" above 1000 is not a
  breach: a token bucket lets out up to `cap + rate` in one second after a pause, and any
  pause in spending (a client stalled on this shared machine, a reply that arrives late)
  refills the bucket, which is spent later; timestamps are taken at the client, after the
  reply. The bound that holds is cumulative: every prefix of the sends is at most
  `cap + rate × t`, which the smoke run checks (largest margin in this run, (b) / (c) / (d):
  {f1(lua['bound_excess'] if lua else None)} / {f1(take['bound_excess'] if take else None)} / {f1(pf['bound_excess'] if pf else None)} tokens, negative = under).
- **(d) PrefetchLimiter, batch {results['batch']}**: also 1000/s. It made
  {f0(pf['central_calls_per_s'] if pf else None)} Redis calls/s, not 1/{results['batch']} of the
  requests: with demand at 2.5× the quota the shared bucket is empty almost all the time,
  and `RL.LEASE ... MIN 1` hands out what has refilled since the last call, so a lease
  carried **{pf_tok:.1f} tokens on average** in this run; and {f0(pf['client'].get('leases_denied'))} of its
  {f0(pf['client'].get('redis_calls'))} calls were denied leases (the client skips Redis after a denial
  only for its `retry_after`, about 1 ms at 1000 tokens/s). The central-calls plot shows
  the other regime in the first 0.7 s, while the bucket still had its initial burst: about
  one call per 20 requests. Batching cuts central calls by the batch size only while the
  bucket has tokens to spare; under sustained overload it does not, and (c) costs about
  as many calls.
- **(e)** {reserve_note}
"""
    sh = R.get("share")
    if sh and sh["available"]:
        shd = sh["shares"]
        out += f"""- **(g) ShareLimiter** (`RL.SHARE`, period {results.get('period_ms', 1000) / 1000:g} s): each instance
  holds a share of the rate and decides every request from a local bucket at that share;
  once a period it tells the server its measured demand (`want`) and gets its share back,
  max-min fair by want. The partner got **{f0(sh['partner_mean'])}/s** with
  **{f1(sh['central_calls_per_s'])} Redis calls/s** (one per instance per period, plus a few
  short refreshes after the scale-out), against {f0(pf['central_calls_per_s'] if pf else None)}/s for (d).
  No request waits for Redis: added latency {ms(sh['latency_p50_us'])} / {ms(sh['latency_p99_us'])} p50 / p99.
  Every prefix of the sends stayed within `cap + rate × t + holders` (worst of sent −
  (cap + rate × t): {f1(sh['bound_excess'])}; every local bucket starts empty, so the fleet
  stays about a cap under). With 8 instances the hot ones got the larger shares: the cold
  ones ask for their measured demand (no headroom by default, and an early call when it
  moves) and the rest goes to the hot: the 8-instance phase ran at
  {f0(sh['partner_mean_8'])}/s; after the
  scale-out every instance wants more than 1000/16, so all converge on 62.5/s: within 10 %
  of it **{f1(shd['fair_after_scale_s'])} s** after the scale-out (a newcomer gets what is free at
  once, and the rest as the others refresh and their old shares' 250 ms hold ends).

![shares](incident/shares.png)
"""
    if any(r["kind"] == "failure" for r in results["runs"]):
        out += f"""
## (f) An instance dies holding a lease; Redis stops for 2 s

Three more runs of (d), one per failure policy, on the same trace. At {sc['kill_at']:g} s the instance
holding the most leased tokens stops dead (its lease is never returned; in-flight requests
finish). From
{sc['stop_at']:g} s to {sc['stop_at'] + sc['stop_for']:g} s redis-server is SIGSTOPped, then SIGCONTed. Client
timeout 200 ms, probe every 500 ms (the defaults); `Allow` falls back to 1/8 of the limit per
instance (`instances: 8`), the value one would configure for 8 instances.

![failures](incident/failures.png)

{failure_table(results)}

- **The dead instance** dies at {sc['kill_at']:g} s, while the bucket still holds part of its
  initial burst, so leases are full batches (later, under the overload, a lease carries a
  token or two and a death strands almost nothing). What it held is debited and
  unavailable to the others until its lease expires on the server ({results['ttl_ms']} ms TTL):
  the table gives the tokens it held and when `INFO rl` counted the lease(s) as expired
  (`rl_leases_expired`, sampled every 100 ms). Nothing reaches the partner from a dead
  lease: it withholds at most batch + renewal threshold tokens for at most the TTL. Its
  later arrivals are dropped (it is dead); the demand left is still well over the quota.
- **Redis stopped**: for the first 200 ms every call waits for the timeout; then each
  instance decides locally until a probe succeeds after SIGCONT.
  - `Allow` (`instances: 8`) turns the fleet back into the local split, with its denominator
    problem: 16 instances × 125/s, so the partner saw more than the quota for the outage.
  - `LastKnown` starts each instance's local bucket full (RL.LEASE replies carry no bucket
    level, so there is no "last level" to start from) at the rate it was last granted, so
    the first second of the outage lets out about one extra burst, then stays near the
    fleet's last rate.
  - `Deny` sends nothing for 2 s (apart from tokens already leased).
  - After SIGCONT the shared bucket has refilled during the pause (server time kept
    running), so the fleet may spend a burst of up to `cap` again: that is within
    `cap + rate × t`, and it is why the second after the outage can exceed 1000.
"""
    if any(r["kind"] == "share_failure" for r in results["runs"]):
        out += f"""
## (f) for ShareLimiter: a holder dies; Redis stops for 2 s

The same failures for (g), one run per failure policy. At {sc['kill_at']:g} s the holder of
the largest share stops dead: it neither refreshes nor releases, so the server counts its
share until its lease ends (3 periods) and then divides the rate among the others. While
redis-server is SIGSTOPped each instance keeps its share until `s + 250 ms` after a refresh
it sent got no answer (the server may have taken that call), then the failure policy decides:
`Allow` lets out `rate / holders` (the last holder count seen) for at most `allow_for`,
`LastKnown` the last share, `Deny` nothing. After SIGCONT the first answer brings a share,
starting from an empty bucket.

![share failures](incident/share_failures.png)

{share_failure_table(results)}
"""
    pins = [r for r in results["runs"] if r["kind"] == "pin" and r["available"]]
    if pins:
        rows = ["| approach | pinned at | until a 100 ms step ≤ the pin | until every 1 s window ≤ the pin | lowest 100 ms step in the 2 s after | rate after | max in any 1 s after | worst of sent − (pin cap + pin rate × t) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in pins:
            p = r["pin"]
            first = p.get("first_100ms_within_s")
            rows.append(f"| {r['label']} | {p['pinned_s']:.2f} s | "
                        f"{'%.1f s' % first if first is not None else '–'} | {p['settled_s']:.2f} s | "
                        f"{f0(p.get('min_100ms_2s_after'))}/s | "
                        f"{f0(p['rate_after'])}/s | {f0(p['max_1s_after'])} | {f1(p['bound_excess'])} |")
        out += f"""
## (h) The partner asks for {pins[0]['pin']['rate']:g}/s: a pin, no redeploy

Mid-trace the partner asks for {pins[0]['pin']['rate']:g}/s. An operator runs
`RL.PIN incident:partner {pins[0]['pin']['rate']:g} {pins[0]['pin']['rate']:g}` (or `python -m redis_rl pin
incident:partner {pins[0]['pin']['rate']:g}/s`); the instances keep sending their own limit, 1000/s, and
the key decides under the pin from its next call. A caller of `RL.TAKE` sees it at once; a
prefetching instance spends the lease it holds first (at most a batch or two per instance).
A `ShareLimiter` (as in (g), period 1 s) picks the pin up at its next share call, at most a
period later; the server divides the pinned rate among the holders but keeps counting the
shares it gave before the pin until they end (one lease, three periods: docs/share.md).

{pin_runs_when(pins)}

![pins](incident/pins.png)

{chr(10).join(rows)}
{pin_share_notes(pins)}"""
    mv = R.get("share_moving")
    if mv and mv["available"] and "moving" in mv:
        out += moving_section(mv)
    out += f"""
## Reproduce

    scripts/incident            # full run, regenerates this page, the plots and results.json
    scripts/incident --only share_moving   # one run (here (i)), merged into results.json;
                                           # this page and the plots re-rendered from it
    scripts/incident --only pin_take,pin_prefetch,pin_share   # (h), the same way
    scripts/incident --smoke    # 10 s: the pipeline and the bounds, no plots (CI)

The smoke run checks: (a) the local split's over-issue is visible after the scale-out
(> 1.1 × quota); (b)(c)(e) the sends never exceed `cap + rate × t` (+1 for rounding); (d)
never more than `cap + rate × t + 2 × batch × instances`; (h) RL.TAKE under the pin its own
`cap + rate × t` (+1), the pinned share key the pin's bound with the old shares' allowance
(below (h)'s table); (g) and (i) never more than
`cap + rate × t + holders` ((i) in every window of 50 ms to 2 s too; its smoke run moves
the hot spot every second for 3 s); every arrival replayed. It exits
non-zero on a violation. Plots use matplotlib from PyPI in `target/incident-venv`, pinned
in `scripts/incident-requirements.txt`.
"""
    return out


def pin_runs_when(pins):
    """When and where (h)'s runs ran (they may be run alone: `--only pin_take,...`)."""
    when = [r["machine"] for r in pins if r.get("machine")]
    if not when:
        return ""
    m = when[0]
    return (f"These runs: {m['date_utc']}, commit `{m['commit']}`, load average "
            f"{m['load_average_at_start'][0]:g} when the first started (a 2-core machine shared "
            f"with other work: timings vary from run to run).")


def pin_share_notes(pins):
    """What the table does not say about the pinned share key: when the holders' shares
    summed to the pin, and the slack its bound allows."""
    out = []
    for r in pins:
        p = r["pin"]
        if "bound_slack" not in p:
            continue
        within = p["shares_within_pin_s"]
        out.append(
            f"- **{r['label']}**: the holders' shares (sampled every 100 ms) sum to at most "
            f"{p['rate']:g}/s {'%.1f s after the pin' % within if within is not None else 'never in the run'}; "
            f"the partner's rate in 100 ms steps from the pin: "
            f"{', '.join(f0(v) for v in p['series_100ms_after'][:10])} /s. The holders spend the "
            f"shares they had until their next share call, and the server keeps counting those "
            f"until they end, so the new shares are smaller than the pin's for a while: the "
            f"1 s windows hold the pin (5 % and a call of slack, as the other rows) "
            f"{p['settled_s']:.2f} s after it partly because the overshoot and the dip after it "
            f"cancel out. The pin's bound allows a share key "
            f"the shares and bursts given before it: sent since the pin ≤ pin cap + pin rate × t + "
            f"(old cap − pin cap) + (old rate − pin rate) × one lease + holders = "
            f"{f0(p['bound_slack'])} over; measured {f1(p['bound_excess'])}.")
    return ("\n" + "\n".join(out) + "\n") if out else ""


def readme_section(results):
    R = by_name(results)
    ls, take, pf = R["local_static"], R["take"], R["prefetch"]
    lua = R["lua"]
    fa = R.get("fail_allow")
    m = results["machine"]
    extra = ""
    if fa:
        f = fa["failure"]
        # The same figures as the failure table of docs/incident.md (one source of numbers).
        extra = ("\n- Failing open brings the split back: with Redis stopped for 2 s, "
                 "`Allow` (each instance falling back to 1/8 of the limit: `instances: 8`) let "
                 f"**{f0(f['outage_rate_first_1s'])}** then **{f0(f['outage_rate_second_1s'])}** calls "
                 f"through in those two seconds, {f0(f['excess_over_quota_during_outage'])} over the quota.")
    out = f"""## Why

A partner gave us 1000 calls/s. We ran 8 instances and gave each a local token bucket of
1000/8 = 125/s. [The replay](docs/incident.md) (one 2500/s skewed trace, replayed for
every approach; measured {m['date_utc'][:10]} on {m['cores']} shared cores) shows both halves of what
went wrong:

- With 8 instances the skew alone made the split *under*-deliver: **{f0(ls['partner_mean_8'])}/s**
  reached the partner while the 3 hot instances refused most of their traffic.
- When the autoscaler doubled the fleet, the per-instance 125/s stayed, and the partner got
  **{f0(ls['partner_mean_16'])}/s**, up to **{f0(ls['partner_max_1s'])} in one second** (the incident saw 1780).
  The quota was divided by an instance count nobody controlled.{extra}

One shared bucket has no denominator to get wrong. On the same trace, `RL.TAKE` held the
partner at **{f0(take['partner_mean'])}/s** through the scale-out, at
{f0(take['redis_cmd_us_per_s'])} µs of server time per second against {f0(lua['redis_cmd_us_per_s'])} µs for the
classic Lua script at the same call rate, with {ms(take['latency_p50_us'])} / {ms(take['latency_p99_us'])} p50 / p99 added
latency on loopback (a busy shared machine: see the page for the spread). The prefetching client (`RL.LEASE`, batch {results['batch']}) also held
**{f0(pf['partner_mean'])}/s**, with {f0(pf['central_calls_per_s'])} Redis calls/s against
{f0(take['central_calls_per_s'])} for one call per request: under 2.5× overload the bucket is
nearly empty and leases come back with a token or two, so batching saves nothing there; it
cuts central calls by up to the batch size while the bucket has tokens to spare.

![partner calls per second, local split vs shared bucket](docs/incident/partner_rate.png)
"""
    sh = R.get("share")
    if sh and sh.get("available"):
        out = out.rstrip("\n")
        out += f"""

For one hot key, `ShareLimiter` (`RL.SHARE`: each instance holds a rate share, refreshed once
a second, and decides every request locally) held the partner at **{f0(sh['partner_mean'])}/s** with
**{f1(sh['central_calls_per_s'])} Redis calls/s** in all, and no request waiting for Redis.
"""
    return out
