"""A line-and-marker chart written as a PNG in pure Python (zlib, struct): the harness's venv has no matplotlib.

No text is drawn: the page that shows the chart says what the axes, the colours and the grid
lines are. ``chart`` draws each series as markers joined by lines (``dashed`` series without
markers, e.g. a prediction), a horizontal reference line, and grid lines at whole x and y
values; the output is the same bytes for the same input.
"""

from __future__ import annotations

import struct
import zlib

WHITE, GREY, BLACK = (255, 255, 255), (225, 225, 225), (0, 0, 0)


class Canvas:
    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.px = [bytearray(WHITE * width) for _ in range(height)]

    def dot(self, x: int, y: int, color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            self.px[y][3 * x:3 * x + 3] = bytes(color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color, dash: int = 0, width: int = 1) -> None:
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(steps + 1):
            if dash and (i // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            for dx in range(width):
                for dy in range(width):
                    self.dot(x + dx, y + dy, color)

    def square(self, x: float, y: float, r: int, color) -> None:
        for dx in range(-r, r + 1):
            for dy in range(-r, r + 1):
                self.dot(round(x) + dx, round(y) + dy, color)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) \
            + chunk(b"IEND", b"")


def chart(series: list[dict], *, x_range: tuple[float, float], y_range: tuple[float, float],
          reference_y: float | None = None, width: int = 900, height: int = 540, margin: int = 40) -> bytes:
    """``series``: {"points": [(x, y)...], "color": (r, g, b), "dashed": bool}. Returns PNG bytes."""
    cv = Canvas(width, height)
    (x0, x1), (y0, y1) = x_range, y_range
    sx = lambda x: margin + (x - x0) * (width - 2 * margin) / (x1 - x0)  # noqa: E731
    sy = lambda y: height - margin - (y - y0) * (height - 2 * margin) / (y1 - y0)  # noqa: E731
    for gx in range(int(x0), int(x1) + 1):
        cv.line(sx(gx), sy(y0), sx(gx), sy(y1), GREY)
    for gy in range(int(y0), int(y1) + 1):
        cv.line(sx(x0), sy(gy), sx(x1), sy(gy), GREY)
    cv.line(sx(x0), sy(y0), sx(x1), sy(y0), BLACK)
    cv.line(sx(x0), sy(y0), sx(x0), sy(y1), BLACK)
    if reference_y is not None:
        cv.line(sx(x0), sy(reference_y), sx(x1), sy(reference_y), BLACK, dash=6)
    for s in series:
        pts = sorted(s["points"])
        for (a, b), (c, d) in zip(pts, pts[1:]):
            cv.line(sx(a), sy(b), sx(c), sy(d), s["color"], dash=4 if s.get("dashed") else 0, width=2)
        if not s.get("dashed"):
            for a, b in pts:
                cv.square(sx(a), sy(b), 3, s["color"])
    return cv.png()
