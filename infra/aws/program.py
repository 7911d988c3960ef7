"""A Shipyard cluster on AWS, as Pulumi resources.

- network: a VPC with one public subnet in each of two availability zones (or an existing VPC and
  its subnets, `--vpc-id`/`--subnet-id`, or the account's default VPC with `use_default_vpc`);
- security groups: the master's port from the inbound CIDR and from the agents, SSH from the inbound
  CIDR, the database's port from the master only;
- PostgreSQL on RDS (encrypted, automated backups, not publicly accessible);
- a private, encrypted S3 bucket for checkpoints (public access blocked, TLS only);
- IAM: the master may run instances only when they carry this cluster's tag, and describe them; may
  tag only at launch; may stop, modify and terminate only instances carrying the tag; may pass only
  the agent role; may read only its own secret. Agents may use only the checkpoint bucket.
  (EC2's Describe* calls cannot be restricted to resources: AWS evaluates them account-wide.)
- the master: an instance with its own network interface (its private IP goes into master.yaml as
  the URL agents use) and an Elastic IP, user-data from infra/render.py; a log group;
- a Secrets Manager secret with the admin and database passwords, read by the master at each start;
- with `--shared-fs efs`: an encrypted EFS file system with a mount target in each of the cluster's
  subnets, behind a security group that lets in NFS from the agents and the master only; the master
  and every agent mount it (infra/render.py, shared_fs_mount) and checkpoints go there. `down` keeps
  it, like the bucket, unless `--delete-data`.

Every resource that takes tags carries `DEPLOY_TAG: <cluster id>` and the user's `--add-tag` tags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import pulumi
import pulumi_aws as aws

from infra import DEPLOY_TAG, db_final_snapshot_id, release, render
from infra.settings import AwsSettings

VPC_CIDR = "10.0.0.0/16"
SUBNET_CIDRS = ("10.0.0.0/20", "10.0.16.0/20")
DB_ENGINE_VERSION = "16"
MASTER_DISK_GB = 30
BACKUP_RETENTION_DAYS = 7
LOG_RETENTION_DAYS = 30


def _policy(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


ASSUME_EC2 = _policy([{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}])


def master_policy(s: AwsSettings, *, vpc_id: str, agent_role_arn: str, secret_arn: str, bucket: str,
                  log_group_arn: str) -> str:
    region = s.region
    ec2 = f"arn:aws:ec2:{region}:*"
    tagged_request = {"StringEquals": {f"aws:RequestTag/{DEPLOY_TAG}": s.cluster_id}}
    tagged_resource = {"StringEquals": {f"ec2:ResourceTag/{DEPLOY_TAG}": s.cluster_id}}
    return _policy([
        # A spot launch (RunInstances with InstanceMarketOptions) also creates a spot request, tagged
        # like the instance (provisioners/aws/provider.py).
        {"Sid": "RunOnlyTaggedInstances", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{ec2}:instance/*", f"{ec2}:volume/*", f"{ec2}:spot-instances-request/*"],
         "Condition": tagged_request},
        {"Sid": "RunInTheClusterVpc", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{ec2}:subnet/*", f"{ec2}:security-group/*", f"{ec2}:network-interface/*"],
         "Condition": {"ArnLike": {"ec2:Vpc": f"{ec2}:vpc/{vpc_id}"}}},
        {"Sid": "RunFromImagesWithTheClusterKey", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"arn:aws:ec2:{region}::image/*", f"{ec2}:key-pair/{s.keypair}"]},
        {"Sid": "ResolveImageParameters", "Effect": "Allow", "Action": "ssm:GetParameters",
         "Resource": f"arn:aws:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "TagOnlyAtLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [f"{ec2}:instance/*", f"{ec2}:volume/*", f"{ec2}:spot-instances-request/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances",
                                        f"aws:RequestTag/{DEPLOY_TAG}": s.cluster_id}}},
        {"Sid": "ManageOnlyTaggedInstances", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances",
                    "ec2:ModifyInstanceAttribute"],
         "Resource": f"{ec2}:instance/*", "Condition": tagged_resource},
        # Describe* has no resource-level permissions in EC2: it is allowed (read-only) account-wide.
        {"Sid": "Describe", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeImages",
                    "ec2:DescribeSubnets", "ec2:DescribeInstanceAttribute"], "Resource": "*"},
        {"Sid": "PassOnlyTheAgentRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": agent_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        {"Sid": "ReadOwnSecret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
         "Resource": secret_arn},
        *bucket_statements(bucket),
        {"Sid": "WriteOwnLogs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": f"{log_group_arn}:*"},
    ])


def bucket_statements(bucket: str) -> list[dict[str, Any]]:
    return [
        {"Sid": "ListCheckpointBucket", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{bucket}"},
        {"Sid": "UseCheckpointObjects", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], "Resource": f"arn:aws:s3:::{bucket}/*"},
    ]


def agent_policy(bucket: str) -> str:
    """The bucket, except the master's release (infra/release.py): trial code runs on the agents, and
    a wheel it could overwrite would run on the master at its next start."""
    return _policy([*bucket_statements(bucket),
                    {"Sid": "NeverWriteTheMasterRelease", "Effect": "Deny", "Action": ["s3:PutObject", "s3:DeleteObject"],
                     "Resource": f"arn:aws:s3:::{bucket}/{release.PREFIX}/*"}])


@dataclass(frozen=True)
class _Naming:
    """Resource names and tags of one cluster."""

    s: AwsSettings

    @property
    def cid(self) -> str:
        return self.s.cluster_id

    def named(self, what: str) -> str:
        return f"shipyard-{self.cid}-{what}"

    def tags(self, what: str) -> dict[str, str]:
        return {**self.s.all_tags, "Name": self.named(what)}


class _Network(NamedTuple):
    vpc_id: pulumi.Output[str]
    subnet_ids: pulumi.Output[list[str]]


def _network(s: AwsSettings, n: _Naming) -> _Network:
    """An existing VPC (`vpc_id`, `subnet_ids`), the account's default VPC (`use_default_vpc`), else a VPC
    of our own."""
    if s.vpc_id:
        return _Network(vpc_id=pulumi.Output.from_input(s.vpc_id),
                        subnet_ids=pulumi.Output.from_input(list(s.subnet_ids)))
    if s.use_default_vpc:
        default = aws.ec2.get_vpc_output(default=True)
        return _Network(vpc_id=default.id, subnet_ids=aws.ec2.get_subnets_output(filters=[
            {"name": "vpc-id", "values": [default.id]}, {"name": "default-for-az", "values": ["true"]},
        ]).ids)
    return _own_vpc(n)


def _own_vpc(n: _Naming) -> _Network:
    """A VPC with an internet gateway and one public subnet in each of two availability zones."""
    named, tags = n.named, n.tags
    azs = aws.get_availability_zones_output(state="available")
    vpc = aws.ec2.Vpc(named("vpc"), cidr_block=VPC_CIDR, enable_dns_hostnames=True, enable_dns_support=True,
                      tags=tags("vpc"))
    igw = aws.ec2.InternetGateway(named("igw"), vpc_id=vpc.id, tags=tags("igw"))
    routes = aws.ec2.RouteTable(named("routes"), vpc_id=vpc.id, tags=tags("routes"),
                                routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}])
    subnets = []
    for i, cidr in enumerate(SUBNET_CIDRS):
        subnet = aws.ec2.Subnet(named(f"subnet-{i}"), vpc_id=vpc.id, cidr_block=cidr,
                                availability_zone=azs.names[i], map_public_ip_on_launch=True,
                                tags=tags(f"subnet-{i}"))
        aws.ec2.RouteTableAssociation(named(f"subnet-{i}-routes"), subnet_id=subnet.id, route_table_id=routes.id)
        subnets.append(subnet)
    return _Network(vpc_id=vpc.id, subnet_ids=pulumi.Output.all(*[sn.id for sn in subnets]))


class _SecurityGroups(NamedTuple):
    agents: aws.ec2.SecurityGroup
    master: aws.ec2.SecurityGroup
    db: aws.ec2.SecurityGroup


def _security_groups(s: AwsSettings, n: _Naming, vpc_id: pulumi.Output[str]) -> _SecurityGroups:
    """The agents' (SSH, each other), the master's (its API, SSH) and the database's (the master only)."""
    named, tags, cid = n.named, n.tags, n.cid
    everywhere_out = [{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"],
                       "description": "outbound: package mirrors, the AWS APIs, the master"}]
    ssh_in = {"protocol": "tcp", "from_port": 22, "to_port": 22, "cidr_blocks": [s.inbound_cidr],
              "description": "SSH from the inbound CIDR"}
    agent_sg = aws.ec2.SecurityGroup(named("agents"), vpc_id=vpc_id, description=f"Shipyard {cid}: agents",
                                     ingress=[ssh_in, {"protocol": "-1", "from_port": 0, "to_port": 0, "self": True,
                                                       "description": "agent to agent (distributed training)"}],
                                     egress=everywhere_out, tags=tags("agents"))
    master_sg = aws.ec2.SecurityGroup(
        named("master"), vpc_id=vpc_id, description=f"Shipyard {cid}: master",
        ingress=[
            {"protocol": "tcp", "from_port": s.port, "to_port": s.port, "cidr_blocks": [s.inbound_cidr],
             "description": "the master's API from the inbound CIDR"},
            {"protocol": "tcp", "from_port": s.port, "to_port": s.port, "security_groups": [agent_sg.id],
             "description": "the master's API from the agents"},
            ssh_in,
        ],
        egress=everywhere_out, tags=tags("master"))
    db_sg = aws.ec2.SecurityGroup(
        named("db"), vpc_id=vpc_id, description=f"Shipyard {cid}: database",
        ingress=[{"protocol": "tcp", "from_port": render.DB_PORT, "to_port": render.DB_PORT,
                  "security_groups": [master_sg.id], "description": "PostgreSQL from the master only"}],
        tags=tags("db"))
    return _SecurityGroups(agents=agent_sg, master=master_sg, db=db_sg)


