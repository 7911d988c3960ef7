"""The Pulumi program of Pulumi.yaml (`main: infra/`), and the inline program `det deploy` runs.

Stack config (namespace `shipyard`): `cloud` (aws or gcp), `settings` (JSON of infra.settings),
and the secrets `dbPassword`, `adminPassword` and, with a TLS certificate in the settings, `tlsKey`. `det deploy aws|gcp up` sets them; by hand:
`pulumi config set shipyard:cloud aws`, `pulumi config set shipyard:settings '{...}'`,
`pulumi config set --secret shipyard:dbPassword ...`.
"""

from __future__ import annotations

from typing import Any


def program() -> dict[str, Any]:
    import pulumi

    from infra.settings import settings_from_json

    config = pulumi.Config("shipyard")
    cloud = config.require("cloud")
    s = settings_from_json(cloud, config.require("settings"))
    secrets = {"db_password": config.require_secret("dbPassword"),
               "admin_password": config.require_secret("adminPassword"),
               "tls_key": config.require_secret("tlsKey") if s.tls else ""}
    if cloud == "aws":
        from infra.aws.program import build as build_aws

        return build_aws(s, **secrets)  # type: ignore[arg-type]
    from infra.gcp.program import build as build_gcp

    return build_gcp(s, **secrets)  # type: ignore[arg-type]


if __name__ == "__main__":
    program()
