"""A Shipyard cluster on GCP, as Pulumi resources.

- network: a VPC network and one subnetwork in the zone's region (or existing ones, `--network`
  and `--subnetwork`; the program adds its firewall rules and the Cloud SQL peering range to them);
- firewall rules of the AWS shape: the master's port from the inbound CIDR and from the agents, SSH
  from the inbound CIDR, agent to agent; and the database's range denied to the agents (Cloud SQL's
  private IP sits behind a peering that ingress rules cannot filter, so the agents' egress to it is
  what is closed);
- Cloud SQL for PostgreSQL with a private IP only (no public address, TLS required, backups and
  point-in-time recovery);
- a private GCS bucket for checkpoints (uniform access, public access prevention enforced; GCS
  encrypts every object at rest);
- service accounts with minimal roles: the master gets a custom role limited to what the GCP
  provider calls, conditioned on the agents' instance and disk names (IAM conditions cannot read
  Compute labels: the names start with `<cluster>-agent-`, the pools' name prefix), may act as the
  agents' service account only, and may read only its own secret; the agents may use only the bucket;
- a static external IP and a reserved internal IP for the master (its URL in master.yaml), Secret
  Manager for the passwords, and the master VM with its cloud-init user-data;
- with `--shared-fs filestore`: a Filestore instance (basic HDD, 1 TiB) on the cluster's network,
  mounted by the master and every agent (infra/render.py, shared_fs_mount) for checkpoints; `down`
  keeps it, like the bucket, unless `--delete-data`.

Every resource type that takes labels carries `DEPLOY_TAG: <cluster id>` and the user's tags; the
others (network, firewall, service account, IAM) are named after the cluster.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pulumi
import pulumi_gcp as gcp

from infra import release, render, settings
from infra.settings import GcpSettings

SUBNET_CIDR = "10.10.0.0/20"
SQL_PEERING_PREFIX = 20
DB_VERSION = "POSTGRES_16"
FINAL_BACKUP_DAYS = 30
MASTER_DISK_GB = 30
APIS = ("compute.googleapis.com", "sqladmin.googleapis.com", "servicenetworking.googleapis.com",
        "secretmanager.googleapis.com", "iam.googleapis.com")
FILESTORE_API = "file.googleapis.com"
# What the GCP provider (provisioners/gcp/) calls, and nothing else.
MASTER_PERMISSIONS = (
    "compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
    "compute.instances.setLabels", "compute.instances.setMetadata", "compute.instances.setServiceAccount",
    "compute.instances.setTags", "compute.instances.setDiskAutoDelete", "compute.instances.stop",
    "compute.instances.start", "compute.disks.create",
    "compute.subnetworks.use", "compute.subnetworks.useExternalIp", "compute.images.useReadOnly",
    "compute.zoneOperations.get", "compute.zones.get", "compute.machineTypes.get",
)


def instance_condition(cluster_id: str) -> str:
    """CEL: instances and disks only when named like this cluster's agents; the other resource types
    the role's permissions name (subnetworks, images, operations, zones) unrestricted."""
    prefix = render.agent_name_prefix(cluster_id)
    return (
        '(resource.type != "compute.googleapis.com/Instance" && resource.type != "compute.googleapis.com/Disk")'
        f' || resource.name.extract("/instances/{{name}}").startsWith("{prefix}")'
        f' || resource.name.extract("/disks/{{name}}").startsWith("{prefix}")'
    )


def _master_tag(cid: str) -> str:
    """The master VM's network tag, which the firewall rules target."""
    return f"{cid}-master"


def _agent_tag(cid: str) -> str:
    """The agents' network tag (the pools' `network_tags` in master.yaml, infra/render.py)."""
    return f"{cid}-agent"


class _Network(NamedTuple):
    # A Network and Subnetwork of ours, or the lookups of existing ones (`id` and `name` either way).
    network: Any
    subnet: Any
    sql_range: gcp.compute.GlobalAddress
    peering: gcp.servicenetworking.Connection


