"""Why a store refuses a write; the contract's errors, re-exported for the backends."""

from controller.core.ports import StoreUnavailable, WriteRefused

__all__ = ["StoreUnavailable", "WriteRefused"]
