"""vLLM launcher for consumer Blackwell: recipe -> plan -> runtime."""

__version__ = "0.1.0"