def _network(s: GcpSettings, after_apis: pulumi.ResourceOptions) -> _Network:
    """The VPC network and its subnetwork (new, or the existing `network`/`subnetwork`), and the range
    peered with Cloud SQL."""
    cid, project = s.cluster_id, s.project
    if s.network:
        network: Any = gcp.compute.get_network_output(name=s.network, project=project)
        subnet: Any = gcp.compute.get_subnetwork_output(name=s.subnetwork, region=s.region, project=project)
    else:
        network = gcp.compute.Network(f"{cid}-net", name=f"{cid}-net", project=project,
                                      auto_create_subnetworks=False, description=f"Shipyard {cid}", opts=after_apis)
        subnet = gcp.compute.Subnetwork(f"{cid}-subnet", name=f"{cid}-subnet", project=project, region=s.region,
                                        network=network.id, ip_cidr_range=SUBNET_CIDR, private_ip_google_access=True)
    sql_range = gcp.compute.GlobalAddress(f"{cid}-sql-range", name=f"{cid}-sql-range", project=project,
                                          purpose="VPC_PEERING", address_type="INTERNAL",
                                          prefix_length=SQL_PEERING_PREFIX, network=network.id, labels=s.all_tags)
    peering = gcp.servicenetworking.Connection(f"{cid}-sql-peering", network=network.id,
                                               service="servicenetworking.googleapis.com",
                                               reserved_peering_ranges=[sql_range.name])
    return _Network(network=network, subnet=subnet, sql_range=sql_range, peering=peering)


def _firewalls(s: GcpSettings, net: _Network) -> None:
    """Ingress to the master and the agents, and the agents' egress to the database closed."""
    cid, project = s.cluster_id, s.project
    master_tag, agent_tag = _master_tag(cid), _agent_tag(cid)

    def firewall(name: str, **kwargs: Any) -> gcp.compute.Firewall:
        return gcp.compute.Firewall(f"{cid}-{name}", name=f"{cid}-{name}", project=project,
                                    network=net.network.id, **kwargs)

    firewall("master-api", description="the master's API from the inbound CIDR", direction="INGRESS",
             source_ranges=[s.inbound_cidr], target_tags=[master_tag],
             allows=[{"protocol": "tcp", "ports": [str(s.port)]}])
    firewall("agents-to-master", description="the master's API from the agents", direction="INGRESS",
             source_tags=[agent_tag], target_tags=[master_tag], allows=[{"protocol": "tcp", "ports": [str(s.port)]}])
    firewall("ssh", description="SSH from the inbound CIDR", direction="INGRESS", source_ranges=[s.inbound_cidr],
             target_tags=[master_tag, agent_tag], allows=[{"protocol": "tcp", "ports": ["22"]}])
    firewall("agent-to-agent", description="agent to agent (distributed training)", direction="INGRESS",
             source_tags=[agent_tag], target_tags=[agent_tag], allows=[{"protocol": "all"}])
    firewall("agents-no-db", description="the database is the master's only", direction="EGRESS", priority=900,
             target_tags=[agent_tag],
             destination_ranges=[pulumi.Output.concat(net.sql_range.address, f"/{SQL_PEERING_PREFIX}")],
             denies=[{"protocol": "tcp", "ports": [str(render.DB_PORT)]}])


class _Database(NamedTuple):
    instance: gcp.sql.DatabaseInstance
    user: gcp.sql.User


def _database(s: GcpSettings, net: _Network, db_password: pulumi.Input[str]) -> _Database:
    """Cloud SQL for PostgreSQL on the private network only, its database and its user."""
    cid, project = s.cluster_id, s.project
    db = gcp.sql.DatabaseInstance(
        f"{cid}-db", name=f"{cid}-db", project=project, region=s.region, database_version=DB_VERSION,
        deletion_protection=False,
        settings={
            "tier": s.db_tier, "edition": "ENTERPRISE", "disk_size": s.db_storage_gb, "disk_type": "PD_SSD",
            "availability_type": "ZONAL", "location_preference": {"zone": s.zone},
            "ip_configuration": {"ipv4_enabled": False, "private_network": net.network.id,
                                 "ssl_mode": "ENCRYPTED_ONLY"},
            "backup_configuration": {"enabled": True, "point_in_time_recovery_enabled": True},
            # `down` leaves a final backup, kept FINAL_BACKUP_DAYS after the instance is deleted.
            "final_backup_config": {"enabled": True, "retention_days": FINAL_BACKUP_DAYS},
            "user_labels": s.all_tags,
        },
        opts=pulumi.ResourceOptions(depends_on=[net.peering]))
    gcp.sql.Database(f"{cid}-db-shipyard", name=render.DB_NAME, instance=db.name, project=project)
    db_user = gcp.sql.User(f"{cid}-db-user", name=render.DB_USER, instance=db.name, project=project,
                           password=db_password)
    return _Database(instance=db, user=db_user)


