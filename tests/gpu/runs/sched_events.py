"""Per-request scheduler events of a small-pool run: which request was preempted, and when.

Diagnosis only, read-only: ``install()`` wraps vLLM V1's ``Scheduler._preempt_request``
and ``Scheduler.schedule`` in this process (the engine core runs here with
VLLM_ENABLE_V1_MULTIPROCESSING=0) and records, per request,

- ``preempted``: at each preemption, the output tokens it had and its computed tokens;
- ``unscheduled``: the steps in which it was running but got no tokens (it leaves the
  worker's persistent batch and re-enters it later, as a resumed request does);
- ``first_steps``: its first FIRST_STEPS scheduled steps (step, tokens scheduled, tokens
  computed before): how its prefill was chunked and what its first decode steps were. The
  small-pool divergences part from the reference within the first decode steps.

The engine's counters give only the number of preemptions; a divergence in a small
pool is judged by whether its request was preempted, and before which position.
Requests map to prompts by their prompt token ids.
"""

from __future__ import annotations

FIRST_STEPS = 8


class SchedEvents:
    def __init__(self) -> None:
        self.group: str | None = None
        self.step = 0
        self.by_request: dict[str, dict] = {}

    def _entry(self, request) -> dict:
        entry = self.by_request.get(request.request_id)
        if entry is None:  # once a request: scheduled() calls this for every request every step
            entry = self.by_request[request.request_id] = {
                "group": self.group, "prompt": list(request.prompt_token_ids or []),
                "preempted": [], "unscheduled": [], "first_steps": []}
        return entry

    def preempted(self, request) -> None:
        self._entry(request)["preempted"].append({
            "step": self.step, "output_tokens": request.num_output_tokens,
            "computed_tokens": request.num_computed_tokens,
            "in_flight_tokens": getattr(request, "num_in_flight_tokens", None)})

    def scheduled(self, running: list, scheduled: dict) -> None:
        """After Scheduler.schedule: ``scheduled`` maps request ids to their tokens this step;
        num_computed_tokens already counts them (the scheduler advanced it)."""
        self.step += 1
        for request in running:
            if request.request_id not in scheduled:
                self._entry(request)["unscheduled"].append(
                    {"step": self.step, "output_tokens": request.num_output_tokens})
                continue
            first = self._entry(request)["first_steps"]
            if len(first) < FIRST_STEPS:
                n = scheduled[request.request_id]
                first.append([self.step, n, request.num_computed_tokens - n])

    def summary(self, prompts: list[list[int]]) -> list[dict]:
        """One row per request: its group, prompt index and events."""
        index = {tuple(p): i for i, p in enumerate(prompts)}
        return [{"group": e["group"], "prompt": index.get(tuple(e["prompt"])), "preempted": e["preempted"],
                 "unscheduled": e["unscheduled"], "first_steps": e["first_steps"]}
                for e in self.by_request.values()]


def install() -> SchedEvents:
    from vllm.v1.core.sched.scheduler import Scheduler

    events = SchedEvents()
    preempt, schedule = Scheduler._preempt_request, Scheduler.schedule

    def _preempt_request(self, request, *args, **kwargs):
        events.preempted(request)
        return preempt(self, request, *args, **kwargs)

    def _schedule(self, *args, **kwargs):
        out = schedule(self, *args, **kwargs)
        events.scheduled(list(self.running), out.num_scheduled_tokens)
        return out

    Scheduler._preempt_request, Scheduler.schedule = _preempt_request, _schedule
    return events
