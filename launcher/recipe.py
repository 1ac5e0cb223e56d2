"""Recipes: one YAML file per served setup, validated at the edge.

A recipe states intent (which model, which drafter, which kernels) rather
than env vars, because the env vars and flags that express that intent
changed between vLLM releases (see ``launcher.vllm_compat``). Errors name the
file, the line and the field.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from launcher import passthrough
from launcher.errors import LauncherError
from launcher.paths import recipes_dir
from launcher.profiles import PROFILES

ModelFormat = Literal["modelopt-nvfp4", "compressed-tensors", "bf16"]
MoeBackend = Literal[
    "auto", "cutlass", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl", "marlin", "triton", "emulation",
    "b12x", "flashinfer_b12x",
]
GemmBackend = Literal["auto", "cutlass", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cudnn", "marlin", "emulation"]
AttentionBackend = Literal["flash_attn", "triton_attn", "flex_attention", "flashinfer"]
# The target's backend per KV cache group kind (vLLM's AttentionConfig.backend_per_kind).
KvGroupKind = Literal["sliding_window", "full_attention"]
TargetAttentionBackend = Literal["flash_attn", "triton_attn", "flashinfer", "b12x"]



class FieldProblem(ValueError):
    """A model-level check's finding that belongs to one field: the error then names that
    field and its line, not the recipe's first line and "(top level)"."""

    def __init__(self, loc: tuple, message: str) -> None:
        super().__init__(message)
        self.loc = loc

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# What `launcher models pull` fetches by default: what vLLM reads to serve
# (configs, weights, tokenizer, chat template), not READMEs or images.
DEFAULT_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]


class HubSource(_Strict):
    """Where ``launcher models pull`` fetches a model: a Hugging Face repo at a revision.

    A 40-hex commit pins the exact files. Where no public material
    establishes a commit, a branch may be named, but only with
    ``unverified: true``: ``models pull`` then resolves it and prints the
    commit it got, so the user sees that the download is not reproducible.
    ``evidence`` records where the repo, revision and size facts came from.
    """

    repo: str
    revision: str
    unverified: bool = False
    approx_size_bytes: Annotated[int, Field(gt=0)] | None = None
    allow_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOW_PATTERNS), min_length=1)
    evidence: list[str] = Field(default_factory=list)

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not _REPO_ID.match(value) or ".." in value:
            raise ValueError(f"{value!r} is not a Hugging Face repo id (owner/name)")
        return value

    @model_validator(mode="after")
    def _pinned_or_marked(self) -> "HubSource":
        if not self.revision.strip():
            raise ValueError("revision is empty")
        if not COMMIT.match(self.revision) and not self.unverified:
            raise ValueError(
                f"revision {self.revision!r} is not a 40-hex commit; pin a commit, or mark the branch with unverified: true"
            )
        return self

    @property
    def pinned(self) -> bool:
        return bool(COMMIT.match(self.revision))


def folder_name(value: str) -> str:
    """A model's folder under ``$MODELS_DIR``: one path component, never a path.

    ``models pull`` writes into ``$MODELS_DIR/<name>`` and ``serve`` reads it:
    ``/etc`` or ``../../etc`` would point both outside the models folder.
    """
    if value in ("", ".", "..") or value != value.strip():
        raise ValueError(f"{value!r} is not a folder name")
    bad = sorted({c for c in value if c in '/\\:' or ord(c) < 32})
    if bad:
        raise ValueError(f"{value!r} is not a single folder name under $MODELS_DIR (it holds {' '.join(map(repr, bad))}); "
                         "use --model / --drafter to point at a folder elsewhere")
    return value


class ModelRef(_Strict):
    """The target model: a folder under the models dir, and where it comes from.

    ``name`` is the folder under ``$MODELS_DIR`` (``--model`` overrides the
    whole path); ``source`` documents where it comes from in words, ``hub``
    is what ``launcher models pull`` downloads into that folder.
    """

    name: str
    source: str | None = None
    hub: HubSource | None = None
    format: ModelFormat = "bf16"
    served_names: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _one_folder(cls, value: str) -> str:
        return folder_name(value)


