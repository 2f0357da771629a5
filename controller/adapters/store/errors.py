"""Why a store refuses a write; shared by every backend so the actor can handle them alike."""

from controller.core.ports import StoreUnavailable

__all__ = ["StoreUnavailable", "WriteRefused"]


class WriteRefused(RuntimeError):
    """The store will not make this write: it is open read-only, or the row belongs to another user."""
