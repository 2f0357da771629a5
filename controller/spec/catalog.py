"""The shipped catalogs (presets, error classes, size policy, model registry, harnesses, failures) as typed data.

Catalog facts change more often than code, so they live in `catalog/*.yaml`. A site can replace
any of those files by putting its own under `$EVALCTL_CATALOG_DIR` (file by file; absent files
fall back to the shipped ones). A broken catalog file is reported like a broken spec.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controller.core.gpu_hours import SizeBands, size_in_billions
from controller.core.trial_errors import ErrorClasses
from controller.core.types import FailureMode
from controller.spec.diagnose import validate
from controller.spec.errors import SpecError, SpecErrors
from controller.spec.models import FAILURE_MODES_MAX, FailureModeSpec, PositiveInt, entry_error
from controller.spec.yamldoc import read_documents

SHIPPED_DIR = Path(__file__).parent / "catalog"
CATALOG_DIR_ENV = "EVALCTL_CATALOG_DIR"

PositiveFloat = Annotated[float, Field(gt=0)]


class CatalogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- presets.yaml


class Preset(CatalogModel):
    """A named benchmark; `tasks` × the run's nAttempts = expected trials (None: unknown)."""

    dataset: str
    n_concurrent: PositiveInt
    tasks: PositiveInt | None = None
    note: str = ""


