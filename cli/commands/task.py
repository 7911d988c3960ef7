"""det command|cmd run|list|kill|logs, det notebook start|list|kill|logs|open,
det tensorboard start|list|kill|logs|open, det task list|logs:
tasks other than trials (api/ntsc.py), in Determined's wire format."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from cli.commands import group
from cli.commands.experiment import pack_model_dir
from cli.errors import CliError
from cli.formatting import fmt_time
from cli.logs import print_stream
from cli.output import print_json, table
from cli.session import authed

_PATHS = {"command": "commands", "notebook": "notebooks", "tensorboard": "tensorboards", "shell": "shells"}
# How long `det cmd run` waits for the command's exit to be recorded after its log stream ended.
EXIT_WAIT_S = 30.0


def _common(g: argparse._SubParsersAction, kind: str) -> None:
    p = g.add_parser("list", aliases=["ls"], help=f"your {kind}s (--all: everyone's)")
    p.add_argument("-a", "--all", action="store_true", help=f"every user's {kind}s")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_tasks, kind=kind)
    p = g.add_parser("kill", help=f"stop {kind}s")
    p.add_argument("task_ids", nargs="+", metavar="ID")
    p.set_defaults(func=kill, kind=kind)
    p = g.add_parser("logs", help=f"a {kind}'s logs")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    p.add_argument("--tail", type=int, default=None, metavar="N")
    p.set_defaults(func=logs)


def _open(g: argparse._SubParsersAction, kind: str, server: str) -> None:
    p = g.add_parser("open", help=f"print a running {server}'s URL (/proxy/ID/ on the master) and open it in a browser")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("--no-browser", action="store_true", help="only print the URL")
    p.set_defaults(func=open_task, kind=kind)


def _launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", help="task config (.yaml)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a config value in dot notation, e.g. resources.slots=0 (repeatable)")
    p.add_argument("-c", "--context", help="a directory whose contents are copied into the task's directory")
    p.add_argument("-d", "--detach", action="store_true", help="print the id and return")


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "command", "run commands on the cluster", aliases=("cmd",))
    p = g.add_parser("run", help="run a command; its logs are followed and det exits with its status")
    _launch_args(p)
    p.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=run)
    _common(g, "command")

    g = group(sub, "notebook", "JupyterLab notebooks, proxied by the master")
    p = g.add_parser("start", help="start JupyterLab; prints its URL once it is ready")
    _launch_args(p)
    p.set_defaults(func=start_notebook)
    _open(g, "notebook", "JupyterLab")
    _common(g, "notebook")

    g = group(sub, "tensorboard", "TensorBoard over experiments' and trials' metrics, proxied by the master")
    p = g.add_parser("start", help="start TensorBoard; prints its URL once it is ready")
    p.add_argument("experiment_ids", type=int, nargs="*", metavar="EXPERIMENT_ID",
                   help="every trial of these experiments")
    p.add_argument("-t", "--trial-ids", type=int, nargs="+", default=[], metavar="TRIAL_ID", help="these trials")
    _launch_args(p)
    p.set_defaults(func=start_tensorboard)
    _open(g, "tensorboard", "TensorBoard")
    _common(g, "tensorboard")

    g = group(sub, "task", "every task (trials, commands, notebooks)")
    p = g.add_parser("list", aliases=["ls"], help="live tasks and their allocations")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_all)
    p = g.add_parser("logs", help="a task's logs")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--tail", type=int, default=None, metavar="N")
    p.set_defaults(func=logs)


def _config(args: Any) -> dict[str, Any]:
    """The config file, then each --config KEY=VALUE (values read as YAML: 0 is a number)."""
    import yaml  # only where a config is read, as cli.main asks of heavy imports

    config: dict[str, Any] = {}
    if args.config_file:
        try:
            loaded = yaml.safe_load(Path(args.config_file).read_text())
        except OSError as e:
            raise CliError(f"cannot read config file {args.config_file}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise CliError(f"config file {args.config_file} is not YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise CliError(f"config file {args.config_file} must hold a mapping")
        config = loaded
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--config {item!r}: expected KEY=VALUE, e.g. resources.slots=0")
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CliError(f"--config {item!r}: {part} is not a mapping")
        node[leaf] = yaml.safe_load(value) if value else ""
    return config


def _launch(args: Any, kind: str, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    files = pack_model_dir(Path(args.context)) if args.context else []
    s = authed(args)
    resp = s.post(f"/api/v1/{_PATHS[kind]}", {"config": config, "files": files})
    return s, resp[kind]


def run(args: Any) -> int:
    entry = list(args.entrypoint)
    if entry and entry[0] == "--":
        entry = entry[1:]
    config = _config(args)
    if entry:
        config["entrypoint"] = entry
    if not config.get("entrypoint"):
        raise CliError("no command given: det cmd run [OPTIONS] -- COMMAND [ARGS...]")
    s, cmd = _launch(args, "command", config)
    if args.detach:
        print(cmd["id"])
        return 0
    print(f"Launched command {cmd['id']} ({cmd['description']})", flush=True)
    print_stream(s, f"/api/v1/tasks/{cmd['id']}/logs", follow=True)
    return _exit_code(s, cmd["id"])


def _exit_code(s: Any, task_id: str) -> int:
    """The command's exit status once recorded: its code, or 1 if it ended without one (killed)."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        cmd = s.get(f"/api/v1/commands/{task_id}")["command"]
        if cmd["state"] == "STATE_TERMINATED":
            code = cmd.get("exitCode")
            if code is None or code != 0:
                print(f"Command {task_id} ended: {cmd.get('exitStatus')}", flush=True)
            return int(code) if code is not None and 0 <= code < 256 else 1
        if time.monotonic() > deadline:
            raise CliError(f"command {task_id}: its log stream ended but it is still {cmd['state']}")
        time.sleep(0.5)


