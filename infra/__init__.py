"""The Pulumi programs behind `det deploy aws` and `det deploy gcp` (Pulumi.yaml at the repository root).

- `catalog`: the regions, zones, instance types, GPUs and database tiers `det deploy` knows, with
  hourly list prices (flag validation before any cloud call, the cost estimate of `describe`);
- `settings`: a deployment's settings from the command line's flags, validated (one line per error);
- `render`: the master.yaml and the master's cloud-init user-data a stack boots, and a sample of the
  agents' user-data (`det deploy ... render` writes them without creating anything);
- `template`: `--master-config-template`, merged over the rendered master.yaml (what the deploy owns refused);
- `aws/`, `gcp/`: the programs themselves.

The package describes a cluster; it imports nothing from the master, the providers or the CLI
(pyproject.toml's import contracts). Every resource it creates carries `DEPLOY_TAG` (a tag on AWS, a
label on GCP) with the cluster id, and so does every agent instance the master launches (the pools'
`tags`/`labels`): `det deploy ... down` finds them by it, and the master's IAM is conditioned on it.
"""

from __future__ import annotations

# Tag (AWS) / label (GCP) key of a deployment: valid as both (lowercase, digits, '-'), and outside
# the prefixes the providers reserve for their own tags ('shipyard:' on AWS, 'shipyard-' on GCP).
DEPLOY_TAG = "det-deploy-cluster"
# The tag and label every instance launched by a Shipyard master carries (provisioners/base.py
# TAG_MANAGED_BY and provisioners/gcp LABEL_MANAGED_BY; tests/infra checks they agree): the
# master's own VM does not carry it, so `down` tells agents from the master.
AGENT_MANAGED_BY_TAG = "shipyard:managed-by"
AGENT_MANAGED_BY_LABEL = "shipyard-managed-by"
MANAGED_BY_VALUE = "shipyard"


def db_final_snapshot_id(cluster_id: str) -> str:
    """The RDS final snapshot `down` leaves (a stable name: a second `down` of a cluster of the same id
    needs the first one deleted, or `down --delete-data`)."""
    return f"shipyard-{cluster_id}-final"
