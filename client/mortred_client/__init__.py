"""mortred-client: the Python client of the mortred job API.

``Client`` (blocking, standard library only) and, with the ``twisted`` extra,
``mortred_client.twisted.TwistedClient`` (Deferreds). Both speak to a gateway
(``/v1/models/<model>/…``) or a model port (``/jobs``). Nothing here imports the
server package (``mortred_twisted``), torch or numpy.
"""

from mortred_client._version import __version__
from mortred_client.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    JobAlreadyFinished,
    JobFailed,
    JobNotFinished,
    JobNotFound,
    MortredError,
    NotFound,
    NotSupported,
    QueueFull,
    ServerError,
    TransportError,
    Unauthorized,
)
from mortred_client.retry import NO_RETRY, RetryPolicy
from mortred_client.sync import Client, Job
from mortred_client.types import JobEvent, JobPage, JobStatus, Progress, Result, ResultFile

__all__ = [
    "NO_RETRY",
    "Client",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "Job",
    "JobAlreadyFinished",
    "JobEvent",
    "JobFailed",
    "JobNotFinished",
    "JobNotFound",
    "JobPage",
    "JobStatus",
    "MortredError",
    "NotFound",
    "NotSupported",
    "Progress",
    "QueueFull",
    "Result",
    "ResultFile",
    "RetryPolicy",
    "ServerError",
    "TransportError",
    "Unauthorized",
    "__version__",
]
