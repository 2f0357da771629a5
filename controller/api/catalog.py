"""The shipped catalogs (presets, error classes, size policy, model registry, harnesses, failures) as typed data.

Catalog facts change more often than code, so they live in `catalog/*.yaml`. A site can replace
any of those files by putting its own under `$EVALCTL_CATALOG_DIR` (file by file; absent files
fall back to the shipped ones). A broken catalog file is reported like a broken spec.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from controller.api.diagnose import validate
from controller.api.errors import SpecError, SpecErrors
from controller.api.evalcluster import FAILURE_MODES_MAX, FailureModeSpec
from controller.api.fields import PathText, PositiveInt, Short, Walltime, entry_error
from controller.api.yamldoc import Document, Loc, read_documents
from controller.core.gpu_hours import SizeBands, size_in_billions
from controller.core.remedies import FailureMode
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Serving
from controller.core.walltime import SHARDS_MAX

SHIPPED_DIR = Path(__file__).parent / "catalog"
CATALOG_DIR_ENV = "EVALCTL_CATALOG_DIR"

PositiveFloat = Annotated[float, Field(gt=0)]


class CatalogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _bare_file_name(value: str) -> str:
    """The job script looks a config name up in its configs dir (OT-Agent's sbatch prepends ${DCFT}/eval/configs/):
    a path there is doubled, and Harbor's config is not found after vLLM has warmed up (RULES §9)."""
    if "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError("must be a bare file name (e.g. dcagent_eval_config_no_override.yaml), not a path: the job "
                         "script prepends its configs dir, so a path is doubled and Harbor's config is not found "
                         "after vLLM's warm-up; keep only the file name and put the file in that dir")
    return value


BareFileName = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_bare_file_name)]


# --------------------------------------------------------------------------- presets.yaml


class Preset(CatalogModel):
    """A named benchmark; `tasks` × the run's nAttempts = expected trials (None: unknown).

    `config_yaml`: the Harbor config the preset pins (EVAL_CONFIG_YAML, layered over the size rule's harbor config),
    unless the harness brings its scaffold config; `walltime`: its jobs' time limit when it needs more (or less)
    than the cluster's timeLimit, at most the cluster's maxTimeLimit; `auto`: its jobs are sized from what
    attempts alike took (RULES §16) whatever the EvalRun's `walltime`, the cluster's timeLimit until there is
    evidence.
    """

    dataset: str
    n_concurrent: PositiveInt
    tasks: PositiveInt | None = None
    partial_credit: bool | None = Field(None, description="rewards between 0 and 1 are valid; false: only 0 or 1 "
                                                          "(another reward holds the cell); unset: not checked")
    config_yaml: BareFileName | None = None
    walltime: Walltime | Literal["auto"] | None = None
    shards: PositiveInt | None = Field(None, le=SHARDS_MAX, description="run as this many jobs over disjoint task subsets "
                                                                "whatever the EvalRun's shards (RULES §17)")
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


# vLLM flags that have a field of their own: in extraArgs they would escape the checks (a parser on terminus-2).
OWN_FIELD_FLAGS = {
    "--tool-call-parser": "tool_call_parser", "--enable-auto-tool-choice": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser", "--chat-template": "chat_template",
    "--trust-remote-code": "trust_remote_code", "--swap-space": "swap_space", "--enforce-eager": "enforce_eager",
}


def _vllm_flags(value: str) -> str:
    """Shell-quoted flags the job splits as xargs does (quotes kept, nothing expanded)."""
    if any(char in value for char in "$`\n"):
        raise ValueError("holds '$', '`' or a newline: the job script does not expand variables or commands here; "
                         "write the value out")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"is not shell-quoted flags ({exc}); close the quote") from None
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in OWN_FIELD_FLAGS:
            raise ValueError(f"sets {flag}, which has its own field: write `{OWN_FIELD_FLAGS[flag]}` instead (validate "
                             "checks it against the harness)")
    return value


VllmFlags = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_vllm_flags)]


class VllmServing(CatalogModel):
    """vLLM settings of a model; unset means "not the registry's call" (the job script's default, no flag)."""

    tool_call_parser: Short | None = None
    reasoning_parser: Short | None = None
    chat_template: PathText | None = None
    extra_args: VllmFlags | None = None
    trust_remote_code: bool | None = None
    swap_space: PositiveInt | None = None
    enforce_eager: bool | None = None
    max_retries: PositiveInt | None = Field(None, le=1000)


