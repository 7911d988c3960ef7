"""det resource-pool list|describe"""

from __future__ import annotations

import argparse
import re
from typing import Any

from cli.commands import group
from cli.formatting import fmt_time
from cli.output import kv, print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "resource-pool", "resource pools: capacity, queue and autoscaling", aliases=("rp",))
    p = g.add_parser("list", help="list resource pools")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_pools)

    p = g.add_parser("describe", help="a pool: state, last scaling decision, instances")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe)


def _kind(pool: dict[str, Any]) -> str:
    return pool.get("provider") or str(pool.get("type") or "").removeprefix("RESOURCE_POOL_TYPE_").lower()


def _snake(key: str) -> str:
    """The wire's camelCase setting as master.yaml spells it (maxIdleAgentPeriod: max_idle_agent_period)."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _setting(value: Any) -> str:
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _state(pool: dict[str, Any]) -> str:
    state = pool.get("state") or ""
    if pool.get("backoffUntil"):
        state += f" (backoff until {fmt_time(pool['backoffUntil'])})"
    return state


def list_pools(args: Any) -> int:
    pools = authed(args).get("/api/v1/resource-pools")["resourcePools"]
    if args.json:
        print_json(pools)
        return 0
    rows = [[p["name"] + (" (default)" if p.get("defaultComputePool") else ""), _kind(p), p.get("numAgents"),
             f"{p.get('slotsUsed', 0)}/{p.get('slotsAvailable', 0)}", p.get("queuedAllocations"),
             p.get("runningAllocations"), f"{p.get('minAgents', 0)}-{p.get('maxAgents', 0)}",
             len(p.get("instances") or []), _state(p), p.get("error") or ""] for p in pools]
    table(["Name", "Provider", "Agents", "Slots Used", "Queued", "Running", "Min-Max", "Instances", "State", "Error"],
          rows)
    return 0


def decision_lines(decision: Any) -> list[str]:
    """The scale decider's last decision, whatever shape the master stored: a headline then reasons."""
    if decision in (None, {}, ""):
        return []
    if isinstance(decision, str):
        return decision.splitlines()
    if isinstance(decision, list):
        return [str(x) for x in decision]
    if not isinstance(decision, dict):
        return [str(decision)]
    lines = []
    terminate = decision.get("terminate") or decision.get("terminateIds") or []
    if "launch" in decision or terminate:
        lines.append(f"launch {decision.get('launch', 0)}, terminate {len(terminate)}")
    for t in terminate:
        if isinstance(t, dict):
            lines.append(f"  terminate {t.get('id')}: {t.get('reason', '')}")
    for r in decision.get("reasons") or []:
        lines.append(f"  {r}")
    consolidation = decision.get("consolidation")
    if isinstance(consolidation, dict):  # the consolidation stage's decision, and why each instance stays
        lines.append(f"  consolidation: {consolidation.get('reason', '')}")
        lines.extend(f"    {why}" for why in consolidation.get("refused") or [])
    for k, v in decision.items():
        # capacity, offers, launches: shown as their own tables (`describe`)
        if k not in ("launch", "terminate", "terminateIds", "reasons", "capacity", "offers", "launches",
                     "consolidation"):
            lines.append(f"  {k}: {v}")
    return lines