def _database(s: AwsSettings, n: _Naming, subnet_ids: pulumi.Output[list[str]], db_sg: aws.ec2.SecurityGroup,
              db_password: pulumi.Input[str]) -> aws.rds.Instance:
    """PostgreSQL on RDS: encrypted, backed up, reachable from the master's security group only."""
    named, tags = n.named, n.tags
    db_subnets = aws.rds.SubnetGroup(named("db"), subnet_ids=subnet_ids, tags=tags("db"))
    return aws.rds.Instance(
        named("db"), engine="postgres", engine_version=DB_ENGINE_VERSION, instance_class=s.db_instance_class,
        allocated_storage=s.db_storage_gb, storage_type="gp3", storage_encrypted=True,
        backup_retention_period=BACKUP_RETENTION_DAYS, db_name=render.DB_NAME, username=render.DB_USER,
        password=db_password, port=render.DB_PORT, vpc_security_group_ids=[db_sg.id],
        db_subnet_group_name=db_subnets.name, publicly_accessible=False, multi_az=False,
        copy_tags_to_snapshot=True, deletion_protection=False, apply_immediately=True,
        # `down` keeps a final snapshot under a stable name (`down --delete-data` deletes it).
        skip_final_snapshot=False, final_snapshot_identifier=db_final_snapshot_id(n.cid),
        delete_automated_backups=True, tags=tags("db"))


