"""det experiment create|list|describe|activate|pause|cancel|kill|archive|unarchive|label|delete|gc|
download-model-def|logs"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from cli.commands import group
from cli.errors import CliError
from cli.formatting import fmt_metric, fmt_size, fmt_time, short_state
from cli.logs import print_logs
from cli.output import confirm, kv, print_json, table, trials_table
from cli.session import authed

# The master's default `model_def_max_bytes`; checked here so a too-big directory fails before upload.
MAX_MODEL_DEF_BYTES = 96 * 1024 * 1024
TYPE_FILE = 48  # ord("0"): tar regular file, as Determined's v1File sends it
TYPE_DIR = 53  # ord("5"): tar directory
# Never worth shipping; Determined's default .detignore leaves out the same.
ALWAYS_SKIPPED = ("__pycache__/", ".git/", "*.pyc", "*.pyo", "*$py.class")
FOLLOW_POLL_S = 1.0
TERMINAL_STATES = ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR", "STATE_DELETED")


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "experiment", "create and manage experiments", aliases=("e",))
    p = g.add_parser("create", help="create an experiment from a config file and a model directory")
    p.add_argument("config_file", help="experiment config (YAML)")
    p.add_argument("model_dir", help="directory with the training code (honours .detignore)")
    p.add_argument("--validate-only", action="store_true", help="only validate the config and files")
    p.add_argument("--paused", action="store_true", help="create the experiment paused")
    p.add_argument("--project_id", "--project-id", type=int, dest="project_id", default=None,
                   help="create it in this project (default: Uncategorized)")
    p.add_argument("--template", help="a config template to merge under the config")
    p.add_argument("-f", "--follow", action="store_true",
                   help="stream the first trial's logs until the experiment ends; exit 1 unless it completed")
    p.set_defaults(func=create)

    p = g.add_parser("list", help="list your experiments (not archived)")
    p.add_argument("--all", "-a", action="store_true", help="every user's experiments, archived ones too")
    p.add_argument("--archived", action="store_true", help="only archived experiments")
    p.add_argument("--limit", type=int, default=None, help="only the N most recent")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_experiments)

    p = g.add_parser("describe", help="an experiment and its trials")
    p.add_argument("experiment_id", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe)

    for verb, past in (("activate", "Activated"), ("pause", "Paused"), ("cancel", "Canceled"),
                       ("kill", "Killed"), ("archive", "Archived"), ("unarchive", "Unarchived")):
        p = g.add_parser(verb, help=f"{verb} an experiment")
        p.add_argument("experiment_id", type=int)
        p.set_defaults(func=state_action, action=verb, past=past)

    lp = g.add_parser("label", help="add or remove an experiment label")
    lp.set_defaults(group_parser=lp, func=None)
    lsub = lp.add_subparsers(dest="label_verb", metavar="ACTION")
    for verb in ("add", "remove"):
        p = lsub.add_parser(verb, help=f"{verb} a label")
        p.add_argument("experiment_id", type=int)
        p.add_argument("label")
        p.set_defaults(func=label, label_action=verb)

    p = g.add_parser("delete", help="delete a finished experiment, its trials, metrics and logs")
    p.add_argument("experiment_id", type=int)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=delete)

    p = g.add_parser("move", help="move an experiment to another project")
    p.add_argument("experiment_id", type=int)
    p.add_argument("workspace_name")
    p.add_argument("project_name")
    p.set_defaults(func=move)

    p = g.add_parser("gc", help="run checkpoint GC now (the config's checkpoint_storage save_* policy)")
    p.add_argument("experiment_id", type=int)
    p.set_defaults(func=gc)

    p = g.add_parser("download-model-def", help="download the experiment's model definition (.tgz)")
    p.add_argument("experiment_id", type=int)
    p.add_argument("--output-dir", "-o", type=Path, default=Path("."))
    p.set_defaults(func=download_model_def)

    p = g.add_parser("logs", help="logs of the experiment's first trial")
    p.add_argument("experiment_id", type=int)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--tail", type=int, default=None, metavar="N")
    p.set_defaults(func=logs)


# -- model directory → Determined v1File list ------------------------------------------------------
# NamedTuple and a plain class, not dataclasses: importing dataclasses (it imports inspect) would add
# ~8 ms to every `det` start-up, `det --help` included.
class _Rule(NamedTuple):
    glob: str
    negated: bool
    dir_only: bool
    anchored: bool


class Ignore:
    """gitignore-ish globs: `#` comments, `!` negation, a trailing `/` matches directories only, a
    pattern with a `/` is relative to the model directory, others match a name at any depth; the
    last matching rule wins. An ignored directory is not walked."""

    def __init__(self, rules: list[_Rule] | None = None) -> None:
        self.rules = rules or []

    @classmethod
    def parse(cls, lines: list[str]) -> Ignore:
        rules = []
        for raw in lines:
            line = raw.rstrip("\n").rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            if line.startswith("**/"):
                line, anchored = line[3:], "/" in line[3:]
            if line:
                rules.append(_Rule(line, negated, dir_only, anchored))
        return cls(rules)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        result = False
        name = rel.rsplit("/", 1)[-1]
        for r in self.rules:
            if r.dir_only and not is_dir:
                continue
            if fnmatch.fnmatchcase(rel if r.anchored else name, r.glob):
                result = not r.negated
        return result


def _entry(rel: str, kind: int, content: bytes, st: os.stat_result) -> dict[str, Any]:
    return {
        "path": rel,
        "type": kind,
        "content": base64.b64encode(content).decode("ascii"),
        "mode": st.st_mode,
        "mtime": str(int(st.st_mtime)),
        "uid": 0,
        "gid": 0,
    }


def pack_model_dir(model_dir: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The directory as Determined's v1File list: paths relative to it, directories before their
    contents. Links inside the directory are followed (the master stores only files and
    directories); a link that leads outside it, or a total over `limit` bytes, is refused here."""
    limit = MAX_MODEL_DEF_BYTES if limit is None else limit
    if not model_dir.exists():
        raise CliError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise CliError(f"{model_dir} is not a directory")
    root = model_dir.resolve()
    rules = list(ALWAYS_SKIPPED)
    try:
        rules += (root / ".detignore").read_text(errors="replace").splitlines()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CliError(f"cannot read {model_dir / '.detignore'}: {e.strerror}") from None
    ignore = Ignore.parse(rules)
    files: list[dict[str, Any]] = []
    total = 0

    def walk(real_dir: Path, rel_dir: str, ancestors: frozenset[Path]) -> None:
        nonlocal total
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as e:
            raise CliError(f"cannot read {model_dir / rel_dir}: {e.strerror}") from None
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.name == ".detignore":
                continue
            target = Path(e.path)
            if e.is_symlink():
                try:
                    target = target.resolve(strict=True)
                except (OSError, RuntimeError):
                    raise CliError(f"{model_dir / rel} is a broken symbolic link") from None
                if not target.is_relative_to(root):
                    raise CliError(f"{model_dir / rel} is a symbolic link to {target}, outside {model_dir}; "
                                   "copy it in or list it in .detignore")
            try:
                st = target.stat()
            except OSError as err:
                raise CliError(f"cannot read {model_dir / rel}: {err.strerror}") from None
            is_dir = stat.S_ISDIR(st.st_mode)
            if ignore.ignored(rel, is_dir):
                continue
            if is_dir:
                if target in ancestors:
                    raise CliError(f"{model_dir / rel} is a symbolic link to one of its parent directories")
                files.append(_entry(rel, TYPE_DIR, b"", st))
                walk(target, rel, ancestors | {target})
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > limit:
                    raise CliError(f"model directory {model_dir} holds more than {fmt_size(limit)} (the limit); "
                                   "leave data, checkpoints and virtualenvs out with a .detignore file")
                try:
                    content = target.read_bytes()
                except OSError as err:
                    raise CliError(f"cannot read {model_dir / rel}: {err.strerror}") from None
                files.append(_entry(rel, TYPE_FILE, content, st))
            else:
                print(f"det: warning: skipping {model_dir / rel}: not a regular file or directory", file=sys.stderr)

    walk(root, "", frozenset({root}))
    return files