def _checkpoint_bucket(s: GcpSettings) -> gcp.storage.Bucket:
    """The checkpoint bucket: uniform access, public access prevented."""
    cid, project = s.cluster_id, s.project
    return gcp.storage.Bucket(f"{cid}-ckpt", name=f"{project}-{cid}-ckpt", project=project, location=s.region,
                              uniform_bucket_level_access=True, public_access_prevention="enforced",
                              force_destroy=False, labels=s.all_tags,
                              # `down` keeps it (`down --delete-data` deletes it).
                              opts=pulumi.ResourceOptions(retain_on_delete=True))


def agent_bucket_condition(bucket: str) -> str:
    """CEL: the agents may use the bucket, except the master's release (infra/release.py): trial code
    runs on the agents, and a wheel it could overwrite would run on the master at its next start."""
    return (f'resource.type != "storage.googleapis.com/Object"'
            f' || !resource.name.startsWith("projects/_/buckets/{bucket}/objects/{release.PREFIX}/")')


class _ServiceAccounts(NamedTuple):
    master: gcp.serviceaccount.Account
    agent: gcp.serviceaccount.Account
    master_member: pulumi.Output[str]


def _service_accounts(s: GcpSettings, bucket: gcp.storage.Bucket,
                      after_apis: pulumi.ResourceOptions) -> _ServiceAccounts:
    """The master's and the agents' service accounts and their minimal roles."""
    cid, project = s.cluster_id, s.project
    master_sa = gcp.serviceaccount.Account(f"{cid}-master", account_id=f"{cid}-master", project=project,
                                           display_name=f"Shipyard {cid}: master", opts=after_apis)
    agent_sa = gcp.serviceaccount.Account(f"{cid}-agent", account_id=f"{cid}-agent", project=project,
                                          display_name=f"Shipyard {cid}: agents", opts=after_apis)
    master_member = pulumi.Output.concat("serviceAccount:", master_sa.email)
    agent_member = pulumi.Output.concat("serviceAccount:", agent_sa.email)
    role = gcp.projects.IAMCustomRole(f"{cid}-master-role", project=project,
                                      role_id=f"shipyard_{cid.replace('-', '_')}_master",
                                      title=f"Shipyard {cid} master", permissions=list(MASTER_PERMISSIONS),
                                      description="Launch, list and delete this cluster's agents")
    gcp.projects.IAMMember(f"{cid}-master-instances", project=project, role=role.name, member=master_member,
                           condition={"title": f"{cid} agents only",
                                      "description": "instances and disks named like this cluster's agents",
                                      "expression": instance_condition(cid)})
    gcp.serviceaccount.IAMMember(f"{cid}-master-acts-as-agent", service_account_id=agent_sa.name,
                                 role="roles/iam.serviceAccountUser", member=master_member)
    gcp.storage.BucketIAMMember(f"{cid}-agent-ckpt", bucket=bucket.name, role="roles/storage.objectAdmin",
                                member=agent_member, condition=bucket.name.apply(lambda b: {
                                    "title": "not the master's release", "description": "checkpoints only",
                                    "expression": agent_bucket_condition(b)}))
    gcp.storage.BucketIAMMember(f"{cid}-master-ckpt", bucket=bucket.name, role="roles/storage.objectAdmin",
                                member=master_member)
    return _ServiceAccounts(master=master_sa, agent=agent_sa, master_member=master_member)


class _Secret(NamedTuple):
    secret: gcp.secretmanager.Secret
    version: gcp.secretmanager.SecretVersion


