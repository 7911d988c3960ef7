"""How an EC2 error is sorted into the provider taxonomy (provisioners/base.py): capacity moves the
launch on to the next subnet (another zone), quota (per region on EC2) / auth / invalid stop the
launch and are reported on the pool, throttling and server hiccups are retried with jittered backoff.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from provisioners.base import ErrorKind, ErrorScope, ProviderError

# No room in this zone/subnet: another subnet (zone) may have it.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientAddressCapacity",
        "InsufficientFreeAddressesInSubnet",  # this subnet is full; the next one may not be
        "Unsupported",  # instance type not offered in this subnet's availability zone
        "SpotMaxPriceTooLow",  # spot price in this zone is above our max price
    }
)
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "VolumeLimitExceeded",
        "AddressLimitExceeded",
        "ResourceLimitExceeded",
        "PendingVerification",  # new account / region still being validated by AWS
    }
)
THROTTLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "OptInRequired",
        "Blocked",
    }
)
INVALID_CODES = frozenset(
    {
        "MissingParameter",
        "UnknownParameter",
        "ValidationError",
        "IdempotentParameterMismatch",  # a launch id reused with different parameters: a bug
        "UnsupportedOperation",
        "NoSuchEntity",  # IAM instance profile that does not exist
    }
)
# Server-side hiccups: retried like throttling, reported as UNKNOWN when they persist.
TRANSIENT_SERVER_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"}
)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


def classify_error(exc: ClientError, location: str) -> ProviderError:
    """Sort an EC2 error into the provider taxonomy; `location` is the subnet (or region) it hit."""
    code = error_code(exc)
    message = error_message(exc)

    def err(kind: ErrorKind, scope: ErrorScope) -> ProviderError:
        return ProviderError(kind, message, scope=scope, code=code, location=location)

    if code in CAPACITY_CODES:
        return err(ErrorKind.CAPACITY, ErrorScope.ZONE)
    if code in QUOTA_CODES:
        return err(ErrorKind.QUOTA, ErrorScope.REGION)
    if code in THROTTLE_CODES:
        return err(ErrorKind.THROTTLED, ErrorScope.REGION)
    # Auth before the "Invalid*" prefix rule: InvalidClientTokenId is a credentials problem.
    if code in AUTH_CODES:
        return err(ErrorKind.AUTH, ErrorScope.CLOUD)
    if code.startswith("InvalidSubnetID"):
        return err(ErrorKind.INVALID, ErrorScope.ZONE)
    if code in INVALID_CODES or code.startswith("Invalid"):
        # InvalidAMIID.*, InvalidParameterValue, InvalidGroup.*, InvalidKeyPair.*, ...
        return err(ErrorKind.INVALID, ErrorScope.REGION)
    return err(ErrorKind.UNKNOWN, ErrorScope.REGION)


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt of the same call. RunInstances is safe to repeat thanks to ClientToken,
    DescribeInstances and TerminateInstances are idempotent by nature."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        return code in THROTTLE_CODES or code in TRANSIENT_SERVER_CODES
    # Connection refused/reset, connect or read timeouts: the request may or may not have landed.
    return isinstance(exc, BotoConnectionError | HTTPClientError)


def transport_error(exc: BotoCoreError, location: str) -> ProviderError:
    return ProviderError(
        ErrorKind.UNKNOWN, str(exc), scope=ErrorScope.REGION, code=type(exc).__name__, location=location
    )