def describe(args: Any) -> int:
    p = authed(args).get(f"/api/v1/resource-pools/{args.name}")["resourcePool"]
    if args.json:
        print_json(p)
        return 0
    kv([
        ("Name", p["name"]),
        ("Description", p.get("description") or ""),
        ("Provider", _kind(p)),
        ("Default", "yes" if p.get("defaultComputePool") else "no"),
        ("Scheduler", str(p.get("schedulerType") or "").removeprefix("SCHEDULER_TYPE_").lower()
         + (" (preemptive)" if p.get("preemptible") else "")),
        ("Agents", f"{p.get('numAgents', 0)} (min {p.get('minAgents', 0)}, max {p.get('maxAgents', 0)})"),
        ("Slots", f"{p.get('slotsUsed', 0)} used of {p.get('slotsAvailable', 0)} "
                  f"({str(p.get('slotType') or '').removeprefix('TYPE_').lower()})"),
        ("Allocations", f"{p.get('runningAllocations', 0)} running, {p.get('queuedAllocations', 0)} queued"),
        ("State", _state(p)),
        ("Error", p.get("error") or ""),
    ])
    settings = p.get("settings")
    if settings:
        print("\nSettings (effective, as the autoscaler acts on them; durations in seconds):")
        width = max(len(_snake(k)) for k in settings)
        for key, value in settings.items():
            print(f"  {_snake(key):<{width}}  {_setting(value)}")
    lines = decision_lines(p.get("lastDecision"))
    if lines:
        print(f"\nLast scaling decision ({fmt_time(p.get('lastDecisionAt')) or 'time unknown'}):")
        for line in lines:
            print(f"  {line}")
    _types_tables(p)
    cooldowns = p.get("capacityCooldowns") or []
    if cooldowns:
        print()
        table(["Location", "Instance Type", "Skipped Until", "Failures", "Last Error"],
              [[c.get("location"), c.get("instanceType"), fmt_time(c.get("until")), c.get("failures"),
                f"{c.get('code')}: {c.get('error')}"] for c in cooldowns],
              title="Capacity cool-downs (locations skipped after running out of capacity)")
    _history_table(p.get("scalingHistory") or [])
    moves = p.get("consolidationMoves") or []
    if moves:
        print()
        table(["At", "Instance", "Allocation", "Trial", "Saving", "Reason"],
              [[fmt_time(m.get("at")), m.get("instanceId") or m.get("launchId"), m.get("allocationId"),
                m.get("trialId") or "", f"{m.get('saving', 0):g} {m.get('savingUnit', '')}", m.get("reason")]
               for m in moves],
              title="Consolidation moves (work moved by checkpoint and resume, newest first)")
    instances = p.get("instances") or []
    print()
    table(["Launch ID", "Instance ID", "State", "Agent", "Type", "Capacity", "Location", "Launched"],
          [[i.get("launchId"), i.get("instanceId") or "", i.get("state"), i.get("agentId") or "",
            i.get("instanceType") or "", i.get("capacity") or "", i.get("location") or "", fmt_time(i.get("launchedAt"))]
           for i in instances],
          title="Instances")
    return 0


def history_what(e: dict[str, Any]) -> str:
    """One history row's change: launches with type and capacity, terminations with reason and cause,
    a consolidation's moves, or a steady run's length."""
    if e.get("kind") == "steady":
        return f"steady ({e.get('ticks', 1)} ticks)" if (e.get("ticks") or 1) > 1 else "steady"
    parts = []
    if e.get("launch"):
        types = [f"{x.get('instanceType')}{' ' + x['capacity'] if x.get('capacity') else ''}"
                 for x in e.get("launches") or [] if x.get("instanceType")]
        parts.append(f"launch {e['launch']}" + (f" ({', '.join(types)})" if types else ""))
    for x in e.get("terminations") or []:
        parts.append(f"terminate {x.get('id')}: {x.get('reason', '')}" + (f" [{x['cause']}]" if x.get("cause") else ""))
    moves = e.get("moves")
    if isinstance(moves, dict):
        parts.append(f"consolidate {moves.get('instance')}: moved {len(moves.get('allocations') or [])}, "
                     f"saving {moves.get('saving', 0):g} {moves.get('unit', '')}")
    return "; ".join(parts) or str(e.get("kind", ""))


def _history_table(events: list[dict[str, Any]]) -> None:
    if not events:
        return
    print()
    table(["At", "Until", "Change", "Reasons"],
          [[fmt_time(e.get("at")), fmt_time(e.get("until")) if (e.get("ticks") or 1) > 1 else "", history_what(e),
            "; ".join(e.get("reasons") or [])] for e in events],
          title="Scaling history (recorded by the master's autoscaler, newest first)")


def _price(usd: Any) -> str:
    return f"${usd:.4g}" if isinstance(usd, int | float) else "unknown"


def _types_tables(p: dict[str, Any]) -> None:
    """A pool of several instance types or capacities: what it may launch at which price, and what
    the last decision chose."""
    offers = p.get("instanceTypes") or []
    if offers:
        print()
        table(["Instance Type", "Capacity", "Slots", "$/h (est.)"],
              [[o.get("instanceType"), o.get("capacity"), o.get("slots") or "?", _price(o.get("usdPerHour"))]
               for o in offers], title=f"Instance types (capacity: {p.get('capacity') or 'on-demand'})")
    decision = p.get("lastDecision") if isinstance(p.get("lastDecision"), dict) else {}
    launches = decision.get("launches") or []
    if launches:
        print()
        table(["Count", "Instance Type", "Capacity", "$/h each (est.)", "Then (no capacity)"],
              [[x.get("count"), x.get("instance_type"), x.get("capacity"), _price(x.get("usd_per_hour_each")),
                ", ".join(x.get("fallbacks") or [])] for x in launches],
              title=f"Chosen launch (est. {_price(decision.get('usd_per_hour'))}/h)")