def _read_config(path: str) -> str:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise CliError(f"config file {path} not found") from None
    except IsADirectoryError:
        raise CliError(f"config file {path} is a directory") from None
    except OSError as e:
        raise CliError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"config file {path} is not UTF-8 text") from None


# -- create ----------------------------------------------------------------------------------------
def create(args: Any) -> int:
    config = _read_config(args.config_file)
    files = pack_model_dir(Path(args.model_dir))
    s = authed(args)
    body = {"config": config, "modelDefinition": files, "validateOnly": bool(args.validate_only),
            "activate": not args.paused}
    if args.project_id is not None:
        body["projectId"] = args.project_id
    if args.template:
        body["template"] = args.template
    resp = s.post("/api/v1/experiments", body)
    warnings = resp.get("configWarnings") or []
    if args.validate_only:
        print("Experiment configuration validation succeeded")
        for w in warnings:
            print(f"Warning: {w}")
        return 0
    exp_id = resp["experiment"]["id"]
    print(f"Created experiment {exp_id}")
    for w in warnings:
        print(f"Warning: {w}")
    if args.follow and not args.paused:
        return follow_experiment(s, exp_id)
    return 0


def move(args: Any) -> int:
    from cli.commands.workspace import project_by_name

    s = authed(args)
    project = project_by_name(s, args.workspace_name, args.project_name)
    s.post(f"/api/v1/experiments/{args.experiment_id}/move",
           {"destinationProjectId": project["id"], "experimentId": args.experiment_id})
    print(f"Moved experiment {args.experiment_id} to project {args.project_name} of workspace {args.workspace_name}")
    return 0