class Drafter(_Strict):
    """A speculative drafter. DFlash proposes ``num_speculative_tokens`` per
    step; ``attention_backend`` is the drafter's own backend: on sm_12x the
    target is locked to TRITON_ATTN, the drafter can run FLASH_ATTN."""

    name: str
    source: str | None = None
    hub: HubSource | None = None
    method: Literal["dflash", "eagle3", "mtp"] = "dflash"
    num_speculative_tokens: Annotated[int, Field(ge=1, le=64)]
    attention_backend: AttentionBackend | None = None

    @field_validator("name")
    @classmethod
    def _one_folder(cls, value: str) -> str:
        return folder_name(value)


class Intent(_Strict):
    """Kernel choices as intent, rendered for the vLLM that runs (launcher.vllm_compat.render_intent)."""

    moe_fp4_backend: MoeBackend = "auto"
    nvfp4_gemm_backend: GemmBackend = "auto"
    force_fp8_marlin: bool | None = None
    sampler: Literal["auto", "flashinfer", "pytorch"] = "auto"
    allow_long_max_model_len: bool = False
    # The target's attention backend per KV cache group kind. Gemma 4's sliding
    # layers (head_dim 256) can leave the TRITON_ATTN lock when no multimodal
    # prefix can arise; its full layers (512) cannot take FA2 or B12X. Rendered
    # as vLLM's own backend_per_kind where it exists (launcher.vllm_compat).
    attention_per_kind: dict[KvGroupKind, TargetAttentionBackend] = Field(default_factory=dict)


class ServeArgs(_Strict):
    """vLLM engine/server arguments the recipe sets (None: vLLM's default)."""

    max_model_len: Annotated[int, Field(ge=256)] | None = None
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # Largest CUDA-graph batch in tokens (None: vLLM's default). A speculative
    # decode step takes max_num_seqs x (1 + draft tokens) tokens; see
    # vllm_compat.cudagraph_decode_cover for the default that may fall short.
    max_cudagraph_capture_size: Annotated[int, Field(ge=1)] | None = None
    enable_chunked_prefill: bool = False
    enable_prefix_caching: bool = False
    trust_remote_code: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    enforce_eager: bool = False
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("extra_args")
    @classmethod
    def _no_flag_the_plan_renders(cls, v: list[str]) -> list[str]:
        for group in passthrough.groups(v):
            flag = passthrough.name(group)
            why = passthrough.owned_by_plan(flag) if flag else None
            if why:
                raise ValueError(f"{flag} is rendered by the plan, not passed through: {why}")
        return v


class ServeOverride(_Strict):
    """The serve settings a hardware profile may change."""

    max_model_len: Annotated[int, Field(ge=256)] | None = None
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_cudagraph_capture_size: Annotated[int, Field(ge=1)] | None = None


# A network interface name as Linux spells it (IFNAMSIZ: at most 15 characters).
IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")


class Cluster(_Strict):
    """How a multi-node profile spreads the model over its nodes (launcher.multinode).

    ``tensor_parallel`` x ``pipeline_parallel`` x ``data_parallel`` GPUs in
    all, one per node on these machines; vLLM requires the product to be a
    multiple of the node count. ``socket_ifname`` is the interface NCCL, Gloo
    and UCX talk over (the QSFP port the cable is in); ``launcher serve
    --ifname`` overrides it.
    """

    tensor_parallel: Annotated[int, Field(ge=1)] = 1
    pipeline_parallel: Annotated[int, Field(ge=1)] = 1
    data_parallel: Annotated[int, Field(ge=1)] = 1
    socket_ifname: str
    note: str | None = None

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, value: str) -> str:
        if not IFNAME.match(value):
            raise ValueError(f"{value!r} is not a network interface name (letters, digits, _.:-, at most 15)")
        return value

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


class Override(_Strict):
    serve: ServeOverride = Field(default_factory=ServeOverride)
    # Serve settings measured to differ from a vLLM release on: {release: settings}. The newest
    # release at or below the one that runs replaces the profile's own values (a --set still
    # wins). Why: the same card holds a different KV cache under another release (its drafter's
    # KV layout and activation peak), so a context that starts on one fails on the next.
    serve_since: dict[str, ServeOverride] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # Multi-node profiles only (PROFILES[name].nodes > 1): required there, refused elsewhere.
    cluster: Cluster | None = None
    note: str | None = None


