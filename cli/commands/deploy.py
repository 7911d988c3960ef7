"""det deploy local up|status|down, and det deploy aws|gcp up|down|list|describe|render (cli/deploy_cloud.py,
the Pulumi programs of infra/)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from cli.commands import group
from cli.errors import CliError
from cli.output import print_json

# cli.deploy_local, cli.deploy_cloud and infra.render are imported by the verbs that use them: ~90 ms that
# every other `det` command, `--help` included, would pay at start-up.


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "deploy", "stand up a cluster")
    lp = g.add_parser("local", help="master and agents as local processes")
    lsub = lp.add_subparsers(dest="action", metavar="ACTION")
    lp.set_defaults(group_parser=lp, func=None)
    p = lsub.add_parser("up", help="start a master and agents")
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--db", help="database URL (default: SQLite in the state directory)")
    p.add_argument("--slots", type=int, default=1, help="CPU slots per agent when there is no GPU")
    p.add_argument("--master-config", type=Path, help="a master.yaml to start the master with")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--runtime", choices=("process", "docker"), default="process",
                   help="how the agents run trials: process (default) or docker (containers; needs a Docker engine)")
    p.add_argument("--env-image", help="with --runtime docker: image of trials without environment.image "
                                       "(default pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)")
    p.set_defaults(func=up)
    for name, fn, what in (("status", status, "the master and agents this state directory started, and whether they run"),
                           ("down", down, "stop the master and every agent this state directory started")):
        p = lsub.add_parser(name, help=what)
        p.add_argument("--state-dir", type=Path)
        if name == "status":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=fn)
    for cloud in ("aws", "gcp"):
        _register_cloud(g, cloud)


def _dir(args: Any) -> Path:
    from cli.deploy_local import default_state_dir

    return args.state_dir or default_state_dir()


def up(args: Any) -> int:
    from cli import deploy_local

    if args.agents < 0:
        raise CliError("--agents must be >= 0")
    if args.env_image and args.runtime != "docker":
        raise CliError("--env-image: only applies with --runtime docker")
    data = deploy_local.up(_dir(args), agents=args.agents, port=args.port, db=args.db, slots=args.slots,
                           pool_config=args.master_config, runtime=args.runtime, image=args.env_image)
    print(f"Master:  {data['master_url']}  (log {data['master_log']})")
    for a in data["agents"]:
        print(f"Agent:   {a['id']}  pid {a['pid']}  (log {a['log']})")
    pw_file = Path(data["state_dir"]) / "admin-password"
    if data.get("new_admin_password"):
        print(f"Admin password (also in {pw_file}, mode 0600): {pw_file.read_text().strip()}")
    print(f"You are logged in as admin. Try: det -m {data['master_url']} experiment list")
    for warning in data.get("warnings", []):
        print(f"Warning: {warning}", file=sys.stderr)
    return 0


def status(args: Any) -> int:
    from cli import deploy_local

    data = deploy_local.status(_dir(args))
    if args.json:
        print_json(data)
        return 0
    if not data:
        print("No local cluster")
        return 1
    print(f"Master {data['master_url']}: {'running' if data['master_alive'] else 'NOT running'} (pid {data['master_pid']})")
    for a in data["agents"]:
        print(f"Agent {a['id']}: {'running' if a['alive'] else 'NOT running'} (pid {a['pid']})")
    return 0 if data["master_alive"] else 1


def down(args: Any) -> int:
    from cli import deploy_local

    return deploy_local.down(_dir(args))


# ---- det deploy aws|gcp -----------------------------------------------------------------------------


def _backend_flags(p: argparse.ArgumentParser, cloud: str = "") -> None:
    p.add_argument("--state-dir", type=Path, help="local Pulumi state directory (default ~/.shipyard/pulumi)")
    p.add_argument("--backend-url", help="a Pulumi state backend instead (file://, s3://, gs://)")
    if cloud == "aws":
        p.add_argument("--profile", help="the AWS credentials profile for this command's AWS calls, the CLI's "
                                         "and Pulumi's (default: AWS_PROFILE, else the default chain)")


def _cluster_flags(p: argparse.ArgumentParser, cloud: str) -> None:
    """The flags that shape the cluster (up, render); defaults live in infra.settings."""
    p.add_argument("--cluster-id", help="the cluster's name: stack name, tag value, resource name prefix")
    p.add_argument("--inbound-cidr", help="addresses allowed to reach the master's API and SSH")
    p.add_argument("--allow-open-ssh", action="store_true", help="accept an --inbound-cidr of 0.0.0.0/0")
    if cloud == "aws":
        p.add_argument("--region", help="AWS region (default us-east-1)")
        p.add_argument("--keypair", help="EC2 key pair for SSH to the master and agents")
        p.add_argument("--master-instance-type", help="default m6i.large")
        p.add_argument("--compute-agent-instance-type", help="GPU agents (default g4dn.xlarge)")
        p.add_argument("--aux-agent-instance-type", help="CPU agents (default t3.large)")
        p.add_argument("--spot-max-price", help="USD per hour (with --spot)")
        p.add_argument("--db-instance-class", help="RDS class (default db.t4g.medium)")
        p.add_argument("--default-vpc", dest="use_default_vpc", action="store_true", default=None,
                       help="use the account's default VPC instead of a new one")
        p.add_argument("--retain-log-group", action=argparse.BooleanOptionalAction, default=None,
                       help="whether down keeps the CloudWatch log group (default: kept, its events expire after "
                            "30 days)")
        p.add_argument("--vpc-id", help="an existing VPC instead of a new one (with --subnet-id)")
        p.add_argument("--subnet-id", dest="subnet_ids", action="append", metavar="SUBNET_ID",
                       help="a subnet of --vpc-id (repeat: two or more, in two availability zones; the master goes "
                            "in the first, which must route to an internet gateway)")
        p.add_argument("--agent-ami", help="AMI of the GPU agents (default: the Deep Learning base AMI)")
        p.add_argument("--master-ami", help="AMI of the master (default: Ubuntu 24.04)")
    else:
        p.add_argument("--project", help="GCP project id")
        p.add_argument("--zone", help="GCP zone (default us-central1-a)")
        p.add_argument("--master-instance-type", help="default e2-standard-2")
        p.add_argument("--compute-agent-instance-type", help="GPU agents (default n1-standard-8)")
        p.add_argument("--aux-agent-instance-type", help="CPU agents (default e2-standard-4)")
        p.add_argument("--gpu-type", help="default nvidia-tesla-t4")
        p.add_argument("--gpu-num", type=int, help="GPUs per compute agent (default 1)")
        p.add_argument("--db-tier", help="Cloud SQL tier (default db-custom-1-3840)")
        p.add_argument("--network", help="an existing VPC network instead of a new one (with --subnetwork)")
        p.add_argument("--subnetwork", help="an existing subnetwork of --network in the zone's region")
        p.add_argument("--keypath", help="an SSH public key file (.pub) for user shipyard on the master and the "
                                         "agents (ssh-keys metadata; turns the master's OS Login off)")
        p.add_argument("--min-cpu-platform-master", help="least CPU platform of the master (e.g. 'Intel Ice Lake')")
        p.add_argument("--min-cpu-platform-agent", help="least CPU platform of the agents (e.g. 'AMD Milan')")
    p.add_argument("--max-dynamic-agents", type=int, help="GPU agents at most (default 5)")
    p.add_argument("--min-dynamic-agents", type=int, help="GPU agents kept running (default 0)")
    p.add_argument("--max-aux-agents", type=int, help="CPU agents at most (default 2)")
    p.add_argument("--max-idle-agent-period", help="idle agents are terminated after this (default 10m)")
    p.add_argument("--max-agent-starting-period",
                   help="an instance whose agent has not connected this long after launch is replaced (default 20m)")
    p.add_argument("--scheduler-type", help="both pools' scheduler: priority (default) or fair_share")
    p.add_argument("--preemption-enabled", action=argparse.BooleanOptionalAction, default=None,
                   help="whether higher-priority work preempts running trials (default: on)")
    p.add_argument("--spot", action="store_true", default=None, help="GPU agents on spot capacity")
    p.add_argument("--db-storage-gb", type=int, help="database storage (default 20)")
    p.add_argument("--shipyard-package",
                   help="a pip requirement the master installs instead of the wheel det deploy ships (your own index)")
    p.add_argument("--add-tag", action="append", metavar="KEY=VALUE", help="a tag on every resource (repeatable)")
    p.add_argument("--container-runtime", choices=("docker", "process"),
                   help="how the agents run trials: docker (default: the agents' boot installs Docker and, on GPU "
                        "instances, NVIDIA's container toolkit) or process (the host's own Python)")
    p.add_argument("--cpu-env-image", help="image of trials on CPU agents without environment.image "
                                           "(default pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)")
    p.add_argument("--gpu-env-image", help="image of trials on GPU agents without environment.image "
                                           "(default pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)")
    p.add_argument("--master-tls-cert", dest="master_tls_cert_path", metavar="PATH",
                   help="PEM certificate (with its chain) the master serves HTTPS with; needs --master-tls-key "
                        "and --master-cert-name")
    p.add_argument("--master-tls-key", dest="master_tls_key_path", metavar="PATH",
                   help="its unencrypted PEM key (kept in the secret store, never in user-data)")
    p.add_argument("--master-cert-name", help="a DNS name the certificate is valid for: the agents reach the "
                                              "master's private address by it")
    p.add_argument("--master-config-template", dest="master_config_template_path", metavar="PATH",
                   help="a YAML file of master.yaml settings merged over the rendered config (pools by name); "
                        "what det deploy owns or a flag sets is refused, the result is checked by the master's "
                        "own config model")
    fs = "efs" if cloud == "aws" else "filestore"
    p.add_argument("--shared-fs", metavar=f"{fs}|none",
                   help=f"checkpoints on a shared file system ({'EFS' if cloud == 'aws' else 'Filestore, 1 TiB'}) "
                        "mounted on the master and the agents, instead of the bucket (default none); down keeps "
                        "it unless --delete-data")


def _register_cloud(g: argparse._SubParsersAction, cloud: str) -> None:
    cp = g.add_parser(cloud, help=f"a production cluster on {cloud.upper()} (Pulumi)")
    csub = cp.add_subparsers(dest="action", metavar="ACTION")
    cp.set_defaults(group_parser=cp, func=None, cloud=cloud)
    p = csub.add_parser("up", help="create or update the cluster")
    _cluster_flags(p, cloud)
    p.add_argument("--db-password", help="database password (or SHIPYARD_DB_PASSWORD; default: generated)")
    p.add_argument("--admin-password", help="the master's admin password (or SHIPYARD_ADMIN_PASSWORD; default: generated)")
    p.add_argument("--dry-run", action="store_true", help="preview the changes, create nothing")
    p.add_argument("--wait-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long to wait for the master to answer (default 900; 0: do not wait)")
    _backend_flags(p, cloud)
    p.set_defaults(func=cloud_up)
    p = csub.add_parser("upgrade", help="ship this Shipyard's wheel to the cluster and restart its master")
    p.add_argument("--cluster-id")
    p.add_argument("--wait-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long to wait for the master to answer again (default 900; 0: do not wait)")
    _backend_flags(p, cloud)
    p.set_defaults(func=cloud_upgrade)
    p = csub.add_parser("down", help="terminate the agents, then destroy the cluster (its bucket and a final "
                                     "database snapshot are kept unless --delete-data)")
    p.add_argument("--cluster-id")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--delete-data", action="store_true",
                   help="delete the checkpoint bucket (and --shared-fs file system) and the database's final "
                        "snapshot too")
    _backend_flags(p, cloud)
    p.set_defaults(func=cloud_down)
    p = csub.add_parser("list", help="the clusters in the state backend")
    _backend_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cloud_list)
    p = csub.add_parser("describe", help="master URL, cost at rest, pools and instances")
    p.add_argument("--cluster-id")
    _backend_flags(p, cloud)
    p.set_defaults(func=cloud_describe)
    p = csub.add_parser("render", help="write master.yaml and the user-data the cluster would boot")
    _cluster_flags(p, cloud)
    p.add_argument("--out", type=Path, required=True, help="directory to write into")
    p.set_defaults(func=cloud_render)


def _wait_timeout(args: Any) -> float:
    from cli import deploy_cloud as dc

    value = dc.MASTER_WAIT_S if args.wait_timeout is None else args.wait_timeout
    if value < 0:
        raise CliError("--wait-timeout: must be 0 or more seconds")
    return float(value)


def _admin_password_hint(cloud: str, outputs: dict[str, Any]) -> str:
    secret = outputs.get("secret")
    if cloud == "aws":
        return (f"aws secretsmanager get-secret-value --region {outputs.get('region')} --secret-id {secret} "
                "--query SecretString --output text  (key admin_password)")
    return f"gcloud secrets versions access latest --secret {secret}  (key admin_password)"


def cloud_up(args: Any) -> int:
    from cli import deploy_cloud as dc

    s = dc.settings_from_args(args.cloud, args)
    dc.check_master_config(s)
    tls_key = dc.tls_key_from_args(args)
    db_password, admin_password = dc.passwords_from_args(args)
    backend = dc.Backend.from_args(args)
    wait_s = _wait_timeout(args)
    dc.use_aws_profile(args)
    dc.require_pulumi()
    if isinstance(s, dc.AwsSettings):
        dc.check_aws_network(s)
    with tempfile.TemporaryDirectory(prefix="shipyard-release-") as tmp:
        release_dir = None
        if not s.shipyard_package and not args.dry_run:
            release_dir = Path(tmp)
            dc.build_release(release_dir)  # before any cloud call: a CLI that cannot ship stops here
        outputs = dc.up(args.cloud, s, backend, db_password=db_password, admin_password=admin_password,
                        dry_run=args.dry_run, release_dir=release_dir, tls_key=tls_key)
    if args.dry_run:
        print("Preview only: nothing was created.")
        return 0
    url = str(outputs.get("master_url"))
    if wait_s:
        info = dc.wait_for_master(url, timeout_s=wait_s)
        print(f"The master answers: shipyard {info.get('shipyardVersion', '?')}")
    print(f"Master:  {url}")
    print(f"Admin password: {_admin_password_hint(args.cloud, outputs)}")
    print(f"Try: det -m {url} user login admin")
    return 0


def cloud_upgrade(args: Any) -> int:
    from cli import deploy_cloud as dc

    cluster_id = dc.cluster_id_from_args(args)
    backend = dc.Backend.from_args(args)
    wait_s = _wait_timeout(args)
    dc.use_aws_profile(args)
    outputs = dc.stack_outputs(args.cloud, cluster_id, backend)
    version = dc.upgrade(args.cloud, outputs)
    url = str(outputs.get("master_url"))
    if wait_s:
        dc.wait_for_master(url, timeout_s=wait_s)
    print(f"Cluster {cluster_id}: the master installs shipyard {version} at this start ({url}).")
    return 0


def cloud_down(args: Any) -> int:
    from cli import deploy_cloud as dc

    cluster_id = dc.cluster_id_from_args(args)
    backend = dc.Backend.from_args(args)
    dc.use_aws_profile(args)
    if not args.yes and not dc.confirm_down(cluster_id, delete_data=args.delete_data):
        raise CliError(f"not confirmed: nothing was changed (type {cluster_id} when asked, or pass --yes)")
    dc.require_pulumi()
    dc.down(args.cloud, cluster_id, backend, delete_data=args.delete_data)
    print(f"Cluster {cluster_id} is gone.")
    return 0


def cloud_list(args: Any) -> int:
    from cli import deploy_cloud as dc

    stacks = dc.list_stacks(args.cloud, dc.Backend.from_args(args))
    if args.json:
        print_json([{k: v for k, v in st.items() if k != "outputs"} for st in stacks])
        return 0
    if not stacks:
        print(f"No {args.cloud} cluster in this state backend")
        return 0
    for st in stacks:
        print(f"{st['name']}  {st['master_url'] or '-'}  {st['resources']} resources")
    return 0


def cloud_describe(args: Any) -> int:
    from cli import deploy_cloud as dc

    cluster_id = dc.cluster_id_from_args(args)
    dc.use_aws_profile(args)
    outputs = dc.stack_outputs(args.cloud, cluster_id, dc.Backend.from_args(args))
    for line in dc.describe(args.cloud, outputs):
        print(line)
    return 0


def cloud_render(args: Any) -> int:
    from cli import deploy_cloud as dc
    from infra.render import render, write_rendered

    s = dc.settings_from_args(args.cloud, args)
    dc.check_master_config(s)
    for path in write_rendered(render(s), args.out):
        print(path)
    cost = s.cost_at_rest()
    print(f"At rest: ${sum(c.usd_per_hour for c in cost):.3f}/hour (" +
          ", ".join(f"{c.what} ${c.usd_per_hour:.3f}" for c in cost) + ")")
    return 0
