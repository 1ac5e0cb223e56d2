"""The patch series and the pure-Python engine that applies it."""
