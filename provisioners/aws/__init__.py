"""The AWS EC2 provider: the instances of a `type: aws` pool.

- `config`: the pool's AWS settings (`AwsPoolConfig`), checked without the AWS SDK;
- `errors`: how EC2's error codes are sorted into the provider taxonomy;
- `provider`: `AwsProvider`, launch / list / describe / terminate through boto3.

Importing this package imports no AWS SDK: the registry reads `PROVIDER_TYPE.config` to check a
pool's section (the master's API workers do, to show effective settings); boto3 comes with the first
provider built, or the first use of a name below that lives in `errors` or `provider`.
"""

from __future__ import annotations

from provisioners.aws.config import AwsPoolConfig as AwsPoolConfig
from provisioners.base import ProviderType, UserDataKind, lazy_build, lazy_exports

__getattr__ = lazy_exports(__name__, {
    "AwsProvider": "provider",
    "classify_error": "errors",
})

# AWS refuses user-data over 16 KiB (before base64).
PROVIDER_TYPE = ProviderType(name="aws", config=AwsPoolConfig, build=lazy_build(f"{__name__}.provider"),
                             user_data=UserDataKind.CLOUD_INIT, user_data_limit=16 * 1024, parks=True)