class Presets(CatalogModel):
    """Presets by name, and aliases that stand for several of them (`id` = the ID evals)."""

    presets: dict[str, Preset]
    aliases: dict[str, list[str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aliases_name_presets(self) -> Presets:
        for alias, names in self.aliases.items():
            if alias in self.presets:
                raise entry_error(
                    ("aliases", alias, "[key]"), "alias_shadows", "alias {alias} is also a preset", alias=alias
                )
            for index, name in enumerate(names):
                if name not in self.presets:
                    raise entry_error(("aliases", alias, index), "unknown_preset", "unknown preset {name}", name=name)
        return self

    @property
    def known(self) -> list[str]:
        return [*self.presets, *self.aliases]

    def expand(self, name: str) -> list[str]:
        """Preset names `name` stands for: itself, or an alias's members. Unknown names expand to nothing."""
        if name in self.aliases:
            return list(self.aliases[name])
        return [name] if name in self.presets else []


# --------------------------------------------------------------------------- error_classes.yaml

# --------------------------------------------------------------------------- size_policy.yaml


class SizeRule(CatalogModel):
    harbor_config: str
    timeout_multiplier: PositiveFloat


class SizeBand(SizeRule):
    min_b: float = 0
    max_b: float


class SizeChoice(CatalogModel):
    """The rule the size policy picked for a model, and a note when it fell back to the default."""

    rule: SizeRule
    note: str | None = None


class SizePolicy(CatalogModel):
    """Harbor config and timeout multiplier by model size, the last resort after the run and the registry."""

    size_token: str
    bands: list[SizeBand]
    default: SizeRule

    @field_validator("size_token")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            if re.compile(value).groups < 1:
                raise ValueError("size_token needs a group that captures the number of billions")
        except re.error as exc:
            raise ValueError(f"size_token is not a valid regular expression: {exc}") from None
        return value

    def size_b(self, model: str) -> float | None:
        """Largest size token in the model name, in billions (`Qwen3-30B-A3B` → 30)."""
        return size_in_billions(model, self.size_token)

    def bands_data(self) -> SizeBands:
        """The bands as the core compares GPU-hours by (a cell's estimate comes from its own band's history)."""
        return SizeBands(size_token=self.size_token, bands=tuple((band.min_b, band.max_b) for band in self.bands))

    def choose(self, model: str) -> SizeChoice:
        size = self.size_b(model)
        if size is None:
            return SizeChoice(rule=self.default, note="no size token in model name")
        band = next((b for b in self.bands if b.min_b <= size <= b.max_b), None)
        if band is None:
            return SizeChoice(rule=self.default, note=f"size {size:g}B is outside the size bands")
        return SizeChoice(rule=SizeRule(harbor_config=band.harbor_config, timeout_multiplier=band.timeout_multiplier))


# --------------------------------------------------------------------------- model_registry.yaml


class ServeSettings(CatalogModel):
    """How one model is served and evaluated; every field optional, unset means "not the registry's call"."""

    conda_env: str | None = None
    tensor_parallel_size: PositiveInt | None = None
    data_parallel_size: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None
    timeout_multiplier: PositiveFloat | None = None
    agent_kwargs: tuple[str, ...] | None = None
    harbor_config: str | None = None


class ModelEntry(ServeSettings):
    """A registry entry with per-hardware-profile deltas (e.g. fewer GPUs per replica on gh200)."""

    variants: dict[str, ServeSettings] = Field(default_factory=dict)

    def for_profile(self, profile: str | None) -> ServeSettings:
        """The entry with the hardware profile's variant applied over it (only fields the variant sets)."""
        settings = self.model_dump(exclude={"variants"}, exclude_unset=True)
        variant = self.variants.get(profile) if profile else None
        if variant is not None:
            settings |= variant.model_dump(exclude_unset=True)
        return ServeSettings(**settings)


class ModelRegistry(CatalogModel):
    models: dict[str, ModelEntry] = Field(default_factory=dict)

    def settings(self, model: str, profile: str | None) -> ServeSettings | None:
        entry = self.models.get(model)
        return entry.for_profile(profile) if entry else None


# --------------------------------------------------------------------------- harnesses.yaml


class Harnesses(CatalogModel):
    """Markers of installed-agent harnesses, the ones that need a pinggy tunnel."""

    installed_agent_markers: list[str]
    model_free_agents: list[str] = Field(default_factory=list)

    def needs_pinggy(self, agent: str, harbor_config: str) -> bool:
        """Installed-agent harnesses call the served model back over a tunnel; terminus-2 does not."""
        return any(self._installed_agent.search(name) for name in (_normal(agent), _normal(Path(harbor_config).name)))

    @functools.cached_property
    def _installed_agent(self) -> re.Pattern[str]:
        """Any marker, as a whole word (`(?!)`, matching nothing, when there are none)."""
        markers = "|".join(re.escape(_normal(marker)) for marker in self.installed_agent_markers) or "(?!)"
        return re.compile(rf"(?<![a-z0-9])(?:{markers})(?![a-z0-9])")


def _normal(text: str) -> str:
    return text.lower().replace("_", "-")


# --------------------------------------------------------------------------- failures.yaml


class FailureCatalog(CatalogModel):
    """The failure modes a controller can see in a job's log (REFERENCE §9), first match wins."""

    modes: list[FailureModeSpec] = Field(max_length=FAILURE_MODES_MAX)

    @model_validator(mode="after")
    def _unique(self) -> FailureCatalog:
        seen: set[tuple[str, str]] = set()
        for index, mode in enumerate(self.modes):
            if (mode.name, mode.when) in seen:
                raise entry_error(("modes", index, "name"), "duplicate", "{name} ({when}) is listed twice",
                                  name=mode.name, when=mode.when.value)
            seen.add((mode.name, mode.when))
        return self

    def modes_for(self, cluster_modes: list[FailureModeSpec]) -> tuple[FailureMode, ...]:
        """A cluster's own entries first (a site knows its logs best), then the shipped ones."""
        return tuple(spec.mode() for spec in (*cluster_modes, *self.modes))


# --------------------------------------------------------------------------- the whole catalog


class Catalog(CatalogModel):
    presets: Presets
    error_classes: ErrorClasses
    size_policy: SizePolicy
    models: ModelRegistry
    harnesses: Harnesses
    failures: FailureCatalog


FILES: dict[str, tuple[str, type[Any]]] = {
    "presets.yaml": ("presets", Presets),
    "error_classes.yaml": ("error_classes", ErrorClasses),
    "size_policy.yaml": ("size_policy", SizePolicy),
    "model_registry.yaml": ("models", ModelRegistry),
    "harnesses.yaml": ("harnesses", Harnesses),
    "failures.yaml": ("failures", FailureCatalog),
}


def load_catalog() -> Catalog:
    """The catalog, with `$EVALCTL_CATALOG_DIR` files replacing shipped ones; cached per directory."""
    return _load(os.environ.get(CATALOG_DIR_ENV) or None)


@functools.cache
def _load(override_dir: str | None) -> Catalog:
    parts: dict[str, CatalogModel] = {}
    errors: list[SpecError] = []
    for filename, (field, model) in FILES.items():
        path = Path(override_dir, filename) if override_dir else None
        path = path if path and path.is_file() else SHIPPED_DIR / filename
        documents, read_errors = read_documents(path, str(path))
        errors += read_errors
        if read_errors:
            continue
        if len(documents) != 1:
            errors.append(SpecError(str(path), 1, 1, "a catalog file holds exactly one YAML document"))
            continue
        result = validate(model, documents[0], by_alias=False)
        if isinstance(result, list):
            errors += sorted(result)
        else:
            parts[field] = result
    if errors:
        raise SpecErrors(errors)
    return Catalog.model_validate(parts)
