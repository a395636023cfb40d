"""The durable event log: the only source of truth (docs/architecture.md §2)."""

from tether.log.errors import SessionExists, SessionNotFound, StorageError, StreamClosed
from tether.log.store import Draft, EventStore
from tether.log.subscriptions import Hub, SessionDeleted, Subscription

__all__ = [
    "Draft",
    "EventStore",
    "Hub",
    "SessionDeleted",
    "SessionExists",
    "SessionNotFound",
    "StorageError",
    "StreamClosed",
    "Subscription",
]
