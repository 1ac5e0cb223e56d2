"""Runtimes that carry out a Plan: native (exec vllm serve) and docker (Docker SDK)."""