def _wait_ready(s: Any, kind: str, task_id: str) -> None:
    while True:
        task = s.get(f"/api/v1/tasks/{task_id}")["task"]
        if task.get("endTime"):
            raise CliError(f"{kind} {task_id} ended before it was ready (det {kind} logs {task_id})")
        if task["allocations"] and task["allocations"][0].get("isReady"):
            return
        time.sleep(0.5)


def start_notebook(args: Any) -> int:
    s, nb = _launch(args, "notebook", _config(args))
    if args.detach:
        print(nb["id"])
        return 0
    print(f"Launched notebook {nb['id']} ({nb['description']}); waiting for JupyterLab", flush=True)
    _wait_ready(s, "notebook", nb["id"])
    print(f"JupyterLab is running at: {s.master}{nb['serviceAddress']}")
    return 0


def start_tensorboard(args: Any) -> int:
    if not args.experiment_ids and not args.trial_ids:
        raise CliError("name experiments or trials: det tensorboard start EXPERIMENT_ID... | --trial-ids TRIAL_ID...")
    files = pack_model_dir(Path(args.context)) if args.context else []
    s = authed(args)
    tb = s.post("/api/v1/tensorboards", {"config": _config(args), "files": files,
                                         "experimentIds": args.experiment_ids, "trialIds": args.trial_ids})["tensorboard"]
    if args.detach:
        print(tb["id"])
        return 0
    print(f"Launched tensorboard {tb['id']} ({tb['description']}) for {len(tb['trialIds'])} trial(s); "
          "waiting for TensorBoard", flush=True)
    _wait_ready(s, "tensorboard", tb["id"])
    print(f"TensorBoard is running at: {s.master}{tb['serviceAddress']}")
    return 0


def open_task(args: Any) -> int:
    """A notebook's or TensorBoard's proxy URL, printed, then opened in a browser where there is one
    (the owner's or an admin's: anyone else's request is a 404, as for a task that does not exist)."""
    s = authed(args)
    task = s.get(f"/api/v1/{_PATHS[args.kind]}/{args.task_id}")[args.kind]
    if task["state"] != "STATE_RUNNING" or not task.get("isReady"):
        raise CliError(f"{args.kind} {args.task_id} is not serving ({task['state'].removeprefix('STATE_')})")
    url = f"{s.master}{task['serviceAddress']}"
    print(url, flush=True)
    if not args.no_browser:
        import webbrowser

        if not webbrowser.open(url):
            print("no browser found here: open the URL above in yours (signed in to the master)")
    return 0


def list_tasks(args: Any) -> int:
    plural = _PATHS[args.kind]
    s = authed(args)
    users = [] if args.all else [s.get("/api/v1/me")["user"]["username"]]
    items = s.get(f"/api/v1/{plural}", params={"users": users})[plural]
    if args.json:
        print_json(items)
        return 0
    table(["ID", "User", "Description", "State", "Exit status", "Pool", "Started"],
          [[t["id"], t["username"], t["description"], t["state"].removeprefix("STATE_"), t.get("exitStatus") or "",
            t["resourcePool"], fmt_time(t["startTime"])] for t in items])
    return 0


def kill(args: Any) -> int:
    s = authed(args)
    for task_id in args.task_ids:
        s.post(f"/api/v1/{_PATHS[args.kind]}/{task_id}/kill")
        print(f"Killed {args.kind} {task_id}")
    return 0


def logs(args: Any) -> int:
    print_stream(authed(args), f"/api/v1/tasks/{args.task_id}/logs", follow=args.follow, tail=args.tail)
    return 0


def list_all(args: Any) -> int:
    summary = authed(args).get("/api/v1/tasks")["allocationIdToSummary"]
    if args.json:
        print_json(summary)
        return 0
    table(["Task ID", "Allocation ID", "Name", "Slots", "State", "Agent", "Pool", "Registered"],
          [[a["taskId"], a["allocationId"], a.get("name") or "", a["slotsNeeded"], a["state"], a.get("agentId") or "",
            a["resourcePool"], fmt_time(a.get("registeredTime"))] for a in summary.values()])
    return 0