class BenchWorkload(_Strict):
    """One workload of ``launcher bench``.

    ``random`` sends random prompts of about ``input_len`` tokens;
    ``prompts`` sends the small bundled prompt set (real questions, so a
    drafter's acceptance is not judged on noise). Each concurrency level
    sends ``concurrency x prompts_per_stream`` requests so every stream stays
    busy; ``max`` means the profile's ``max_num_seqs``.
    """

    name: str
    dataset: Literal["random", "prompts"] = "random"
    input_len: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    output_len: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    # Checked below rather than typed as a union, so errors name the field itself.
    concurrency: list[int | str] = Field(default_factory=lambda: [1, "max"], min_length=1)
    prompts_per_stream: Annotated[int, Field(ge=1, le=10_000)] = 4

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list) -> list:
        for level in value:
            if level != "max" and not (isinstance(level, int) and level >= 1):
                raise ValueError(f"concurrency levels are integers >= 1 or 'max', not {level!r}")
        if len(set(value)) != len(value):
            raise ValueError(f"concurrency levels repeat: {value}")
        return value


class Bench(_Strict):
    """The recipe's benchmark: its workloads and sampling (greedy by default,
    so runs with and without the drafter produce comparable outputs)."""

    workloads: list[BenchWorkload] = Field(
        default_factory=lambda: [BenchWorkload(name="random"), BenchWorkload(name="prompts", dataset="prompts")],
        min_length=1,
    )
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0
    seed: int = 0
    ignore_eos: bool = True

    @field_validator("workloads")
    @classmethod
    def _unique_names(cls, value: list[BenchWorkload]) -> list[BenchWorkload]:
        names = [w.name for w in value]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names repeat: {names}")
        return value