def _first_trial(s: Any, exp_id: int) -> tuple[int | None, str]:
    """Wait until the experiment has a trial (→ its id) or has ended without one (→ None)."""
    while True:
        trials = s.get(f"/api/v1/experiments/{exp_id}/trials")["trials"]
        if trials:
            return min(t["id"] for t in trials), ""
        state = s.get(f"/api/v1/experiments/{exp_id}")["experiment"]["state"]
        if state in TERMINAL_STATES:
            return None, state
        time.sleep(FOLLOW_POLL_S)


def follow_experiment(s: Any, exp_id: int) -> int:
    print("Waiting for the first trial to begin...")
    trial_id, state = _first_trial(s, exp_id)
    if trial_id is not None:
        print(f"Following the logs of trial {trial_id}")
        print_logs(s, trial_id, follow=True)
        print(f"Trial log stream ended. To reopen it: det trial logs -f {trial_id}", file=sys.stderr)
        while True:
            state = s.get(f"/api/v1/experiments/{exp_id}")["experiment"]["state"]
            if state in TERMINAL_STATES:
                break
            time.sleep(FOLLOW_POLL_S)
    if state != "STATE_COMPLETED":
        raise CliError(f"experiment {exp_id} ended {state.removeprefix('STATE_')}")
    print(f"Experiment {exp_id} completed")
    return 0


# -- read ------------------------------------------------------------------------------------------
def list_experiments(args: Any) -> int:
    s = authed(args)
    params: dict[str, Any] = {"limit": -1}
    if args.archived:
        params["archived"] = "true"
    elif not args.all:
        params["archived"] = "false"
    if not args.all:
        params["users"] = [s.get("/api/v1/me")["user"]["username"]]
    if args.limit is not None:
        if args.limit < 1:
            raise CliError("--limit must be at least 1")
        params.update(limit=args.limit, orderBy="ORDER_BY_DESC")
    exps = s.get("/api/v1/experiments", params=params)["experiments"]
    exps.sort(key=lambda e: e["id"])
    if args.json:
        print_json(exps)
        return 0
    headers = ["ID", "Owner", "Name", "State", "Progress", "Started", "Ended", "Resource Pool", "Labels"]
    rows = [[e["id"], e.get("username"), e.get("name"), short_state(e.get("state")),
             f"{100 * float(e.get('progress') or 0):.0f}%", fmt_time(e.get("startTime")), fmt_time(e.get("endTime")),
             e.get("resourcePool"), ", ".join(e.get("labels") or [])] for e in exps]
    if args.all or args.archived:
        headers.append("Archived")
        for r, e in zip(rows, exps, strict=True):
            r.append(e.get("archived"))
    table(headers, rows)
    return 0


