"""Recipe schema, shipped recipes, and errors that name file, line and field."""

from __future__ import annotations

import re
import json

import pytest

from launcher import recipe as recipes
from launcher.errors import LauncherError

SHIPPED = ["gemma4-moe-dflash", "gemma4-moe-dflash-text", "gemma4-moe", "gemma4-31b-dflash", "gemma4-e4b"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_validate(name):
    rec = recipes.load(name)
    assert rec.name == name
    multi = {"gemma4-moe-dflash", "gemma4-31b-dflash"}  # issue 54: the two-Spark profile
    assert set(rec.profiles) == {"rtx5090", "dgx-spark"} | ({"dgx-spark-x2"} if name in multi else set())
    assert rec.default_profile == "rtx5090"


def test_user_recipe_states_the_user_setup():
    rec = recipes.load("gemma4-moe-dflash")
    assert rec.target.format == "modelopt-nvfp4"
    assert rec.drafter.method == "dflash"
    assert rec.drafter.num_speculative_tokens == 15
    assert rec.drafter.attention_backend == "flash_attn"
    assert rec.drafter.source == "z-lab/gemma-4-26B-A4B-it-DFlash"
    assert "--quantization" not in " ".join(rec.serve.extra_args)


def test_schema_export_is_json_schema():
    schema = json.loads(recipes.schema_json())
    assert schema["type"] == "object"
    assert {"target", "drafter", "intent", "serve", "profiles", "vllm_versions", "patches"} <= set(schema["properties"])


GOOD = """name: x
description: d
target: {name: m}
vllm_versions: ["0.21.0"]
min_gpu_memory_gib: 8
profiles:
  rtx5090: {}
"""


def test_minimal_recipe_parses():
    assert recipes.parse_recipe(GOOD, "x.yaml").name == "x"


def test_yaml_error_names_file_and_line():
    text = GOOD + "serve:\n  max_model_len: [1, 2\n"
    with pytest.raises(LauncherError) as err:
        recipes.parse_recipe(text, "bad.yaml")
    assert err.value.message.startswith("bad.yaml:")
    assert "YAML error" in err.value.message
    line = int(err.value.message.split(":")[1])
    assert line >= 9


def test_schema_error_names_line_and_field_path():
    text = GOOD + "serve:\n  max_num_seqs: 2\n  gpu_memory_utilization: 1.5\n"
    with pytest.raises(LauncherError) as err:
        recipes.parse_recipe(text, "r.yaml")
    assert err.value.message.startswith("r.yaml:10: field serve.gpu_memory_utilization:")


@pytest.mark.parametrize("extra, line, field", [
    ('default_profile: rtx9090\n', 8, "default_profile"),
    ('patches:\n  "0.21.0": []\n  "0.99.0": [x]\n', 10, "patches.0.99.0"),
    ('profiles:\n  rtx5090:\n    serve_since:\n      "0.99.0": {max_num_seqs: 2}\n', 9, "profiles.rtx5090.serve_since.0.99.0"),
])
def test_a_check_over_several_fields_names_the_line_of_the_field_at_fault(extra, line, field):
    """They named line 2 (the recipe's name) and "(top level)"."""
    # a profiles section replaces GOOD's own (lines 6-7); the others follow GOOD's 7 lines
    text = (GOOD.replace("profiles:\n  rtx5090: {}\n", "") if extra.startswith("profiles") else GOOD) + extra
    with pytest.raises(LauncherError) as err:
        recipes.parse_recipe(text, "r.yaml")
    assert err.value.message.startswith(f"r.yaml:{line}: field {field}:"), (text, err.value.message)


def test_unknown_field_is_an_error_with_its_line():
    text = GOOD.replace("target: {name: m}", "target: {name: m}\ntargte: {name: m}")
    with pytest.raises(LauncherError, match=r"r.yaml:4: field targte: Extra inputs are not permitted"):
        recipes.parse_recipe(text, "r.yaml")


def test_unknown_profile_rejected():
    text = GOOD.replace("rtx5090: {}", "rtx4090: {}")
    with pytest.raises(LauncherError, match="unknown hardware profile"):
        recipes.parse_recipe(text, "r.yaml")


def test_unknown_recipe_names_close_matches():
    with pytest.raises(LauncherError) as err:
        recipes.load("gemma4-moe-dflsh")
    assert "gemma4-moe-dflash" in err.value.hint


def test_recipe_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD.replace("name: x", "name: mine"))
    assert recipes.load(str(path)).name == "mine"


