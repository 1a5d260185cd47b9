"""The infrastructure errors a stage is retried for: the database, the broker or object storage being
unreachable for a moment. Anything else is a property of the job (bad input, a failed check) or a bug, and
retrying it would only repeat it."""

from __future__ import annotations

import functools


@functools.cache
def infrastructure_errors() -> tuple[type[BaseException], ...]:
    import botocore.exceptions
    import kombu.exceptions
    import redis.exceptions
    import sqlalchemy.exc

    return (
        sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.DisconnectionError,
        kombu.exceptions.OperationalError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
        botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError,
        botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError,
        ConnectionError, TimeoutError,
    )


def storage_refusal(error: BaseException) -> str | None:
    """A message for object storage refusing a request (wrong credentials, missing bucket), or None. Names
    the refusal and the settings to check; never echoes a credential."""
    import botocore.exceptions

    from domain.storage import StorageRedirected

    if isinstance(error, StorageRedirected):  # names the endpoint's setting and the fix itself
        return str(error)
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "an error")
        operation = getattr(error, "operation_name", "a request")
        return (f"object storage refused {operation} ({code}); check DRAFTSMITH_STORAGE_URL and the "
                "DRAFTSMITH_S3_* settings of the worker")
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return "object storage needs credentials: set DRAFTSMITH_S3_ACCESS_KEY_ID and DRAFTSMITH_S3_SECRET_ACCESS_KEY"
    return None
