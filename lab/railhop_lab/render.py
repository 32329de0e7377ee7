"""The bandwidth timeline as a PNG: a tiny encoder (zlib + struct, no plotting dependency) and a
3x5 pixel font."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001010010010", "8": "111101111101111",
    "9": "111101111001111", "a": "000011101101011", "b": "100110101101110",
    "c": "000011100100011", "d": "001011101101011", "e": "000111111100011",
    "f": "011100110100100", "g": "011101011001110", "h": "100110101101101",
    "i": "010000010010010", "k": "100101110101101", "l": "110010010010111",
    "m": "000111111101101", "n": "000110101101101", "o": "000010101101010",
    "p": "000110101110100", "r": "000011100100100", "s": "000011110011110",
    "t": "010111010010011", "u": "000101101101011", "v": "000101101101010",
    "w": "000101101111111", "x": "000101010101101", "y": "000101011001110",
    "/": "001001010100100", ".": "000000000000010", ":": "000010000010000",
    "-": "000000111000000", " ": "000000000000000", "%": "101001010100101",
    "+": "000010111010000", "_": "000000000000111", "q": "000011101011001",
    "j": "001000001001110", "z": "000111001100111",
}  # fmt: skip

_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127)]  # fmt: skip


class _Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def dot(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def line(
        self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int], *, w: int = 1
    ) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            x = x0 + (x1 - x0) * k // n
            y = y0 + (y1 - y0) * k // n
            for dx in range(w):
                for dy in range(w):
                    self.dot(x + dx, y + dy, c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(y0, y1):
            for x in range(x0, x1):
                self.dot(x, y, c)

    def tint(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        """Blend ``c`` at 25 % over what is there (overlapping tints stay visible)."""
        for y in range(max(0, y0), min(self.h, y1)):
            for x in range(max(0, x0), min(self.w, x1)):
                i = (y * self.w + x) * 3
                for k in range(3):
                    self.px[i + k] = (self.px[i + k] * 3 + c[k]) // 4

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int] = (0, 0, 0), k: int = 2) -> None:
        for ch in s.lower():
            g = _FONT.get(ch, _FONT[" "])
            for r in range(5):
                for col in range(3):
                    if g[r * 3 + col] == "1":
                        self.rect(x + col * k, y + r * k, x + (col + 1) * k, y + (r + 1) * k, c)
            x += 4 * k

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h)
        )

        def chunk(tag: bytes, data: bytes) -> bytes:
            body = tag + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b"")
        )


def render_timeline_png(
    bins: Sequence[tuple[float, Sequence[float]]],
    marks: Sequence[tuple[float, str]],
    title: str = "",
    width: int = 1000,
    height: int = 420,
    *,
    bands: Sequence[tuple[float, float, int]] = (),
    detections: Sequence[tuple[float, str]] = (),
) -> bytes:
    """Bandwidth per NIC (Mbit/s) over time with vertical marks; returns PNG bytes.

    ``bands``: (start, end, nic) shaded in that NIC's colour, lightened (a fault holding);
    ``detections``: (t, label) dashed dark red marks (an agent declared a NIC down)."""
    cv = _Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 40, height - 50
    t_max = max((t for t, _ in bins), default=1.0) or 1.0
    # the scale ignores the top 1 % of the samples (a bin catching up after a sampling gap)
    ys = sorted(v * 8 / 1e6 for _, vals in bins for v in vals)
    y_max = (ys[min(len(ys) - 1, int(len(ys) * 0.99))] if ys else 1.0) * 1.3 or 1.0
    grey, black = (200, 200, 200), (0, 0, 0)

    def xy(t: float, mbit: float) -> tuple[int, int]:
        x = left + int((right - left) * min(max(t, 0.0), t_max) / t_max)
        y = bottom - int((bottom - top) * min(mbit, y_max) / y_max)
        return x, y

    for t0, t1, nic in bands:
        cv.tint(xy(t0, 0)[0], top, xy(t1, 0)[0], bottom, _COLORS[nic % len(_COLORS)])

    for k in range(6):  # grid and y labels
        v = y_max * k / 5
        _, y = xy(0, v)
        cv.line(left, y, right, y, grey)
        cv.text(5, y - 5, f"{v:.0f}")
    step = max(1, int(t_max / 10))
    for s in range(0, int(t_max) + 1, step):
        x, _ = xy(s, 0)
        cv.line(x, bottom, x, bottom + 5, black)
        cv.text(x - 4, bottom + 10, str(s))
    cv.line(left, top, left, bottom, black)
    cv.line(left, bottom, right, bottom, black)
    cv.text(right - 60, bottom + 30, "time s")
    cv.text(5, 15, "mbit/s")
    cv.text(left + 10, 10, title[:100])
    for t, label in marks:
        x, _ = xy(t, 0)
        cv.line(x, top, x, bottom, (120, 120, 120))
        cv.text(x + 3, top + 2 + 12 * (marks.index((t, label)) % 3), label[:30], (90, 90, 90))
    red = (170, 20, 20)
    for k, (t, label) in enumerate(detections):
        x, _ = xy(t, 0)
        for y in range(top, bottom, 8):
            cv.line(x, y, x, min(y + 4, bottom), red)
        cv.text(x + 3, bottom - 14 - 12 * (k % 3), label[:30], red)
    nics = len(bins[0][1]) if bins else 0
    for i in range(nics):
        c = _COLORS[i % len(_COLORS)]
        pts = [xy(t, vals[i] * 8 / 1e6) for t, vals in bins]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            cv.line(x0, y0, x1, y1, c, w=2)
        lx = right - 90
        ly = top + 10 + 14 * i
        cv.rect(lx, ly, lx + 12, ly + 10, c)
        cv.text(lx + 16, ly, f"nic{i}")
    return cv.png()