def _checkpoint_bucket(n: _Naming) -> aws.s3.Bucket:
    """The checkpoint bucket: private, owner-enforced, encrypted, TLS only. `down` keeps it, and its
    settings with it (retain_on_delete, never force-destroyed); `down --delete-data` deletes it."""
    named = n.named
    keep = pulumi.ResourceOptions(retain_on_delete=True)
    bucket = aws.s3.Bucket(named("ckpt"), bucket_prefix=f"shipyard-{n.cid}-", force_destroy=False,
                           tags=n.tags("ckpt"), opts=keep)
    aws.s3.BucketPublicAccessBlock(named("ckpt-private"), bucket=bucket.id, block_public_acls=True,
                                   block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True,
                                   opts=keep)
    aws.s3.BucketOwnershipControls(named("ckpt-owner"), bucket=bucket.id,
                                   rule={"object_ownership": "BucketOwnerEnforced"}, opts=keep)
    aws.s3.BucketServerSideEncryptionConfiguration(
        named("ckpt-encryption"), bucket=bucket.id,
        rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}, "bucket_key_enabled": True}],
        opts=keep)
    aws.s3.BucketPolicy(named("ckpt-tls-only"), bucket=bucket.id, policy=bucket.arn.apply(lambda arn: _policy([
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
         "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}])), opts=keep)
    return bucket


NFS_PORT = 2049


def _default_subnet_count() -> int:
    """How many default subnets the account's default VPC has (one mount target each): looked up
    while the program runs, since resources cannot be declared per item of an output."""
    vpc = aws.ec2.get_vpc(default=True)
    return len(aws.ec2.get_subnets(filters=[{"name": "vpc-id", "values": [vpc.id]},
                                            {"name": "default-for-az", "values": ["true"]}]).ids)


def _efs(s: AwsSettings, n: _Naming, network: _Network, sgs: _SecurityGroups) -> tuple[aws.efs.FileSystem,
                                                                                     list[aws.efs.MountTarget]]:
    """`--shared-fs efs`: the file system (kept by `down`, like the bucket), NFS from the agents and
    the master only, and a mount target in each subnet (the CLI checks they are in distinct zones)."""
    named, tags = n.named, n.tags
    count = (len(s.subnet_ids) if s.vpc_id else _default_subnet_count() if s.use_default_vpc else len(SUBNET_CIDRS))
    sg = aws.ec2.SecurityGroup(
        named("efs"), vpc_id=network.vpc_id, description=f"Shipyard {n.cid}: shared file system",
        ingress=[{"protocol": "tcp", "from_port": NFS_PORT, "to_port": NFS_PORT,
                  "security_groups": [sgs.agents.id, sgs.master.id],
                  "description": "NFS from the agents and the master"}],
        tags=tags("efs"))
    fs = aws.efs.FileSystem(named("efs"), creation_token=named("efs"), encrypted=True,
                            performance_mode="generalPurpose", throughput_mode="elastic", tags=tags("efs"),
                            opts=pulumi.ResourceOptions(retain_on_delete=True))
    targets = [aws.efs.MountTarget(named(f"efs-{i}"), file_system_id=fs.id, security_groups=[sg.id],
                                   subnet_id=network.subnet_ids.apply(lambda ids, i=i: ids[i]))
               for i in range(count)]
    return fs, targets


class _SecretAndLogs(NamedTuple):
    secret: aws.secretsmanager.Secret
    version: aws.secretsmanager.SecretVersion
    log_group: aws.cloudwatch.LogGroup


def _secret_and_logs(n: _Naming, db: aws.rds.Instance, *, db_password: pulumi.Input[str],
                     admin_password: pulumi.Input[str], tls_key: pulumi.Input[str]) -> _SecretAndLogs:
    """The master's secret (admin password, database URL) and its log group."""
    named, tags, cid, s = n.named, n.tags, n.cid, n.s
    secret = aws.secretsmanager.Secret(named("master-secret"), name=f"shipyard/{cid}/master",
                                       description=f"Shipyard {cid}: admin and database passwords",
                                       recovery_window_in_days=0, tags=tags("master-secret"))
    payload = pulumi.Output.all(admin_password, db_password, db.address, tls_key).apply(
        lambda a: render.secret_payload(a[0], render.postgres_url(a[1], a[2]), tls_cert=s.master_tls_cert,
                                       tls_key=a[3]))
    secret_version = aws.secretsmanager.SecretVersion(named("master-secret"), secret_id=secret.id,
                                                      secret_string=pulumi.Output.secret(payload))
    log_group = aws.cloudwatch.LogGroup(named("logs"), name=f"/shipyard/{cid}", retention_in_days=LOG_RETENTION_DAYS,
                                        tags=tags("logs"),
                                        # `down` keeps it (its events expire by themselves) unless
                                        # --no-retain-log-group.
                                        opts=pulumi.ResourceOptions(retain_on_delete=s.retain_log_group))
    return _SecretAndLogs(secret=secret, version=secret_version, log_group=log_group)


class _Profiles(NamedTuple):
    """The instance profiles of the agents and of the master."""

    agent: aws.iam.InstanceProfile
    master: aws.iam.InstanceProfile


def _iam(s: AwsSettings, n: _Naming, vpc_id: pulumi.Output[str], bucket: aws.s3.Bucket,
         secret: aws.secretsmanager.Secret, log_group: aws.cloudwatch.LogGroup) -> _Profiles:
    """The agents' and the master's roles, policies and instance profiles."""
    named, tags, cid = n.named, n.tags, n.cid
    agent_role = aws.iam.Role(named("agent"), name=named("agent"), assume_role_policy=ASSUME_EC2,
                              description=f"Shipyard {cid}: agents", tags=tags("agent"))
    aws.iam.RolePolicy(named("agent"), role=agent_role.id, policy=bucket.bucket.apply(agent_policy))
    agent_profile = aws.iam.InstanceProfile(named("agent"), name=named("agent"), role=agent_role.name,
                                            tags=tags("agent"))
    master_role = aws.iam.Role(named("master"), name=named("master"), assume_role_policy=ASSUME_EC2,
                               description=f"Shipyard {cid}: master", tags=tags("master"))
    aws.iam.RolePolicy(named("master"), role=master_role.id, policy=pulumi.Output.all(
        vpc_id, agent_role.arn, secret.arn, bucket.bucket, log_group.arn).apply(
        lambda a: master_policy(s, vpc_id=a[0], agent_role_arn=a[1], secret_arn=a[2], bucket=a[3],
                                log_group_arn=a[4])))
    master_profile = aws.iam.InstanceProfile(named("master"), name=named("master"), role=master_role.name,
                                             tags=tags("master"))
    return _Profiles(agent=agent_profile, master=master_profile)


class _Master(NamedTuple):
    nic: aws.ec2.NetworkInterface
    instance: aws.ec2.Instance
    eip: aws.ec2.Eip


def _master(s: AwsSettings, n: _Naming, network: _Network, sgs: _SecurityGroups, bucket: aws.s3.Bucket,
            secret: aws.secretsmanager.Secret, profiles: _Profiles, *,
            depends_on: list[pulumi.Resource], shared_fs_id: pulumi.Input[str] = "") -> _Master:
    """The master's network interface, instance (after `depends_on`) and Elastic IP."""
    named, tags = n.named, n.tags
    first_subnet = network.subnet_ids.apply(lambda ids: ids[0])
    nic = aws.ec2.NetworkInterface(named("master"), subnet_id=first_subnet, security_groups=[sgs.master.id],
                                   description=f"Shipyard {n.cid}: master", tags=tags("master"))
    user_data = pulumi.Output.all(nic.private_ip, bucket.bucket, network.subnet_ids, sgs.agents.id,
                                  profiles.agent.name, secret.arn, shared_fs_id).apply(lambda a: master_user_data(s, *a))
    ami: pulumi.Input[str] = s.master_ami
    if s.master_ami.startswith("resolve:ssm:"):
        ami = aws.ssm.get_parameter_output(name=s.master_ami.removeprefix("resolve:ssm:")).value
    master = aws.ec2.Instance(
        named("master"), ami=ami, instance_type=s.master_instance_type, key_name=s.keypair,
        iam_instance_profile=profiles.master.name, primary_network_interface={"network_interface_id": nic.id},
        user_data=user_data, user_data_replace_on_change=True,
        metadata_options={"http_tokens": "required", "http_endpoint": "enabled"},
        root_block_device={"encrypted": True, "volume_size": MASTER_DISK_GB, "volume_type": "gp3",
                           "delete_on_termination": True, "tags": tags("master")},
        tags=tags("master"), opts=pulumi.ResourceOptions(depends_on=depends_on))
    eip = aws.ec2.Eip(named("master"), domain="vpc", network_interface=nic.id, tags=tags("master"),
                      opts=pulumi.ResourceOptions(depends_on=[master]))
    return _Master(nic=nic, instance=master, eip=eip)


def build(s: AwsSettings, *, db_password: pulumi.Input[str], admin_password: pulumi.Input[str],
          tls_key: pulumi.Input[str] = "") -> dict[str, Any]:
    """Declare the stack's resources; returns its outputs (also exported)."""
    cid = s.cluster_id
    n = _Naming(s)
    network = _network(s, n)
    sgs = _security_groups(s, n, network.vpc_id)
    db = _database(s, n, network.subnet_ids, sgs.db, db_password)
    bucket = _checkpoint_bucket(n)
    secret, secret_version, log_group = _secret_and_logs(n, db, db_password=db_password,
                                                         admin_password=admin_password, tls_key=tls_key)
    profiles = _iam(s, n, network.vpc_id, bucket, secret, log_group)
    after: list[pulumi.Resource] = [secret_version, db]
    fs_id: pulumi.Input[str] = ""
    if s.shared_fs == "efs":
        fs, targets = _efs(s, n, network, sgs)
        fs_id = fs.id
        after += targets  # the master mounts it at its first boot
    # The master reads its secret (with the database's address) at its first start.
    nic, master, eip = _master(s, n, network, sgs, bucket, secret, profiles, depends_on=after, shared_fs_id=fs_id)

    outputs = {
        "cluster_id": cid,
        "cloud": "aws",
        "settings": s.to_json(),
        "region": s.region,
        "master_url": eip.public_ip.apply(lambda ip: f"{s.scheme}://{ip}:{s.port}"),
        "master_private_ip": nic.private_ip,
        "master_instance_id": master.id,
        "checkpoint_bucket": bucket.bucket,
        "db_endpoint": db.address,
        "secret": secret.arn,
        "log_group": log_group.name,
        "shared_fs": fs_id,
    }
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def master_user_data(s: AwsSettings, private_ip: str, bucket: str, subnet_ids: list[str], agent_sg: str,
                     agent_profile: str, secret_arn: str, shared_fs_id: str = "") -> str:
    source = render.efs_source(shared_fs_id, s.region) if shared_fs_id else ""
    facts = render.AwsFacts(master_private_ip=private_ip, bucket=bucket, subnet_ids=tuple(subnet_ids),
                            agent_security_group_id=agent_sg, agent_instance_profile=agent_profile,
                            secret_id=secret_arn, shared_fs_source=source)
    return render.master_user_data("aws", render.aws_master_config(s, facts), secret_id=secret_arn,
                                   region=s.region, package=s.shipyard_package, cluster_id=s.cluster_id,
                                   bucket=bucket, mount=render.shared_fs_mount(s, source))
