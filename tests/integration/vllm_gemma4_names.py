"""Where vLLM 0.21.0 would put each checkpoint tensor of a Gemma 4 model, read from its source.

vLLM cannot be imported here (no CUDA build), so its Gemma 4 loading path is
read from the released wheel with ``ast`` and replayed on names:

1. ``Gemma4ForConditionalGeneration.hf_to_vllm_mapper`` (gemma4_mm.py): the
   prefix map, applied the way ``WeightsMapper._map_name`` does (in order);
2. ``AutoWeightsLoader`` hands ``language_model.*`` to ``Gemma4ForCausalLM``;
   its ``load_weights`` renames with the constant ``name.replace(a, b)``
   calls and the ``re.sub`` of ``_remap_gemma4_expert_weight_name``;
3. ``model.*`` goes to ``Gemma4Model.load_weights``: ``stacked_params_mapping``
   (q/k/v -> qkv_proj, gate/up -> gate_up_proj), then FusedMoE's
   ``make_expert_params_mapping`` (``experts.{e}.gate_proj.`` ->
   ``experts.w13_``, ``down_proj`` -> ``experts.w2_``);
4. the result must be a parameter of the module tree declared in the
   ``__init__`` methods of gemma4.py's classes, where a linear layer under
   ModelOpt NVFP4 has the parameters ``ModelOptNvFp4LinearMethod.create_weights``
   registers and a FusedMoE those of ``ModelOptNvFp4FusedMoE.create_weights``
   (quantization/modelopt.py), a GateLinear (the router) only ``weight``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

LINEAR_CLASSES = {
    "QKVParallelLinear",
    "RowParallelLinear",
    "MergedColumnParallelLinear",
    "ColumnParallelLinear",
    "ReplicatedLinear",
}
WEIGHT_ONLY_CLASSES = {"GateLinear", "RMSNorm", "VocabParallelEmbedding", "ParallelLMHead"}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not found")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{cls.name}.{name} not found")


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else "?"
        return f"{base}.{func.attr}"
    return "?"


def registered_parameters(tree: ast.Module, class_name: str) -> set[str]:
    """First arguments of ``layer.register_parameter("...")`` in ``class_name.create_weights``."""
    names = set()
    for node in ast.walk(_method(_class(tree, class_name), "create_weights")):
        if isinstance(node, ast.Call) and _call_name(node).endswith(".register_parameter"):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
    return names


def init_attributes(tree: ast.Module, class_name: str) -> dict[str, str]:
    """``self.X = Cls(...)`` -> {X: "Cls"}; buffers -> "buffer"; nn.Parameter -> "parameter";
    ``..., self.X = make_layers(n, lambda prefix: Cls(...))`` -> {X: "list:Cls"}; a linear
    layer built without ``quant_config=`` -> "unquantized:Cls"."""
    attrs: dict[str, str] = {}
    for node in ast.walk(_method(_class(tree, class_name), "__init__")):
        if isinstance(node, ast.Call) and _call_name(node) == "self.register_buffer":
            arg = node.args[0]
            if isinstance(arg, ast.Constant):
                attrs[arg.value] = "buffer"
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
        called = _call_name(node.value)
        if called in LINEAR_CLASSES and not any(kw.arg == "quant_config" for kw in node.value.keywords):
            called = "unquantized:" + called  # built without a quantization method
        if called == "make_layers":
            lam = next(a for a in node.value.args if isinstance(a, ast.Lambda))
            called = "list:" + _call_name(lam.body)  # type: ignore[arg-type]
        elif called == "nn.Parameter":
            called = "parameter"
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                # first declaration wins: later ones are the "else: None" branches
                attrs.setdefault(target.attr, called)
    return attrs


def _dict_literal(call: ast.Call, keyword: str) -> dict:
    for kw in call.keywords:
        if kw.arg == keyword:
            return ast.literal_eval(kw.value)
    raise LookupError(keyword)


@dataclass
class Gemma4Loader:
    """The renames and module tree of vLLM's Gemma 4 loader, read from one release's source."""

    mm_prefixes: dict[str, str]
    causal_replaces: list[tuple[str, str]]
    expert_regex: tuple[str, str]
    stacked: list[tuple[str, str, object]]
    moe_param_prefixes: dict[str, str]  # checkpoint proj -> FusedMoE parameter prefix
    linear_params: set[str]
    moe_params: set[str]
    trees: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, vllm_root: Path) -> "Gemma4Loader":
        models = vllm_root / "model_executor" / "models"
        mm = ast.parse((models / "gemma4_mm.py").read_text())
        g4 = ast.parse((models / "gemma4.py").read_text())
        modelopt = ast.parse((vllm_root / "model_executor" / "layers" / "quantization" / "modelopt.py").read_text())
        fused = ast.parse((vllm_root / "model_executor" / "layers" / "fused_moe" / "layer.py").read_text())

        mapper = next(
            node.value
            for node in _class(mm, "Gemma4ForConditionalGeneration").body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "hf_to_vllm_mapper"
        )
        mm_prefixes = _dict_literal(mapper, "orig_to_new_prefix")

        replaces = []
        for node in ast.walk(_method(_class(g4, "Gemma4ForCausalLM"), "load_weights")):
            # only `name = name.replace(a, b)`: renames of every tensor, not the
            # k_eq_v copy yielded beside one (`yield name.replace("k_proj", "v_proj"), ...`)
            if not (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "name"):
                continue
            call = node.value
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "replace"
                and getattr(call.func.value, "id", None) == "name"
                and len(call.args) == 2
                and all(isinstance(a, ast.Constant) for a in call.args)
            ):
                replaces.append((call.args[0].value, call.args[1].value))

        remap = next(
            n for n in g4.body if isinstance(n, ast.FunctionDef) and n.name == "_remap_gemma4_expert_weight_name"
        )
        sub = next(n for n in ast.walk(remap) if isinstance(n, ast.Call) and _call_name(n) == "re.sub")
        expert_regex = (sub.args[0].value, sub.args[1].value)

        load = _method(_class(g4, "Gemma4Model"), "load_weights")
        stacked_node = next(
            n.value
            for n in ast.walk(load)
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "stacked_params_mapping"
        )
        stacked = [tuple(t) for t in ast.literal_eval(stacked_node)]

        # FusedMoE.make_expert_params_mapping: f"experts.{base_layer}w13_" for
        # gate/up, f"experts.{base_layer}w2_" for down (base_layer is "" here).
        mapping_fn = _method(_class(fused, "FusedMoE"), "make_expert_params_mapping")
        pieces = {
            "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            for node in ast.walk(mapping_fn)
            if isinstance(node, ast.JoinedStr)
        }
        assert {"experts.w13_", "experts.w2_"} <= pieces, pieces
        moe_param_prefixes = {"gate_proj": "experts.w13_", "up_proj": "experts.w13_", "down_proj": "experts.w2_"}

        loader = cls(
            mm_prefixes=mm_prefixes,
            causal_replaces=replaces,
            expert_regex=expert_regex,
            stacked=stacked,
            moe_param_prefixes=moe_param_prefixes,
            linear_params=registered_parameters(modelopt, "ModelOptNvFp4LinearMethod"),
            moe_params=registered_parameters(modelopt, "ModelOptNvFp4FusedMoE"),
        )
        for name in ("Gemma4Model", "Gemma4DecoderLayer", "Gemma4Attention", "Gemma4MLP", "Gemma4Router", "Gemma4MoE"):
            loader.trees[name] = init_attributes(g4, name)
        loader.trees["Gemma4MultimodalEmbedder"] = init_attributes(mm, "Gemma4MultimodalEmbedder")
        return loader

    # -------------------------------------------------------------- replay

    def map_mm(self, name: str) -> str:
        for prefix, new in self.mm_prefixes.items():
            if name.startswith(prefix):
                name = name.replace(prefix, new, 1)
        return name

    def to_model_name(self, name: str) -> str | None:
        """Checkpoint name -> the name Gemma4Model.load_weights receives (None: not the language model)."""
        name = self.map_mm(name)
        if not name.startswith("language_model."):
            return None
        name = name[len("language_model.") :]
        for old, new in self.causal_replaces:
            name = name.replace(old, new)
        name = re.sub(self.expert_regex[0], self.expert_regex[1], name)
        if not name.startswith("model."):
            return None
        return name[len("model.") :]

    def to_parameter(self, model_name: str) -> str:
        """Gemma4Model-relative parameter name, as Gemma4Model.load_weights maps it."""
        for param, shard, _ in self.stacked:
            if shard in model_name:
                candidate = model_name.replace(shard, param)
                if self.resolve(candidate):
                    return candidate
        for proj, prefix in self.moe_param_prefixes.items():
            match = re.search(rf"experts\.(\d+)\.{proj}\.", model_name)
            if match:
                return model_name.replace(match.group(0), prefix)
        return model_name

    def resolve(self, name: str, cls: str = "Gemma4Model") -> bool:
        """Is ``name`` a parameter of ``cls``'s module tree (NVFP4 parameters for linear layers)?"""
        parts = name.split(".")
        attrs = self.trees.get(cls, {})
        kind = attrs.get(parts[0])
        if kind is None:
            return False
        rest = parts[1:]
        if kind in ("parameter", "buffer"):
            return not rest
        if kind.startswith("list:"):
            return bool(rest) and rest[0].isdigit() and self.resolve(".".join(rest[1:]), kind[5:])
        if kind in self.trees:
            return bool(rest) and self.resolve(".".join(rest), kind)
        leaf = ".".join(rest)
        if kind.startswith("unquantized:"):
            return leaf == "weight"
        if kind in LINEAR_CLASSES:
            return leaf in self.linear_params
        if kind in WEIGHT_ONLY_CLASSES:
            return leaf == "weight"
        if kind == "FusedMoE":
            return leaf in self.moe_params
        return False
