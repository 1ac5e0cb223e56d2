"""The patch series and the pure-Python engine that applies it.

- :mod:`~launcher.patching.series`: the series on disk (``patches/vllm/<version>/``),
  patch headers, ids, the series hash.
- :mod:`~launcher.patching.diff`: git-style diffs parsed with unidiff, and the exact-context applier.
- :mod:`~launcher.patching.tree`: finding a vLLM tree (site-packages or source) and its version, without importing vLLM.
- :mod:`~launcher.patching.engine`: apply / revert / status / check, all decided in memory first.
- :mod:`~launcher.patching.transaction`: all-or-nothing writes.
- :mod:`~launcher.patching.stamp`: ``vllm/.sm12x-patches.json``, what was applied.
- :mod:`~launcher.patching.cli`: ``launcher patch ...``.
"""