class Recipe(_Strict):
    """One served setup."""

    name: str
    description: str
    target: ModelRef
    drafter: Drafter | None = None
    intent: Intent = Field(default_factory=Intent)
    env: dict[str, str] = Field(default_factory=dict)
    serve: ServeArgs = Field(default_factory=ServeArgs)
    vllm_versions: list[str] = Field(min_length=1)
    # Patch ids this recipe needs, per vLLM version: a later release may carry
    # a fix upstream, so the same recipe needs fewer patches there.
    patches: dict[str, list[str]] = Field(default_factory=dict)
    min_gpu_memory_gib: Annotated[float, Field(gt=0)]
    default_profile: str = "rtx5090"
    profiles: dict[str, Override] = Field(min_length=1)
    wsl: Override = Field(default_factory=Override)
    bench: Bench = Field(default_factory=Bench)

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, value: dict[str, Override]) -> dict[str, Override]:
        unknown = sorted(set(value) - set(PROFILES))
        if unknown:
            raise ValueError(f"unknown hardware profile(s) {unknown}; known: {sorted(PROFILES)}")
        for name, override in value.items():
            nodes = PROFILES[name].nodes
            if nodes > 1 and override.cluster is None:
                raise ValueError(f"profile {name} spans {nodes} nodes: it needs a cluster section "
                                 "(tensor_parallel, pipeline_parallel, data_parallel, socket_ifname)")
            if nodes == 1 and override.cluster is not None:
                raise ValueError(f"profile {name} is one machine: a cluster section belongs to a multi-node profile")
            if override.cluster is not None and override.cluster.world_size % nodes:
                raise ValueError(f"profile {name}: tensor_parallel x pipeline_parallel x data_parallel = "
                                 f"{override.cluster.world_size} GPUs is not a multiple of its {nodes} nodes "
                                 "(vLLM's --nnodes must divide the world size)")
        return value

    @field_validator("vllm_versions")
    @classmethod
    def _versions(cls, value: list[str]) -> list[str]:
        from launcher.vllm_compat import parse_version

        for v in value:
            try:
                parse_version(v)
            except LauncherError as exc:  # a ValueError here: pydantic names the file, line and field
                raise ValueError(exc.message) from None
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.replace("_", "").isalnum() or not key.isupper():
                raise ValueError(f"{key!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _default_profile_listed(self) -> "Recipe":
        if self.default_profile not in self.profiles:
            raise FieldProblem(("default_profile",), f"default_profile {self.default_profile!r} is not among "
                               f"profiles {sorted(self.profiles)}")
        if PROFILES[self.default_profile].nodes > 1:
            raise FieldProblem(("default_profile",), f"default_profile {self.default_profile!r} spans several "
                               "machines; a multi-node profile is chosen with --nnodes, never by default")
        return self

    @model_validator(mode="after")
    def _patches_per_supported_version(self) -> "Recipe":
        extra = sorted(set(self.patches) - set(self.vllm_versions))
        if extra:
            raise FieldProblem(("patches", extra[0]), f"patches lists versions {extra} that are not in "
                               f"vllm_versions {self.vllm_versions}")
        return self

    @model_validator(mode="after")
    def _serve_since_per_supported_version(self) -> "Recipe":
        for name, override in self.profiles.items():
            extra = sorted(set(override.serve_since) - set(self.vllm_versions))
            if extra:
                raise FieldProblem(("profiles", name, "serve_since", extra[0]),
                                   f"profiles.{name}.serve_since lists versions {extra} that are not in "
                                   f"vllm_versions {self.vllm_versions}")
        return self

    def serve_since(self, profile: str, version) -> tuple[str, dict] | None:
        """(release, settings) of ``profile``'s ``serve_since`` entry that applies to ``version``:
        the newest release at or below it; None where none does."""
        from launcher.vllm_compat import parse_version

        entries = self.profiles[profile].serve_since
        wanted = parse_version(str(version))
        applies = [key for key in entries if parse_version(key) <= wanted]
        if not applies:
            return None
        since = max(applies, key=parse_version)
        return since, entries[since].model_dump(exclude_none=True)

    def patches_for(self, version: str) -> list[str]:
        from launcher.vllm_compat import parse_version

        wanted = parse_version(version)
        for key, ids in self.patches.items():
            if parse_version(key) == wanted:
                return ids
        return []


class SharedModel(_Strict):
    """A folder under ``$MODELS_DIR`` and where its files come from.

    Kept apart from the recipes because several recipes serve one folder
    (with and without the drafter, text only): were each to state its own
    source, ``models list``, ``models pull`` and ``doctor`` would answer for
    the same folder differently depending on the recipe asked.
    """

    source: str | None = None
    hub: HubSource | None = None
    format: ModelFormat | None = None  # a target's; a drafter has none


class SharedModels(_Strict):
    models: dict[str, SharedModel] = Field(default_factory=dict)


SHARED_MODELS = ("shared", "models.yaml")


def shared_models() -> dict[str, SharedModel]:
    """The shipped model entries by folder name (empty where the file is absent)."""
    path = recipes_dir().joinpath(*SHARED_MODELS)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return _parse_shared(text, str(path))


_shared_cache: dict[tuple[str, str], dict[str, SharedModel]] = {}


def _parse_shared(text: str, source: str) -> dict[str, SharedModel]:
    key = (source, text)
    if key not in _shared_cache:
        try:
            _shared_cache[key] = SharedModels.model_validate(yaml.safe_load(text) or {}).models
        except (yaml.YAMLError, ValidationError) as exc:
            raise LauncherError(f"{source}: invalid shared model entries: {exc}") from None
    return _shared_cache[key]


def _share_model_entries(data: dict) -> None:
    """Fill each model of ``data`` that leaves out its source, hub or format from its shared entry.

    Done on the raw mapping, before validation, so that an omitted field
    takes the shared value. A value the recipe writes out wins: a user's
    recipe may point a folder at a mirror or another revision (the shipped
    recipes write none; tests/unit/test_recipe_hub_bench.py checks).
    """
    catalog = shared_models()
    for role in ("target", "drafter"):
        ref = data.get(role)
        entry = catalog.get(ref.get("name")) if isinstance(ref, dict) and isinstance(ref.get("name"), str) else None
        if entry is None:
            continue
        for key in ("source", "hub") + (("format",) if role == "target" else ()):
            shared = getattr(entry, key)
            if shared is not None and ref.get(key) is None:
                ref[key] = shared.model_dump() if isinstance(shared, BaseModel) else shared


def schema_json() -> str:
    return json.dumps(Recipe.model_json_schema(), indent=2)


# --- loading -----------------------------------------------------------------


def _line_index(node: yaml.Node, path: tuple = (), out: dict | None = None, seen: set | None = None) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line.

    An alias is the node it names, so each node is walked once: walking
    every path through nested aliases (a "billion laughs" recipe of 1 KB)
    grows exponentially. Paths below a repeated alias take its parent's line.
    """
    out = {} if out is None else out
    seen = set() if seen is None else seen
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:
        return out
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value,)
            out[sub] = key.start_mark.line + 1
            _line_index(value, sub, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, path + (i,), out, seen)
    return out


def _refuse_duplicate_keys(node: yaml.Node | None, source: str) -> None:
    """A key given twice in one mapping: YAML keeps the last silently, so a setting is lost unseen.

    Walks each node once (aliases included, as :func:`_line_index` does) and
    iteratively, so a deeply nested document costs no recursion here.
    """
    stack, seen = [node] if node is not None else [], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in first:
                        raise LauncherError(f"{source}:{line}: duplicate key {key.value!r} "
                                            f"(first given at line {first[key.value]})",
                                            hint="YAML would keep only the last one: remove one of them")
                    first[key.value] = line
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)


def _long_number(node) -> tuple[str, str]:
    """(":LINE", "field F: ") of the first integer too long for Python to convert, else ("", "")."""
    stack = [((), node)]
    seen: set[int] = set()
    while stack:
        path, current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.ScalarNode):
            digits = current.value.lstrip("+-").replace("_", "")
            if len(digits) > 4000 and digits.isdigit():
                return f":{current.start_mark.line + 1}", (f"field {'.'.join(map(str, path))}: " if path else "")
        elif isinstance(current, yaml.MappingNode):
            stack.extend(((*path, k.value), v) for k, v in reversed(current.value))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(current.value))))
    return "", ""


def _line_for(lines: dict[tuple, int], loc: tuple) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


#: A recipe is a few kilobytes; far larger is a mistake (or an attack) that YAML would take minutes to read.
MAX_RECIPE_BYTES = 1 << 20


def parse_recipe(text: str, source: str) -> Recipe:
    """Validate a recipe's YAML text; ``source`` names the file in errors."""
    if len(text) > MAX_RECIPE_BYTES:
        raise LauncherError(f"{source}: {len(text):,} characters; a recipe is at most {MAX_RECIPE_BYTES:,}",
                            hint="a recipe is a few kilobytes of YAML: is this the right file?")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:  # an empty file, or only comments
            raise LauncherError(f"{source}:1: a recipe must be a YAML mapping; the file is empty")
        _refuse_duplicate_keys(node, source)
        data = yaml.safe_load(text)
        lines = _line_index(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise LauncherError(f"{where}: YAML error: {problem}") from None
    except RecursionError:
        raise LauncherError(f"{source}: YAML error: nested too deep for a recipe") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        where, field = _long_number(node)
        raise LauncherError(f"{source}{where}: YAML error: {field}{str(exc).split(';')[0]}") from None
    if not isinstance(data, dict):
        raise LauncherError(f"{source}:1: a recipe must be a YAML mapping")
    _share_model_entries(data)
    try:
        return Recipe.model_validate(data)
    except RecursionError:
        raise LauncherError(f"{source}: a value is nested too deep for a recipe") from None
    except ValidationError as exc:
        # Every problem at once, each with its line: fixing one per run is slow.
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            found = (err.get("ctx") or {}).get("error")
            if isinstance(found, FieldProblem):
                loc = loc + found.loc  # a check over several fields names the one at fault
            field = ".".join(str(p) for p in loc) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{source}:{_line_for(lines, loc)}: field {field}: {msg}")
        raise LauncherError("\n".join(problems)) from None


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean X?)`` for the closest of ``choices``, or nothing where none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def patch_id_problems(recipe: Recipe, text: str, source: str, known: Callable[[str], set[str]]) -> list[str]:
    """Patch ids the recipe lists that the series for that vLLM version lacks, each with its line.

    ``known(version)`` returns the series' patch ids (injected: recipes do
    not depend on the patch engine); a LauncherError from it (no series) is
    a problem too.
    """
    lines = _line_index(yaml.compose(text, Loader=yaml.SafeLoader)) if recipe.patches else {}
    problems = []
    for version, ids in recipe.patches.items():
        try:
            have = known(version)
        except LauncherError as exc:
            problems.append(f"{source}:{_line_for(lines, ('patches', version))}: field patches.{version}: {exc.message}")
            continue
        for i, pid in enumerate(ids):
            if pid not in have:
                problems.append(f"{source}:{_line_for(lines, ('patches', version, i))}: field patches.{version}.{i}: "
                                f"{pid!r} is not a patch of the vLLM {version} series{did_you_mean(pid, have)}")
    return problems


def load_file(path: Path) -> Recipe:
    try:
        text = read_text(path)
    except OSError as exc:
        raise LauncherError(f"cannot read recipe {path}: {exc.strerror}") from None
    return parse_recipe(text, str(path))


def read_text(path: Path) -> str:
    """A recipe file's text; one that is not UTF-8 is a LauncherError naming its line (OSError passes)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LauncherError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})",
                            hint="save the recipe as UTF-8") from None


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.yaml"))}


def load(name: str) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    candidate = Path(name).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in name or os.sep in name:
        if not candidate.is_file():
            raise LauncherError(f"recipe file {name} not found" if not candidate.exists() else f"{name} is not a file",
                                hint=f"shipped recipes are named without a path: {', '.join(available())}")
        return load_file(candidate)
    recipes = available()
    if name not in recipes:
        close = difflib.get_close_matches(name, list(recipes), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"available: {', '.join(recipes)}"
        raise LauncherError(f"unknown recipe {name!r}", hint=hint)
    recipe = load_file(recipes[name])
    if recipe.name != name:
        raise LauncherError(f"{recipes[name]}:1: field name: {recipe.name!r} does not match the file name {name!r}")
    return recipe


def set_field(recipe: Recipe, dotted: str, raw: str) -> Recipe:
    """Return a copy of ``recipe`` with ``dotted`` (e.g. serve.max_model_len) set
    from a ``--set`` value.

    The value is read as YAML (so 0.9, true and [a, b] work), and taken as
    the literal string where the YAML reading does not fit the field: a
    string field keeps ``0.10`` and ``no`` as typed. An empty value is
    refused rather than silently dropping the setting; ``null`` says "vLLM's
    default" on purpose.
    """
    if raw == "":
        raise LauncherError(f"--set {dotted}=: empty value", hint=_null_means(dotted))
    data: dict[str, Any] = recipe.model_dump()
    parts = dotted.split(".")
    cursor: Any = data
    for part in parts[:-1]:
        if not isinstance(cursor, dict) or part not in cursor or cursor[part] is None and part != parts[-2]:
            raise LauncherError(f"--set {dotted}: no recipe field {part!r}")
        if cursor[part] is None:
            cursor[part] = {}
        cursor = cursor[part]
    if not isinstance(cursor, dict) or (parts[-1] not in cursor and not _is_mapping_field(parts)):
        raise LauncherError(f"--set {dotted}: no recipe field {dotted!r}")
    try:
        parsed = yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError, RecursionError):  # not YAML, or not one Python can hold: the literal text
        parsed = raw
    errors = []
    for value in ([parsed] if parsed == raw else [parsed, raw]):
        cursor[parts[-1]] = value
        try:
            return Recipe.model_validate(data)
        except ValidationError as exc:
            errors.append(exc.errors()[0])
    field = ".".join(str(p) for p in errors[0]["loc"])
    raise LauncherError(f"--set {dotted}={raw}: field {field}: {errors[0]['msg'].removeprefix('Value error, ')}")


def _null_means(dotted: str) -> str:
    """The hint for an empty ``--set`` value: an empty value reads like "off",
    so the hint spells what ``null`` does for that field."""
    if dotted == "drafter":
        return "--set drafter=null serves without the drafter"
    return f"give a value, or --set {dotted}=null for vLLM's own default"


# Fields that are maps: --set may add a key to them (the schema still checks it).
_MAPPING_FIELDS = ("env", "attention_per_kind")


def _is_mapping_field(parts: list[str]) -> bool:
    # env.*, profiles.<p>.env.* and intent.attention_per_kind.* take new keys
    return len(parts) >= 2 and parts[-2] in _MAPPING_FIELDS
