"""Where `secretRef`s get their values: the environment for the CLI, Kubernetes Secrets for the operator.

A value is read only where it is used (a job's environment, a mask); it is never logged, stored or put in
a message. Messages say where to set a missing secret, never what it is.
"""

from __future__ import annotations

import os
import re
from typing import Protocol

from controller.api.fields import SecretRef


class SecretSource(Protocol):
    def get(self, ref: SecretRef) -> str | None:
        """The secret's value, or None when it is not set."""
        ...

    def where(self, ref: SecretRef) -> str:
        """How a human sets it (for error messages)."""
        ...


class EnvironmentSecrets:
    """CLI secrets: `EVALCTL_SECRET_<NAME>_<KEY>` in the environment."""

    def get(self, ref: SecretRef) -> str | None:
        return os.environ.get(secret_variable(ref))

    def where(self, ref: SecretRef) -> str:
        return f"set {secret_variable(ref)}"


def secret_variable(ref: SecretRef) -> str:
    return "EVALCTL_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", f"{ref.name}_{ref.key}").upper()