@pytest.mark.parametrize("name", ["/etc", "../../etc", "..", ".", "a/b", "a\\b", "C:evil", "", " m"])
@pytest.mark.parametrize("role", ["target", "drafter"])
def test_model_names_are_one_folder_under_models_dir(role, name):
    """Issue 28.3: `name: /etc` and `name: ../../etc` validated, and `models pull` wrote outside $MODELS_DIR."""
    if role == "target":
        text = GOOD.replace("target: {name: m}", f"target: {{name: {json.dumps(name)}}}")
    else:
        text = GOOD + f"drafter: {{name: {json.dumps(name)}, num_speculative_tokens: 4}}\n"
    with pytest.raises(LauncherError, match=rf"field {role}.name: .*(folder name|single folder name)"):
        recipes.parse_recipe(text, "r.yaml")


def test_set_cannot_move_a_model_outside_models_dir():
    rec = recipes.load("gemma4-moe-dflash")
    for dotted in ("target.name", "drafter.name"):
        with pytest.raises(LauncherError, match=rf"--set {dotted}=../../../etc: field {dotted}"):
            recipes.set_field(rec, dotted, "../../../etc")
    assert recipes.set_field(rec, "target.name", "my-own-nvfp4").target.name == "my-own-nvfp4"


def _alias_bomb(depth: int, width: int) -> str:
    lines = ["a0: &a0 [x]"]
    for level in range(1, depth):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return GOOD + "\n".join(lines) + f"\nserve: {{extra_args: *a{depth - 1}}}\n"


def test_line_index_walks_each_alias_once():
    """Issue 28.9: the line index walked every path through nested aliases (width ** depth entries)."""
    import yaml

    small = _alias_bomb(depth=5, width=8)  # 8 ** 4 = 4096 paths through the aliases, 12 distinct nodes
    index = recipes._line_index(yaml.compose(small, Loader=yaml.SafeLoader))
    assert len(index) < 200


def test_a_1kb_alias_bomb_is_a_plain_error():
    bomb = _alias_bomb(depth=10, width=9)
    assert len(bomb.encode()) < 1500
    with pytest.raises(LauncherError, match=r"r.yaml:\d+: field serve.extra_args"):
        recipes.parse_recipe(bomb, "r.yaml")


def test_a_recipe_that_is_not_utf8_is_named_with_its_line(tmp_path):
    """Issue 28.9: a UnicodeDecodeError traceback, from `serve --recipe FILE` and `recipes validate`."""
    from typer.testing import CliRunner

    from launcher.cli import app

    path = tmp_path / "latin1.yaml"
    path.write_bytes(GOOD.replace("description: d", "description: caf\xe9").encode("latin-1"))
    with pytest.raises(LauncherError, match=rf"{path}:2: not UTF-8 text \(byte 0xe9"):
        recipes.load(str(path))
    res = CliRunner().invoke(app, ["recipes", "validate", str(path)])
    assert res.exit_code == 2 and "not UTF-8 text" in res.output
    res = CliRunner().invoke(app, ["serve", "--recipe", str(path), "--dry-run"])
    assert "not UTF-8 text" in res.output and not isinstance(res.exception, UnicodeDecodeError)


# ------------------------------------------------ hostile recipes (issue 55.8, 55.13)