def describe(args: Any) -> int:
    s = authed(args)
    resp = s.get(f"/api/v1/experiments/{args.experiment_id}")
    trials = s.get(f"/api/v1/experiments/{args.experiment_id}/trials")["trials"]
    if args.json:
        print_json({**resp, "trials": trials})
        return 0
    e = resp["experiment"]
    job = resp.get("jobSummary") or {}
    best = ""
    if e.get("bestTrialId") is not None:
        best = f"trial {e['bestTrialId']} ({e.get('searcherMetric')} = {fmt_metric(e.get('bestTrialSearcherMetric'))})"
    pairs: list[tuple[str, Any]] = [
        ("ID", e["id"]),
        ("Name", e.get("name")),
        ("State", short_state(e.get("state")) + (" (archived)" if e.get("archived") else "")),
        ("Owner", e.get("username")),
        ("Progress", f"{100 * float(e.get('progress') or 0):.0f}%"),
        ("Searcher", f"{e.get('searcherType')} on {e.get('searcherMetric')}"),
        ("Resource pool", e.get("resourcePool")),
        ("Labels", ", ".join(e.get("labels") or [])),
        ("Description", e.get("description")),
        ("Started", fmt_time(e.get("startTime"))),
        ("Ended", fmt_time(e.get("endTime"))),
        ("Trials", e.get("numTrials")),
        ("Best trial", best),
        ("Checkpoints", f"{e.get('checkpointCount') or 0} ({fmt_size(e.get('checkpointSize') or 0)})"),
        ("Model definition", fmt_size(e.get("modelDefinitionSize") or 0)),
    ]
    if job:
        pairs.append(("Job", f"{short_state(job.get('state'))}, {job.get('allocatedSlots', 0)}/"
                             f"{job.get('requestedSlots', 0)} slots, {job.get('jobsAhead', 0)} jobs ahead"))
    if e.get("forkedFrom") is not None:
        pairs.append(("Forked from", e["forkedFrom"]))
    if e.get("pendingReason"):
        pairs.append(("Cannot be placed", e["pendingReason"]))
    for w in e.get("configWarnings") or []:
        pairs.append(("Warning", w))
    kv(pairs)
    print()
    trials_table(trials, title="Trials")
    return 0


# -- changes ---------------------------------------------------------------------------------------
def state_action(args: Any) -> int:
    authed(args).post(f"/api/v1/experiments/{args.experiment_id}/{args.action}")
    print(f"{args.past} experiment {args.experiment_id}")
    return 0


def label(args: Any) -> int:
    s = authed(args)
    labels = list(s.get(f"/api/v1/experiments/{args.experiment_id}")["experiment"].get("labels") or [])
    if args.label_action == "add":
        if args.label not in labels:
            s.patch(f"/api/v1/experiments/{args.experiment_id}", {"labels": [*labels, args.label]})
        print(f"Added label '{args.label}' to experiment {args.experiment_id}")
    else:
        if args.label in labels:
            s.patch(f"/api/v1/experiments/{args.experiment_id}", {"labels": [x for x in labels if x != args.label]})
        print(f"Removed label '{args.label}' from experiment {args.experiment_id}")
    return 0


def delete(args: Any) -> int:
    s = authed(args)
    question = (f"Delete experiment {args.experiment_id} with its trials, metrics, logs and checkpoints? "
                "This cannot be undone (see `det experiment archive`).")
    if not confirm(question, args.yes):
        print("Aborted")
        return 1
    s.delete(f"/api/v1/experiments/{args.experiment_id}")
    print(f"Deleted experiment {args.experiment_id}")
    return 0


def gc(args: Any) -> int:
    doomed = authed(args).post(f"/api/v1/experiments/{args.experiment_id}/gc").get("deleting") or []
    if doomed:
        print(f"Deleting {len(doomed)} checkpoint(s) of experiment {args.experiment_id}: {', '.join(map(str, doomed))}")
    else:
        print(f"No checkpoints of experiment {args.experiment_id} to delete")
    return 0


def download_model_def(args: Any) -> int:
    data = authed(args).get(f"/api/v1/experiments/{args.experiment_id}/model_def")
    out = args.output_dir / f"experiment_{args.experiment_id}_model_def.tgz"
    try:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data["b64Tgz"]))
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror}") from None
    print(f"Saved the model definition of experiment {args.experiment_id} to {out}")
    return 0


def logs(args: Any) -> int:
    s = authed(args)
    trials = s.get(f"/api/v1/experiments/{args.experiment_id}/trials")["trials"]
    if not trials:
        raise CliError(f"experiment {args.experiment_id} has no trials yet")
    print_logs(s, min(t["id"] for t in trials), follow=args.follow, tail=args.tail)
    return 0