def _secret(s: GcpSettings, db: gcp.sql.DatabaseInstance, accounts: _ServiceAccounts, after_apis: pulumi.ResourceOptions, *,
            db_password: pulumi.Input[str], admin_password: pulumi.Input[str], tls_key: pulumi.Input[str]) -> _Secret:
    """The master's secret (admin password, database URL), readable by the master only."""
    cid, project = s.cluster_id, s.project
    secret = gcp.secretmanager.Secret(f"{cid}-master-secret", secret_id=f"{cid}-master", project=project,
                                      replication={"auto": {}}, labels=s.all_tags, opts=after_apis)
    payload = pulumi.Output.all(admin_password, db_password, db.private_ip_address, tls_key).apply(
        lambda a: render.secret_payload(a[0], render.postgres_url(a[1], a[2]), tls_cert=s.master_tls_cert,
                                       tls_key=a[3]))
    secret_version = gcp.secretmanager.SecretVersion(f"{cid}-master-secret", secret=secret.id,
                                                     secret_data=pulumi.Output.secret(payload))
    gcp.secretmanager.SecretIamMember(f"{cid}-master-reads-secret", project=project, secret_id=secret.secret_id,
                                      role="roles/secretmanager.secretAccessor", member=accounts.master_member)
    return _Secret(secret=secret, version=secret_version)


def _filestore(s: GcpSettings, net: _Network, after_apis: pulumi.ResourceOptions) -> gcp.filestore.Instance:
    """`--shared-fs filestore`: on the cluster's network (direct peering), exported read-write to the
    cluster's subnetwork only (the master and the agents; trials write as root), kept by `down` like
    the bucket."""
    cid = s.cluster_id
    export = {"ip_ranges": [net.subnet.ip_cidr_range], "access_mode": "READ_WRITE", "squash_mode": "NO_ROOT_SQUASH"}
    return gcp.filestore.Instance(
        f"{cid}-ckpt-fs", name=f"{cid}-ckpt", project=s.project, location=s.zone, tier=settings.FILESTORE_TIER,
        description=f"Shipyard {cid}: checkpoints",
        file_shares={"name": render.FILESTORE_SHARE, "capacity_gb": settings.FILESTORE_CAPACITY_GB,
                     "nfs_export_options": [export]},
        networks=[{"network": net.network.name, "modes": ["MODE_IPV4"], "connect_mode": "DIRECT_PEERING"}],
        labels=s.all_tags, opts=pulumi.ResourceOptions.merge(after_apis, pulumi.ResourceOptions(retain_on_delete=True)))


class _Master(NamedTuple):
    internal_ip: gcp.compute.Address
    external_ip: gcp.compute.Address
    instance: gcp.compute.Instance


def _master(s: GcpSettings, net: _Network, bucket: gcp.storage.Bucket, accounts: _ServiceAccounts,
            secret: gcp.secretmanager.Secret, after_apis: pulumi.ResourceOptions, *,
            depends_on: list[pulumi.Resource], shared_fs_ip: pulumi.Input[str] = "") -> _Master:
    """The master's internal and external addresses and its VM (after `depends_on`)."""
    cid, project, region, labels = s.cluster_id, s.project, s.region, s.all_tags
    internal_ip = gcp.compute.Address(f"{cid}-master-internal", name=f"{cid}-master-internal", project=project,
                                      region=region, address_type="INTERNAL", subnetwork=net.subnet.id, labels=labels)
    external_ip = gcp.compute.Address(f"{cid}-master", name=f"{cid}-master", project=project, region=region,
                                      address_type="EXTERNAL", labels=labels, opts=after_apis)
    user_data = pulumi.Output.all(internal_ip.address, bucket.name, net.network.name, net.subnet.name,
                                  accounts.agent.email, secret.name, shared_fs_ip).apply(lambda a: master_user_data(s, *a))
    metadata: dict[str, Any] = {"user-data": user_data, "enable-oslogin": "TRUE"}
    if s.ssh_public_key:  # metadata keys are ignored under OS Login
        metadata.update({"ssh-keys": f"{settings.GCP_SSH_USER}:{s.ssh_public_key}", "enable-oslogin": "FALSE"})
    master = gcp.compute.Instance(
        f"{cid}-master", name=f"{cid}-master", project=project, zone=s.zone, machine_type=s.master_instance_type,
        boot_disk={"initialize_params": {"image": s.master_image, "size": MASTER_DISK_GB, "type": "pd-balanced",
                                         "labels": labels}, "auto_delete": True},
        network_interfaces=[{"subnetwork": net.subnet.id, "network_ip": internal_ip.address,
                             "access_configs": [{"nat_ip": external_ip.address}]}],
        service_account={"email": accounts.master.email, "scopes": ["cloud-platform"]},
        metadata=metadata, min_cpu_platform=s.min_cpu_platform_master or None,
        shielded_instance_config={"enable_secure_boot": True, "enable_vtpm": True,
                                  "enable_integrity_monitoring": True},
        tags=[_master_tag(cid)], labels=labels, allow_stopping_for_update=True,
        opts=pulumi.ResourceOptions(depends_on=depends_on))
    return _Master(internal_ip=internal_ip, external_ip=external_ip, instance=master)


