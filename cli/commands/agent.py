"""det agent list|enable|disable [--drain]|reset-enrolment, det slot list"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from cli.commands import group
from cli.formatting import fmt_time
from cli.output import print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "agent", "the agents of the cluster", aliases=("a",))
    p = g.add_parser("list", help="list agents")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_agents)
    p = g.add_parser("enable", help="let an agent take new work again (admin)")
    p.add_argument("agent_id")
    p.set_defaults(func=enable_agent)
    p = g.add_parser("disable", help="place nothing new on an agent; kill its work, or let it finish with --drain "
                                     "(admin)")
    p.add_argument("agent_id")
    p.add_argument("--drain", action="store_true",
                   help="let the running work finish (preempted after the master's agent_drain_timeout_s)")
    p.set_defaults(func=disable_agent)
    p = g.add_parser("reset-enrolment", help="revoke an agent's credential so that it can enrol again")
    p.add_argument("agent_id")
    p.set_defaults(func=reset_enrolment)

    g = group(sub, "slot", "the slots (GPUs, CPUs) of the agents", aliases=("s",))
    p = g.add_parser("list", help="list slots")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_slots)


def _agents(args: Any) -> list[dict[str, Any]]:
    return authed(args).get("/api/v1/agents")["agents"]


def _slot_list(agent: dict[str, Any]) -> list[dict[str, Any]]:
    slots = agent.get("slots") or {}
    values = list(slots.values()) if isinstance(slots, dict) else list(slots)
    return sorted(values, key=lambda sl: (len(str(sl.get("id"))), str(sl.get("id"))))


def list_agents(args: Any) -> int:
    agents = _agents(args)
    if args.json:
        print_json(agents)
        return 0
    rows = []
    for a in agents:
        slots = _slot_list(a)
        busy = sum(1 for sl in slots if sl.get("container"))
        rows.append([a["id"], ", ".join(a.get("resourcePools") or []), a.get("state"), len(slots), busy,
                     a.get("enabled"), a.get("draining"), fmt_time(a.get("lastSeen")),
                     ", ".join(a.get("addresses") or []), a.get("version"), a.get("instanceId") or ""])
    table(["Agent ID", "Resource Pool", "State", "Slots", "Busy", "Enabled", "Draining", "Last Seen", "Addresses",
           "Version", "Instance"], rows)
    return 0


def enable_agent(args: Any) -> int:
    authed(args).post(f"/api/v1/agents/{_quoted(args.agent_id)}/enable")
    print(f"Enabled agent {args.agent_id}")
    return 0


def disable_agent(args: Any) -> int:
    agent = authed(args).post(f"/api/v1/agents/{_quoted(args.agent_id)}/disable",
                              {"drain": True} if args.drain else {}).get("agent") or {}
    busy = sorted({str((sl.get("container") or {}).get("id")) for sl in _slot_list(agent) if sl.get("container")})
    if not args.drain:
        extra = f"; {len(busy)} allocation(s) killed and placed again elsewhere" if busy else ""
        print(f"Disabled agent {args.agent_id}{extra}")
    elif busy:
        print(f"Draining agent {args.agent_id}: {len(busy)} allocation(s) still running ({', '.join(busy)}); "
              "they are preempted if still running after the drain timeout")
    else:
        print(f"Draining agent {args.agent_id}: nothing running on it")
    return 0


def _quoted(agent_id: str) -> str:
    return quote(agent_id, safe="")


def reset_enrolment(args: Any) -> int:
    revoked = authed(args).delete(f"/api/v1/agents/{args.agent_id}/enrolment").get("revokedCredentials", 0)
    print(f"Reset the enrolment of agent {args.agent_id} ({revoked} credential(s) revoked); "
          "it can register with an enrolment token again")
    return 0


def list_slots(args: Any) -> int:
    slots = []
    for a in _agents(args):
        for sl in _slot_list(a):
            slots.append({"agentId": a["id"], "resourcePools": a.get("resourcePools") or [], **sl})
    if args.json:
        print_json(slots)
        return 0
    rows = []
    for sl in slots:
        device = sl.get("device") or {}
        container = sl.get("container") or {}
        rows.append([sl["agentId"], ", ".join(sl["resourcePools"]), sl.get("id"),
                     str(device.get("type") or "").removeprefix("TYPE_").lower(), device.get("brand"),
                     device.get("uuid") or "", sl.get("enabled"), container.get("id") or ""])
    table(["Agent ID", "Resource Pool", "Slot ID", "Type", "Brand", "UUID", "Enabled", "Allocation"], rows)
    return 0
