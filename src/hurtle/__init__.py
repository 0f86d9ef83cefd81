"""hurtle: a fast distributed task queue that keeps its promises.

from hurtle import Hurtle

app = Hurtle()          # HURTLE_BROKER_URL, else the embedded sqlite:///hurtle.db

@app.task(retries=3)
def add(x, y):
    return x + y

add.send(5, 6)
"""

from .app import Hurtle
from .brokers import Broker, DeadLetter, QueueStats
from .context import Current, current
from .errors import (
    ArgumentError,
    BrokerError,
    ConfigurationError,
    DecodeError,
    EncodeError,
    HurtleError,
    Reject,
    ResultTimeout,
    Retry,
    SealError,
    Superseded,
    TaskCancelled,
    TaskFailed,
    Throttle,
    TimeLimitExceeded,
    UnknownTaskError,
)
from .graphs import GraphHandle, graph
from .handles import Handle
from .message import Message
from .progress import Progress
from .sealing import new_key
from .sending import Args
from .settings import Settings
from .task import Task
from .workflows import FlowHandle, GroupHandle, Signature, chain, chord, group

__version__ = "0.1.0"

__all__ = [
    "Args",
    "ArgumentError",
    "Broker",
    "BrokerError",
    "ConfigurationError",
    "Current",
    "DeadLetter",
    "DecodeError",
    "EncodeError",
    "FlowHandle",
    "GraphHandle",
    "GroupHandle",
    "Handle",
    "Hurtle",
    "HurtleError",
    "Message",
    "Progress",
    "QueueStats",
    "Reject",
    "ResultTimeout",
    "Retry",
    "SealError",
    "Settings",
    "Signature",
    "Superseded",
    "Task",
    "TaskCancelled",
    "TaskFailed",
    "Throttle",
    "TimeLimitExceeded",
    "UnknownTaskError",
    "__version__",
    "chain",
    "chord",
    "current",
    "graph",
    "group",
    "new_key",
]
