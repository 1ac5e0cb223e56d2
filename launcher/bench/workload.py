"""A recipe's ``bench:`` section made concrete: which runs, with which prompts.

Random prompts are token ids (as vLLM's own random dataset makes them), so
the input length is exact without a tokenizer on this side; the prompt set
is ``prompts.jsonl`` next to this file, in the ``{"prompt": ...}`` format
that ``vllm bench serve --dataset-name custom`` reads.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.recipe import BenchWorkload, Recipe

PROMPTS_FILE = Path(__file__).with_name("prompts.jsonl")
# Token ids for random prompts stay in a band every target here has in its
# vocabulary and that holds no special tokens (Gemma 4: 262144 ids).
RANDOM_TOKEN_RANGE = (1000, 30000)


@dataclass(frozen=True)
class Run:
    """One measured level: a workload at one concurrency."""

    workload: BenchWorkload
    concurrency: int
    num_prompts: int

    @property
    def key(self) -> str:
        return f"{self.workload.name}@{self.concurrency}"


def profile_of(rec: Recipe, profile: str | None) -> str:
    """The profile a run is for: the one asked for, else the recipe's default; refused if unknown."""
    name = profile or rec.default_profile
    if name not in rec.profiles:
        raise LauncherError(f"recipe {rec.name} has no profile {name!r}", hint=f"it has: {', '.join(rec.profiles)}")
    return name


def max_concurrency(rec: Recipe, profile: str | None) -> tuple[int, str]:
    """The profile's max_num_seqs (the server's own batch limit), and the profile used."""
    name = profile_of(rec, profile)
    value = rec.profiles[name].serve.max_num_seqs or rec.serve.max_num_seqs
    if value is None:
        raise LauncherError(f"recipe {rec.name}: profile {name} sets no max_num_seqs for concurrency 'max'")
    return value, name


def parse_levels(text: str) -> list[int | str]:
    """``--concurrency 1,4,16,max``: positive integers or ``max`` (the profile's max_num_seqs)."""
    levels: list[int | str] = []
    for item in (x.strip() for x in text.split(",")):
        if item == "max":
            levels.append(item)
        elif item.isascii() and item.isdigit() and int(item) > 0:
            levels.append(int(item))
        else:
            raise LauncherError(f"--concurrency {text!r}: {item!r} is not a positive integer or 'max'",
                                hint="e.g. --concurrency 1,4,16,max")
    return levels


def runs(rec: Recipe, *, profile: str | None, only: list[str] | None,
         levels: list[int | str] | None = None, min_requests: int | None = None,
         output_len: int | None = None) -> list[Run]:
    """The measured levels: each workload at its own concurrency list, or at ``levels`` for all.
    Each level sends ``concurrency x prompts_per_stream`` requests, or ``min_requests`` where that
    is more: at concurrency 1 the recipe's 4 requests let one slow first request move the mean.
    ``output_len``: every workload's output length instead of its own (--output-len)."""
    known = [w.name for w in rec.bench.workloads]
    unknown = sorted(set(only or []) - set(known))
    if unknown:
        raise LauncherError(f"recipe {rec.name} has no bench workload {', '.join(unknown)}", hint=f"it has: {', '.join(known)}")
    profile_of(rec, profile)
    out: list[Run] = []
    for w in rec.bench.workloads:
        if only and w.name not in only:
            continue
        if output_len is not None:
            w = w.model_copy(update={"output_len": output_len})
        asked = levels or w.concurrency
        # 'max' needs the profile's max_num_seqs; levels given as numbers do not
        top = max_concurrency(rec, profile)[0] if "max" in asked else None
        wanted = sorted({top if c == "max" else c for c in asked})
        out += [Run(w, c, max(c * w.prompts_per_stream, min_requests or 0)) for c in wanted]
    return out


def prompts(run: Run, seed: int, vocab_size: int | None = None,
            source: list[str | list[int]] | None = None) -> list[str | list[int]]:
    """The run's prompts: token-id lists (random) or the prompt set, cycled: ``source`` (a
    --prompts-file) where given, else the bundled one. ``vocab_size``: the served model's, when
    known (random ids then stay inside it)."""
    if run.workload.dataset == "random":
        rng = random.Random(f"{seed}:{run.key}")
        low, high = token_band(vocab_size)
        return [[rng.randrange(low, high) for _ in range(run.workload.input_len)] for _ in range(run.num_prompts)]
    texts = source if source is not None else bundled_prompts()
    return [texts[i % len(texts)] for i in range(run.num_prompts)]


def load_prompts_file(path: Path) -> list[str | list[int]]:
    """``--prompts-file``: the prompt set of the ``prompts`` workloads, one JSON object a line
    in the bundled set's format, ``{"prompt": TEXT}``, or ``{"prompt": [TOKEN_ID, ...]}`` for
    prompts that must reach the model exactly as given (no tokenizer on the way). Each problem
    names the file and line: a run takes minutes, and a bad line found at request time would
    have spent them."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise LauncherError(f"--prompts-file {path}: cannot be read ({exc})") from None
    out: list[str | list[int]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--prompts-file {path}, line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise LauncherError(f"{where}: not JSON ({exc})",
                                hint='one object a line: {"prompt": "text"} or {"prompt": [1, 2, 3]}') from None
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if isinstance(prompt, str) and prompt.strip():
            out.append(prompt)
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)):
            out.append(prompt)
        else:
            raise LauncherError(f"{where}: \"prompt\" must be a non-empty text or a non-empty list of token ids "
                                f"(integers >= 0), not {json.dumps(prompt)[:60]}")
    if not out:
        raise LauncherError(f"--prompts-file {path}: no prompts in it")
    return out


def bundled_prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def token_band(vocab_size: int | None) -> tuple[int, int]:
    """Where random token ids come from: RANDOM_TOKEN_RANGE, cut to a smaller vocabulary.

    vLLM refuses a prompt holding an id past the model's vocabulary ("Token id ... is
    out of vocabulary"), so a small model (the GPU harness's trained target has 8,192
    ids) needs the band cut; the lower end stays above the special tokens where the
    vocabulary leaves room."""
    low, high = RANDOM_TOKEN_RANGE
    if vocab_size is None or vocab_size >= high:
        return low, high
    if vocab_size > 2 * low:
        return low, vocab_size
    return vocab_size // 2, vocab_size


def vocab_size(folder: str | Path | None) -> int | None:
    """The vocabulary of a local model folder (its config.json, text_config first); None when unknown."""
    if not folder:
        return None
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for block in (config.get("text_config"), config):
        value = block.get("vocab_size") if isinstance(block, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None