class ModelServing(VllmServing):
    """Settings for every harness pattern, then what one pattern adds or replaces (`patterns`, by pattern name of
    harnesses.yaml): one entry serves terminus-2 without a parser and openhands with its own, no flip-restore."""

    patterns: dict[str, VllmServing] = Field(default_factory=dict)

    def for_pattern(self, pattern: str | None) -> Serving:
        settings = self.model_dump(exclude={"patterns"}, exclude_unset=True)
        if pattern in self.patterns:
            settings |= self.patterns[pattern].model_dump(exclude_unset=True)
        return Serving(pattern=pattern, **{name: value for name, value in settings.items() if value is not None})

    def where(self, pattern: str | None, field: str) -> Loc:
        """Where `field` of the pattern's resolved serving was set, below `serving`."""
        if pattern in self.patterns and field in self.patterns[pattern].model_fields_set:
            return ("patterns", pattern, field)
        return (field,)


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
    serving: ModelServing = Field(default_factory=ModelServing)

    def for_profile(self, profile: str | None) -> ServeSettings:
        """The entry with the hardware profile's variant applied over it (only fields the variant sets)."""
        settings = self.model_dump(exclude={"variants", "serving"}, exclude_unset=True)
        variant = self.variants.get(profile) if profile else None
        if variant is not None:
            settings |= variant.model_dump(exclude_unset=True)
        return ServeSettings(**settings)


class ModelRegistry(CatalogModel):
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    _document: Document | None = PrivateAttr(None)  # the file it was read from, so checks can point at its lines

    def settings(self, model: str, profile: str | None) -> ServeSettings | None:
        entry = self.models.get(model)
        return entry.for_profile(profile) if entry else None

    def serving(self, model: str, pattern: str | None) -> Serving:
        entry = self.models.get(model)
        return entry.serving.for_pattern(pattern) if entry else Serving(pattern=pattern)

    def error(self, model: str, pattern: str | None, field: str, message: str) -> SpecError | None:
        """`message` at the registry line that set `field` of the model's serving for `pattern` (None: no file)."""
        if self._document is None:
            return None
        where = self.models[model].serving.where(pattern, field)
        return self._document.error(("models", model, "serving", *where), message)


# --------------------------------------------------------------------------- harnesses.yaml


class ServingPattern(CatalogModel):
    """A way of serving a model for a kind of scaffold (RULES §10, patterns A-D)."""

    note: str = ""
    client_side_tool_calls: bool = Field(False, description="the agent parses tool calls out of the text itself: a "
                                                            "vLLM tool-call parser hijacks them (a silent 0%)")


class Harness(CatalogModel):
    """What an EvalRun's `agent` means: its serving pattern, the Harbor agent it runs, its scaffold config."""

    pattern: str
    agent: Short | None = Field(None, description="Harbor's agent name (-a), when it is not the harness's own")
    config_yaml: BareFileName | None = None
    reports_tokens: bool = Field(True, description="its trials report token usage; false: the admission gate "
                                                   "judges its traffic by the requests the job's vLLM logged")


class Harnesses(CatalogModel):
    """Harnesses and their serving patterns; markers of installed-agent harnesses (the ones that need a pinggy
    tunnel); agents that call no model."""

    installed_agent_markers: list[str]
    model_free_agents: list[str] = Field(default_factory=list)
    patterns: dict[str, ServingPattern]
    default_pattern: str = Field(description="the pattern of an agent that is not listed under harnesses")
    harnesses: dict[str, Harness]

    @model_validator(mode="after")
    def _patterns_exist(self) -> Harnesses:
        if self.default_pattern not in self.patterns:
            raise entry_error(("default_pattern",), "unknown_pattern", "unknown pattern {name}; known: {known}",
                              name=self.default_pattern, known=", ".join(self.patterns))
        for name, harness in self.harnesses.items():
            if harness.pattern not in self.patterns:
                raise entry_error(("harnesses", name, "pattern"), "unknown_pattern",
                                  "unknown pattern {name}; known: {known}", name=harness.pattern,
                                  known=", ".join(self.patterns))
        return self

    def harness(self, agent: str) -> Harness:
        """The EvalRun agent's harness; an agent not listed runs as itself with the default pattern."""
        return self.harnesses.get(agent) or Harness(pattern=self.default_pattern)

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
    """The failure modes a controller can see in a job's log (RULES §9), first match wins."""

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
    sources: dict[str, Document] = {}
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
            parts[field], sources[field] = result, documents[0]
    if errors:
        raise SpecErrors(errors)
    catalog = Catalog.model_validate(parts)
    catalog.models._document = sources["models"]
    errors += _unknown_patterns(catalog, sources["models"])
    if errors:
        raise SpecErrors(errors)
    return catalog


def _unknown_patterns(catalog: Catalog, registry: Document) -> list[SpecError]:
    """A registry pattern harnesses.yaml does not know would never apply: most likely a typo."""
    known = catalog.harnesses.patterns
    return [registry.error(("models", model, "serving", "patterns", name, "[key]"),
                           f"unknown serving pattern {name}; harnesses.yaml knows {', '.join(known)}")
            for model, entry in catalog.models.models.items() for name in entry.serving.patterns if name not in known]
