"""``launcher quantize`` (filled in by the quantization work)."""


def register(app) -> None:
    pass