def build(s: GcpSettings, *, db_password: pulumi.Input[str], admin_password: pulumi.Input[str],
          tls_key: pulumi.Input[str] = "") -> dict[str, Any]:
    """Declare the stack's resources; returns its outputs (also exported)."""
    cid, project = s.cluster_id, s.project
    apis = [gcp.projects.Service(f"{cid}-api-{api.split('.')[0]}", project=project, service=api,
                                 disable_on_destroy=False)
            for api in (*APIS, *([FILESTORE_API] if s.shared_fs == "filestore" else []))]
    after_apis = pulumi.ResourceOptions(depends_on=apis)
    net = _network(s, after_apis)
    _firewalls(s, net)
    db, db_user = _database(s, net, db_password)
    bucket = _checkpoint_bucket(s)
    accounts = _service_accounts(s, bucket, after_apis)
    secret, secret_version = _secret(s, db, accounts, after_apis, db_password=db_password,
                                     admin_password=admin_password, tls_key=tls_key)
    after: list[pulumi.Resource] = [secret_version, db_user]
    fs_ip: pulumi.Input[str] = ""
    fs_name: pulumi.Input[str] = ""
    if s.shared_fs == "filestore":
        fs = _filestore(s, net, after_apis)
        fs_ip, fs_name = fs.networks.apply(lambda nets: nets[0].ip_addresses[0]), fs.name
        after.append(fs)  # the master mounts it at its first boot
    internal_ip, external_ip, master = _master(s, net, bucket, accounts, secret, after_apis,
                                               depends_on=after, shared_fs_ip=fs_ip)

    outputs = {
        "cluster_id": cid,
        "cloud": "gcp",
        "settings": s.to_json(),
        "project": project,
        "zone": s.zone,
        "master_url": external_ip.address.apply(lambda ip: f"{s.scheme}://{ip}:{s.port}"),
        "master_private_ip": internal_ip.address,
        "master_instance": master.name,
        "checkpoint_bucket": bucket.name,
        "db_private_ip": db.private_ip_address,
        "secret": secret.name,
        "shared_fs": fs_name,
    }
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def master_user_data(s: GcpSettings, private_ip: str, bucket: str, network: str, subnet: str, agent_sa: str,
                     secret_name: str, shared_fs_ip: str = "") -> str:
    source = render.filestore_source(shared_fs_ip) if shared_fs_ip else ""
    facts = render.GcpFacts(master_private_ip=private_ip, bucket=bucket,
                            network=f"projects/{s.project}/global/networks/{network}",
                            subnetwork=f"regions/{s.region}/subnetworks/{subnet}",
                            agent_service_account=agent_sa, secret_id=secret_name, shared_fs_source=source)
    return render.master_user_data("gcp", render.gcp_master_config(s, facts), secret_id=secret_name,
                                   region=s.region, package=s.shipyard_package, cluster_id=s.cluster_id,
                                   bucket=bucket, mount=render.shared_fs_mount(s, source))
