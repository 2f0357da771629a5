"""Why a store refuses a write; shared by every backend so the actor can handle them alike."""


class WriteRefused(RuntimeError):
    """The store will not make this write: it is open read-only, or the row belongs to another user."""


class StoreUnavailable(RuntimeError):
    """The store cannot be opened or written right now (not a database, read-only, locked, down).

    The message is one line, names the store without credentials, and says what to check.
    """