def test_a_duplicate_key_is_refused_with_both_lines():
    text = GOOD + "serve:\n  max_model_len: 4096\n  max_model_len: 8192\n"
    with pytest.raises(LauncherError) as err:
        recipes.parse_recipe(text, "dup.yaml")
    assert err.value.message == "dup.yaml:10: duplicate key 'max_model_len' (first given at line 9)"


def test_a_merge_key_overridden_explicitly_is_not_a_duplicate():
    text = GOOD + "base: &b {max_model_len: 4096}\nserve:\n  <<: *b\n  max_model_len: 8192\n"
    with pytest.raises(LauncherError, match="field base"):  # an unknown field, but no duplicate
        recipes.parse_recipe(text, "m.yaml")


HOSTILE = {
    "nested-deep": GOOD + "serve:\n  extra_args: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "5000-digit-integer": GOOD + "min_gpu_memory_gib_x: " + "9" * 5000 + "\n",
    "5000-digit-string-field": GOOD.replace("description: d", "description: " + "9" * 5000),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_recipes_validate_reports_a_hostile_file_and_goes_on_to_the_next(case, tmp_path):
    """Issue 55.8: RecursionError / ValueError tracebacks, and the files after it were never checked."""
    from typer.testing import CliRunner

    from launcher.cli import app

    bad, good = tmp_path / "bad.yaml", tmp_path / "x.yaml"
    bad.write_text(HOSTILE[case])
    good.write_text(GOOD)
    res = CliRunner().invoke(app, ["recipes", "validate", str(bad), str(good)])
    assert res.exit_code == 2, (res.output, res.exception)  # an escaped exception would exit 1
    assert re.search(rf"error: {re.escape(str(bad))}(:\d+)?: YAML error:", res.output), res.output
    assert f"{good}: ok (x)" in res.output and "1 of 2 recipe file(s) invalid" in res.output


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 100_000 + "]" * 100_000], ids=["5000-digits", "nested-deep"])
def test_a_hostile_set_value_is_one_error(value):
    rec = recipes.parse_recipe(GOOD, "x.yaml")
    with pytest.raises(LauncherError, match="--set serve.max_model_len="):
        recipes.set_field(rec, "serve.max_model_len", value)


def test_a_50_mb_recipe_is_refused_in_well_under_5_seconds(tmp_path):
    """Issue 55.13: 77 s to validate. A recipe is a few kilobytes: one far larger is refused by its size."""
    import time

    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "description_x: |\n" + ("  " + "x" * 98 + "\n") * (50 * 1024 * 1024 // 101))
    start = time.monotonic()
    with pytest.raises(LauncherError, match="a recipe is at most"):
        recipes.load(str(path))
    assert time.monotonic() - start < 5


def test_a_bad_vllm_version_names_the_file_line_and_field(tmp_path):
    """A version string packaging cannot read raised the bare 'not a vLLM version', with no file."""
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace('"0.21.0"', '"../0.21.0"', 1))
    assert GOOD != path.read_text()
    with pytest.raises(LauncherError) as err:
        recipes.load(str(path))
    assert str(path) in err.value.message and "vllm_versions" in err.value.message
    assert "not a vLLM version: '../0.21.0'" in err.value.message
    assert re.search(r"\.yaml:\d+:", err.value.message)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"], ids=["empty", "comment", "empty-document"])
def test_an_empty_recipe_is_one_error_naming_the_file(text, tmp_path):
    """Round four: an empty file was an AttributeError traceback ('NoneType' has no start_mark)."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(LauncherError) as err:
        recipes.load(str(path))
    assert err.value.message.startswith(f"{path}:1: a recipe must be a YAML mapping")


def test_a_5000_digit_integer_names_its_line_and_field(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "serve:\n  max_num_seqs: " + "9" * 5000 + "\n")
    with pytest.raises(LauncherError) as err:
        recipes.load(str(path))
    line = GOOD.count("\n") + 2
    assert err.value.message.startswith(f"{path}:{line}: YAML error: field serve.max_num_seqs: Exceeds the limit")
