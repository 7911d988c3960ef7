"""det user-group create|list|describe|add-user|remove-user|delete  (/api/v1/groups; Determined's
arguments: groups and users by name)"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.errors import CliError
from cli.output import confirm, print_json, table
from cli.session import Session, authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "user-group", "groups of users, to give roles to many at once")
    p = g.add_parser("create", help="create a group")
    p.add_argument("group_name")
    p.add_argument("--add-user", action="append", default=[], help="a member (repeatable)")
    p.set_defaults(func=create)
    p = g.add_parser("list", aliases=["ls"], help="list groups")
    p.add_argument("--groups-user-belongs-to", help="only the groups of this user")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_groups)
    p = g.add_parser("describe", help="a group and its members")
    p.add_argument("group_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe)
    for verb, key in (("add-user", "addUsers"), ("remove-user", "removeUsers")):
        p = g.add_parser(verb, help=f"{verb.split('-')[0]} users (comma-separated usernames)")
        p.add_argument("group_name")
        p.add_argument("usernames")
        p.set_defaults(func=change_members, key=key)
    p = g.add_parser("delete", help="delete a group (its roles go with it)")
    p.add_argument("group_name")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=delete)


def user_ids(s: Session, usernames: list[str]) -> list[int]:
    ids = {u["username"]: u["id"] for u in s.get("/api/v1/users")["users"]}
    missing = [n for n in usernames if n not in ids]
    if missing:
        raise CliError(f"no user named {missing[0]!r}")
    return [ids[n] for n in usernames]


def group_id(s: Session, name: str) -> int:
    found = s.post("/api/v1/groups/search", {"name": name, "limit": 1})["groups"]
    if not found:
        raise CliError(f"no user group named {name!r}")
    return int(found[0]["group"]["groupId"])


def create(args: Any) -> int:
    s = authed(args)
    g = s.post("/api/v1/groups", {"name": args.group_name, "addUsers": user_ids(s, args.add_user)})["group"]
    print(f"Created user group {g['name']} (ID {g['groupId']}) with {len(g['users'])} members")
    return 0


def list_groups(args: Any) -> int:
    s = authed(args)
    body: dict[str, Any] = {"limit": 0}
    if args.groups_user_belongs_to:
        body["userId"] = user_ids(s, [args.groups_user_belongs_to])[0]
    found = s.post("/api/v1/groups/search", body)["groups"]
    if args.json:
        print_json(found)
        return 0
    table(["ID", "Name", "# Members"], [[g["group"]["groupId"], g["group"]["name"], g["numMembers"]] for g in found])
    return 0


def describe(args: Any) -> int:
    s = authed(args)
    g = s.get(f"/api/v1/groups/{group_id(s, args.group_name)}")["group"]
    if args.json:
        print_json(g)
        return 0
    table(["ID", "Username", "Admin", "Active"], [[u["id"], u["username"], u["admin"], u["active"]] for u in g["users"]],
          title=f"user group {g['name']} (ID {g['groupId']})")
    return 0


def change_members(args: Any) -> int:
    s = authed(args)
    gid = group_id(s, args.group_name)
    names = [n.strip() for n in args.usernames.split(",") if n.strip()]
    s.request("PUT", f"/api/v1/groups/{gid}", json_body={"groupId": gid, args.key: user_ids(s, names)})
    print(f"{'Added' if args.key == 'addUsers' else 'Removed'} {', '.join(names)} "
          f"{'to' if args.key == 'addUsers' else 'from'} user group {args.group_name}")
    return 0


def delete(args: Any) -> int:
    if not confirm(f"Delete user group {args.group_name} and its role assignments?", args.yes):
        return 1
    s = authed(args)
    s.delete(f"/api/v1/groups/{group_id(s, args.group_name)}")
    print(f"Deleted user group {args.group_name}")
    return 0
