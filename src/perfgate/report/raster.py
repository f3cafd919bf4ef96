"""A small raster renderer for the key plots: stacked and horizontal bars, a heat map, text, PNG out.

The trace tools and `audit_samples` return their key plot as an image with every answer, so it must cost milliseconds,
not the ~0.3 s (and ~1 s of import on the first call) that matplotlib takes. This draws into a numpy
RGB array and encodes the PNG with zlib: a few milliseconds, nothing beyond numpy. Text uses two
anti-aliased bitmap atlases of printable ASCII (other characters draw as ``?``), rasterized once from
DejaVu Sans Mono (Bitstream Vera licence, free to embed) with
``tests/fixtures/report/make_glyphs.py``, which prints the atlases below.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from perfgate.evidence.access import as_dict, as_list

__all__ = ["Canvas", "breakdown_png", "coverage_png", "top_ops_png"]

WIDTH, HEIGHT = 800, 450
Color = tuple[int, int, int]
_INK: Color = (29, 29, 31)
_GRID: Color = (226, 226, 226)
_TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")  # fmt: skip
_COMPUTE, _COMM, _IDLE = "#4C72B0", "#DD8452", "#C7C7C7"

# Glyph atlases: (cell width, cell height, base64 of zlib of 4-bit coverage, two pixels a byte),
# 95 cells of printable ASCII from " " to "~" side by side.
_SMALL = (
    7,
    14,
    (
        "eNrtl39sU9cVx7/vlx3/ft20qSRgHit/QMkPV5M2aY2p+WeVhk2c/2gLUdZJoxQKpn+V/YDXdVq3/iDu2nUL2pDTJYVKLfVC"
        "gaxVxUvSktJq9MUOiFZa4oR0FNI0Dqglg5S7c69/kIREnTZtWrVeyT72/fHuPed8zrnnAV+2L9sXrTkS8OpfqBNXTAtRd7HU"
        "IXcLESj93yy+3Vf5t58+Ug7whvAKrbn8r2x4MIFq4C/xckcMuJ161q8CTDRlgfAV8CnoB+4jkbzhEQ/xKW4Wwk/PQxtsA1rg"
        "Y5ewisUb2FU8MGY4Bm9cRAs6sWo8hBZDZtMh6eCAyo7Dz6ZxjOXlY72qpdh+NoUAM6KIGQP0VH338k8UWznZhonpCAmVXdC1"
        "wac8jH0aRrTCxMgIKh7pl4cfQ3AZYxfxKBSLdvIZcJ0VeyopIfIlPMSxxBwgVz6ZJ0J+SCxsMndkgYFaHTI9bEu5Q7WhdFpw"
        "fTehDl32fMuEuxliyveE49yL7pz7CJ/h3dEHZLFyWR+eqzLxnTw3vOcpGnM1L71tr3y2cr6jVZq+78fgfR51+DH2fsWMKqcx"
        "QuvIr299NRFFmJ8FGFGtmOGLoKLPk1mXDuNvVUm/sY2LmNQljX4tTu5XbNWiBd4InnWZR6SsywTu5wbhdkEGjkOZGRvPAfNu"
        "lMAsNgKT/LBwa1+gX7YFdao1B8ztjCUHOJgrdf7Y6oKryMW3nilgOiP6k3JOS8MXojkmpKPw1MGnQxrmYTMMUiyKe+AgGrZT"
        "z9c76cv5DN96wGHiaXkgLecrUksNOoPD8hvAYWAdP5Fi87PAb0TDIRCYvzz0h+Xv3GKvo94RaZKEajtT4YL7CUwMO5O/2eaJ"
        "LNkCrZN8WaNzg6wVzlb+pKRLnr/WiamPDGnfVWx8L6mc7MUES2vjrTj3keG6Buy+RA44wLXdeu593qlSqF0eI0G477mkDl1S"
        "GTP9uFtNy3Y/nA9nnMl6BPV3WRIbCtTVlHOhYgux2AffepKb4C4ECDqEy+SXTLFgRsuQdmEOJqQsfFfhbMxj8Lxef7CH06FO"
        "dBOYNjck2VN98cEKij/19z8DjuO5+rH4Zr9exzIKxVgUq0mxlIddcZDmDeyzEpgfJ8HB3Nmeia4Pa5aS9xu7uIiR4167F0Uw"
        "3fFXnDt7+7HdgOe04Ju7v1cccFYeTQYefgx7dQRvOyFlNYvAlEYXJ/07flfKmIcPcDAd7cM56pQ+qOQLpNGqlDSl480CmDkt"
        "5dcfcsfRrr7RjV5KF1In3o0UOHu5HIb1hVj/dRr1YyH5aTge6f+hyBNxkUvankm0MGZw6Fi6GCRqttcWYB6h3qNyeik5qEv9"
        "5OY0vBFpdFHS8fETJUU+KP5YdJGY8bobOzzxDjnvsFYLFHNFMLeo12aAua5JgPlozLfcytobcAfPmBuwWmV/B759vATmZj/u"
        "OrIN7tMiuBwpEalaSoTT9eYcuoJJOUenVdPOZAO7xqesxU4Ma0kEwa3vGdS5HzZVe3XqDJNFJmU7TFyQXq6+EM+YBCae9Ybu"
        "i/n0ihE4zB5h4ccLYNaGlJM77hVhL6gLMJaH6wHV3NXdob0dQjGHkItdmAMmebKWopiDuZ/+aundjOmkSy1pKOwRLmgmmnYd"
        "TNLB6qhsZCxVh8BNFzmYW4sZU7XlXDljTqrWRp2DmUAmWvGkmlNtMjkXMSWLwhYcTGkgpbx2q6X19PN1cn85L80CU85oqYBe"
        "y09LFlTTBRjIrNw8RTCP/kqA+aDVTZ1031kBvUaxHSk+rO6Jc7MNO1JKj610tVt4PY4ltwO/KMR0tbjOfrDy/Iw9PSuJ2J/b"
        "8K7Y1FMlbKeSPYKFQZ5iJwvZkuKWztNXleBgki3vvOnP4A6Uj+IUgflbyKMklFMiYzboMzMmsf7NwY57UEtg5txtK1Qr3FwE"
        "07tjdRFMrbGJjNwlwASBWWsHG1/gJvc3HlBtzVqx7HFuuuCaVn6P+c33pawzycE8XHT/5jlghr/xNi7fnHK1QTq7OBmMC3aD"
        "a07wuC2BGXkTzpQAkzqDa17gC4JrXhXD0n64qEBsfBW+/fD98QR+VGPgibiocmoKnK2deZXzJVY3/BOkwa5u1/hPRB1AN4rT"
        "LE/bWhDbxcWnDKXQwuw72BU8eYEunrzKzkM52YmgAcdgJ46dEzMds4CmtEiKuhMYqGNvoHI80jDdTBkzx6/yVZ81czAnmFk5"
        "HlctedTH2AoOJl5H9ILOTR6d1qkOiFPVxU23kcRuA6c8iVYsCZEOdYxFRG2TmZMx951JBfb0YNFEWvtrK+opU9FV3vQeB1Ni"
        "zBY1pjyCxVNFMBEb0/mCjR8KMIfGdISn0HSGNDbQ5YuH9Sgo3/sp4/ALt3pGFM5q5qx/m4Dueeqs+n++nr2hnnjr33gBkA59"
        "7pQWcp7TlJnx+Q97vvxrZJ7h/PXyad7WWhCucxxM78C8Lw//6bcTad+n/xuvSS+XE1zgw3mGRVGqpRZcPn2dier/ixdhRlXz"
        "f3O/fwDoY6Yl"
    ),
)
_LARGE = (
    9,
    18,
    (
        "eNrtmF1wE9cVgM/qX6u/LdCYnzi7zkOn/FnLW9PM4E1eMm0CWj/0oQnYonlrwBbTTDuTYluknU4nCcZNHgIEjAJpJsTBFiR0"
        "INAgKMXQDlhAwHZKwTbY/NvoN9Bib8+5u7JkW4bSMp224+uRdL337t2z55zvnHMvwFSbalNtqv1n277/aun4CVesMYCX/t+N"
        "4tYEvdOWLrjKnTE6O/LX/JL+O2dIyQ9ZbuOXRwVbD/4OZR+BQM240koA+z258Go9fj4SUYJfu1SACJhOvo9XGjVgkwG+xM9Z"
        "/Jibiq+KwtffkMDaoYL5i2sCzB3chlfXB2GrdhfghWGZ0zRN5ZpvKjCPDRVt9gt/wMm3wgAdMni0myqYWq8K4kg7qk/TgjYN"
        "F7Oc7ARRhS5cGVXboIW5DDy+yxEHsN2FipgYh05wDO0GXhsOsY5Puy7BzAuf0hKalAVfEF92nTcIkCkPwn57Lzjjbk0bBjgK"
        "IDKt+NACrpQhlCVmOHD+1U1JQ95DhUMB0JVUQ7+e4INNIcr3Hw/guA2fzn0+RkloQH4tSuBWE+C4+Bl8OCsEsJTWosmwnOZg"
        "51dPzReKreqMQu2zB8CyPQPw22kHwFk5G5X3QhacERytWP1tQrMXtpStF1y7Z8cmkc3y+uweWFU5PwziMYAurlY2XSt7lcvM"
        "+Ar4KI7X0irZaT9B63jCTGachYZ7fBesw25Nr/M8p6mekP0SPr2Fqw6yTsb0e+APz4gwh/QFIWtKgbsJH+CX64UqydNkIorK"
        "w+BG9W5iguAFR1fvOOmKYLVp4hDoWMG5B5uKS91/nC200tB8EawSS8B+enuEX/EuCFb2UJrsajIEXNmNX8smPvUyvr0ZH+1T"
        "SZ0J8gkBSv1B9jauiBH23WFTGvXsL3Qn7jX286J+rVool2Ah2I7GyBpZ2Ezep1pS0EKyU4zpZlfQRExmnMVl5hwChlW32hUT"
        "WxArsh8adz/r+Oj2/pxDElaeEJdGHzIn4FhpCAISea0rzrAyJw2srH3OaF7IWUgl/96wQpgD13ouiRHgCJKrpWH2rQaJ33hL"
        "hQDGIE7LEFZVCmFluTFwQmZDjqFPwUW3OwdrZXireRgcF3aDX9MSaGVRRsXuw9AJ/aify+hIfMSuaUmdT0bKmmJYVWCUCO7A"
        "bLXg+rQN4A3lJg/QJHxf24m39dQ1rq3RlYBRhf6rRfTmxYAPIVaD3YKuKPArUFe2ThAVE0byNpzCk0m/f0+t1bR7puajxOvC"
        "JntkwbUe2Itu08U1SF6MhmhcX3AUK1wFxmH1EgYiwmrV8y+u4TJ9nhAzZQu4oqyTgQrZ22Q4JGEF70GV8HNnYjmY/4av0hJA"
        "97OhnxFWrrCOlemS0dXVs2JmHNpW1AvcV2Uvw5YnOyTbmW/2Mawcpxckoa2ysTBbLVUYVoG5yY1syH5pVhwOVjYK9jNzUuC4"
        "i6ni0owww4pvwu92EJWP8NWExcpxxIIjfW1BmeJFsVpl/Dqa9oDtDGEwcxvYh3L+L1IC9WD0f/mdXcWw8qrk6p0GVqVNYNEO"
        "oUlRMa9O/wuIKzHvMM/fOizD/rK2kG4mtFfJhdeNJR47+Q6ZCj50r24QRLkds9WIClkdoquUamTMVikLhQ1R0+7ksRq5qy9u"
        "i59/LiZ+r6nTnEbI+ag1yzo+dU4carvVPFaWhDNijf/1uSjwuJppkPzhKjCsYKlgZKsJmYWPoceSp3uD1iS6nyvE4vsAVEt8"
        "lPLXaLYiUxFWPcttUTaE+VVx0e2dlIHQrFCXy1aElT1mi9tjddY4rHoLoAr/8FsGbn+OlIA8rshj7YgogP3iHoDXZLD0rRP6"
        "9DDFqiI0BTyFzo0UjI+rcXT1NRhOGFY85dt5MfRM0rQlyQ0vakDPvQKwuaxRMLVe6czfeDef/Kpi4IiB+9keSFjj9ihiVaUQ"
        "qQiRNzyKVUAK3BmH1R/TBlaOnjVcurw0VKHAcTRuJ7COpqF7fav1UB4rr3oO/E/8bCNwZCYHpaVPQMcKXVzPVmOaqVVLoVbd"
        "YQqLyEGFJFKRQ1iJMkZNUngeq5E+PVstscZeYUM+cmNKAD4Vb3bgGqabv4Q8Vn5pLyx2nX4D4CBaqJ/yDdY89hEpV9e19XCt"
        "ndPCY2TyYQTEiXsum/fYBoNvwH6fgU1QZ0dvOawc2m2j124ogWHlPKWTGNBt6ld8YbJTtUCjVwoXAsTqF4C0aDEdK3z3I+Xg"
        "ExAiAa3xMVzVscqOZiusAtzhcdkKH6hjhbFCVH7XaSJTknFZx6cupkhOL29gBTv8AmQ/+DwEmyskfZ1q2cCKhZ0JWP1JEhWs"
        "9I5h8NStoxcFiBUzHFP4KFa1z0d1rOLLbDE2hGKEXHR7hmz6Jjn/D6/nsYJ2/KQ6XwlCKarQ+X6KRaZCrBT4wfTmL8ftoaIb"
        "iAtXWOD6FpZEufPR/F4wV6UWyVYUN45jUmBYOU6PkqhjhTKirbG8IEBC7Eq+YbZijqtnK3x2sL0k4VXQLbswwzpjDKuAPIoV"
        "WvDYKFZmCcOKqJZGdKwwa3Jp64mQl4r4FsOQKFK1pAeFeuZ0GbCdw7ql3XsE123RA+MT4RxWzI/SE+KfJY3keYOsLuvHBVki"
        "J9di8XAsVj3loRxWK9kQVTJwAKd6QhYdK1TibYaVM4L1mP1oHNybvnsJ+M+QyIo6IzJNkq3qjd8NbqxUfrQdU9sTT54qXzvL"
        "2M1Z44WlCGHlyOmb8g7lYNvlOTGGlR1NxW2ftlNgqG2f/mdMfyVJ4gFch0tS6CDdRlGxXiooApkno+Z+bDrZPCOBOwBPeMYA"
        "lL9dooiVSyL5IrB6xcI8VkueaZDIlGoBVp6voX7RTr3Cpw6KdBw++EaDzIzySVmDAGI7BZsOqTRsGmDr8EwZR40aaSJWXdM7"
        "FD5b0gul2x6THYexlqip/I7CstU6LDPGYlVDkPK7CrCqW7QFXJmZvdg5qGP10zIsb6lsqilrk8F/jPahg2DrJd+8GAIbyzyT"
        "F4Fs1/4M6nDuRdoY1AzA07feNTYYHoV5TEHbmkszWB6wKteOW06Tpn0NQ5qmWL64LjGsrCe7BFbcMsefNXgEy90u/S5wJiac"
        "lUSp9Acq02uFiyNIwtODazntXohq4zsMK1g2vI1h5aRyt+4mK2mahfUYRXWsoCEEjX+XmHGhESN+BqxJcytuwMkobCdOu2xH"
        "j+O24xTgLpjeHWW+rWPFnj8eK3PH2TTsOIgxaB7mt9m3aiVYhbtswgrTiI6Vm97dOLLYiVW0JoxihfLIsI9ubx7QseK23ED9"
        "LNcErvVsisljTWIN0g+lGC5Qm7jHx0pxdG8VnXwDFplwZRlFx8ILnsKzi03/2ulJd9G98BXhEZ4Yma88xOSOhL6j5zXlYZ4R"
        "KPynf7JZRvn/oGMKbG/e/8jiQSeBE5op+RDHJDDpkVSxlVvvPUJbWSOPRqpJm2X1/MJHBCa9e+8/dUxBJZB6/5PAqVakUUn8"
        "wMNXx+BvCtgZCf3bWB0cc9hqi03Z4X+x/QNZ9Aul"
    ),
)


def rgb(hex_color: str) -> Color:
    value = int(hex_color.lstrip("#"), 16)
    return (value >> 16) & 255, (value >> 8) & 255, value & 255


@cache
def _atlas(large: bool) -> tuple[int, int, npt.NDArray[np.float32]]:
    cw, ch, parts = _LARGE if large else _SMALL
    packed = np.frombuffer(zlib.decompress(base64.b64decode("".join(parts))), np.uint8)
    cover = np.empty(packed.size * 2, np.float32)
    cover[0::2], cover[1::2] = packed >> 4, packed & 15
    return cw, ch, np.reshape(cover / 15.0, (ch, cw * 95))


def text_mask(text: str, large: bool = False) -> npt.NDArray[np.float32]:
    """Coverage (0..1) of ``text`` in one line, shape (cell height, cell width x len(text))."""
    cw, ch, atlas = _atlas(large)
    codes = [ord(c) - 32 if 32 <= ord(c) < 127 else ord("?") - 32 for c in text]
    if not codes:
        return np.zeros((ch, 0), np.float32)
    cols = (np.array(codes)[:, None] * cw + np.arange(cw)[None, :]).ravel()
    return atlas[:, cols]


class Canvas:
    """An RGB image with rectangles, lines and text; `png` encodes it."""

    def __init__(self, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width, self.height = width, height
        self.pixels = np.full((height, width, 3), 255, np.uint8)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the image (coordinates round to pixels)."""
        a, b = sorted((round(x0), round(x1)))
        c, d = sorted((round(y0), round(y1)))
        a, b = max(a, 0), min(b, self.width)
        c, d = max(c, 0), min(d, self.height)
        if a < b and c < d:
            self.pixels[c:d, a:b] = color

    def text(
        self, x: float, y: float, text: str, *, color: Color = _INK, large: bool = False, anchor: str = "lt",
        vertical: bool = False, max_width: float | None = None,
    ) -> float:  # fmt: skip
        """Draw ``text`` with its anchor (``l``/``c``/``r`` then ``t``/``m``/``b``) at (x, y); returns its width.

        ``vertical`` turns it a quarter counter-clockwise (reads bottom to top); ``max_width`` cuts it
        with ``...`` to fit.
        """
        cw = _atlas(large)[0]
        if max_width is not None and len(text) * cw > max_width:
            keep = max(int(max_width // cw) - 3, 1)
            text = text[:keep] + "..."
        mask = text_mask(text, large)
        if vertical:
            mask = np.rot90(mask)
        h, w = mask.shape
        left = x - {"l": 0.0, "c": w / 2, "r": float(w)}[anchor[0]]
        top = y - {"t": 0.0, "m": h / 2, "b": float(h)}[anchor[1]]
        self._blend(round(left), round(top), mask, color)
        return float(mask.shape[0] if vertical else w)

    def _blend(self, left: int, top: int, mask: npt.NDArray[np.float32], color: Color) -> None:
        h, w = mask.shape
        x0, y0 = max(left, 0), max(top, 0)
        x1, y1 = min(left + w, self.width), min(top + h, self.height)
        if x0 >= x1 or y0 >= y1:
            return
        alpha = mask[y0 - top : y1 - top, x0 - left : x1 - left, None]
        region = self.pixels[y0:y1, x0:x1].astype(np.float32)
        ink = np.array(color, np.float32)
        self.pixels[y0:y1, x0:x1] = (region + (ink - region) * alpha + 0.5).astype(np.uint8)

    def png(self) -> bytes:
        """The image as PNG bytes (8-bit RGB, no filter, zlib level 1: ~4 ms, ~25 kB for a bar chart)."""
        rows = np.zeros((self.height, self.width * 3 + 1), np.uint8)
        rows[:, 1:] = np.reshape(self.pixels, (self.height, self.width * 3))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
            + chunk(b"IEND", b"")
        )


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.6g}"


class _Panel:
    """A plot area with a y axis from 0 to ``top`` (vertical bars) or an x axis (horizontal bars)."""

    def __init__(self, canvas: Canvas, box: tuple[int, int, int, int], top: float) -> None:
        self.canvas, self.box, self.top = canvas, box, top

    def y(self, value: float) -> float:
        _, y0, _, y1 = self.box
        return y1 - (y1 - y0) * value / self.top

    def x(self, value: float) -> float:
        x0, _, x1, _ = self.box
        return x0 + (x1 - x0) * value / self.top

    def frame(self) -> None:
        x0, y0, x1, y1 = self.box
        c = self.canvas
        c.rect(x0, y0, x1, y0 + 1, _INK)
        c.rect(x0, y1, x1, y1 + 1, _INK)
        c.rect(x0, y0, x0 + 1, y1 + 1, _INK)
        c.rect(x1, y0, x1 + 1, y1 + 1, _INK)

    def y_axis(self, ticks: Sequence[float], label: str) -> None:
        x0, y0, x1, y1 = self.box
        c = self.canvas
        for t in ticks:
            y = self.y(t)
            c.rect(x0 + 1, y, x1, y + 1, _GRID)
            c.rect(x0 - 4, y, x0, y + 1, _INK)
            c.text(x0 - 6, y, _fmt(t), anchor="rm")
        c.text(x0 - 40, (y0 + y1) / 2, label, anchor="cm", vertical=True, max_width=y1 - y0)

    def x_axis(self, ticks: Sequence[float], label: str) -> None:
        x0, y0, x1, y1 = self.box
        c = self.canvas
        for t in ticks:
            x = self.x(t)
            c.rect(x, y0 + 1, x + 1, y1, _GRID)
            c.rect(x, y1, x + 1, y1 + 4, _INK)
            c.text(x, y1 + 6, _fmt(t), anchor="ct")
        c.text((x0 + x1) / 2, y1 + 22, label, anchor="ct")


def _legend(canvas: Canvas, x: int, y: int, width: int, entries: Sequence[tuple[str, Color]]) -> None:
    """Swatches and labels below a panel: one column for up to three entries, else two."""
    cols = 1 if len(entries) <= 3 else 2
    col_w = width // cols
    for i, (label, color) in enumerate(entries):
        cx, cy = x + (i % cols) * col_w, y + (i // cols) * 15
        canvas.rect(cx, cy + 3, cx + 10, cy + 13, color)
        canvas.text(cx + 14, cy, label, max_width=col_w - 18)


def _stacked(
    canvas: Canvas, panel: _Panel, labels: Sequence[str], stacks: Sequence[Sequence[tuple[float, Color]]]
) -> None:
    x0, _, x1, y1 = panel.box
    n = max(len(stacks), 1)
    slot = (x1 - x0) / n
    every = max(1, math.ceil(n * 7 * 8 / (x1 - x0)))  # label every k-th bar when they would overlap
    for i, parts in enumerate(stacks):
        left = x0 + slot * (i + 0.1)
        right = x0 + slot * (i + 0.9)
        bottom = 0.0
        for value, color in parts:
            if value > 0:
                canvas.rect(left, panel.y(bottom + value), max(right, left + 1), panel.y(bottom), color)
            bottom += value
        if i % every == 0:
            canvas.text((left + right) / 2, y1 + 5, labels[i], anchor="ct", max_width=max(slot * every, 14))


def breakdown_png(
    ranks: Sequence[Mapping[str, Any]], title: str = "Where device time goes, per rank"
) -> bytes:
    """Two stacked-bar panels per rank: the temporal breakdown (compute, non-overlapped communication and
    memory, idle; fractions of the device-active span) and the kernel categories (shares of device time).

    Each rank mapping carries ``rank``, ``span_us``, ``compute_us``, ``non_compute_us``, ``idle_us`` and
    optionally ``categories`` ([{category, share}]).
    """
    canvas = Canvas()
    canvas.text(WIDTH / 2, 8, title, large=True, anchor="ct", max_width=WIDTH - 20)
    labels = [f"rank {r.get('rank', i)}" for i, r in enumerate(ranks)]
    ticks = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]

    parts = (("compute", "compute", rgb(_COMPUTE)), ("non_compute", "comm + memory (not overlapped)", rgb(_COMM)),
             ("idle", "idle", rgb(_IDLE)))  # fmt: skip
    temporal: list[list[tuple[float, Color]]] = []
    for r in ranks:
        span = float(r.get("span_us") or 0.0)
        temporal.append(
            [(float(r.get(f"{key}_us") or 0.0) / span if span > 0 else 0.0, color) for key, _, color in parts]
        )
    left = _Panel(canvas, (70, 52, 380, 330), 1.05)
    canvas.text(225, 34, "temporal breakdown", anchor="ct")
    left.y_axis(ticks, "fraction of device-active span")
    _stacked(canvas, left, labels, temporal)
    left.frame()
    _legend(canvas, 70, 352, 310, [(label, color) for _, label, color in parts])

    cats = [[as_dict(c) for c in as_list(r.get("categories"))] for r in ranks]
    names = sorted({str(c.get("category")) for per_rank in cats for c in per_rank})
    colors = {name: rgb(_TAB10[k % 10]) for k, name in enumerate(names)}
    shares: list[list[tuple[float, Color]]] = []
    for per_rank in cats:
        by_name: dict[str, float] = {}
        for c in per_rank:
            name = str(c.get("category"))
            by_name[name] = by_name.get(name, 0.0) + float(c.get("share") or 0.0)
        shares.append([(by_name.get(name, 0.0), colors[name]) for name in names])
    right = _Panel(canvas, (475, 52, 785, 330), 1.05)
    canvas.text(630, 34, "kernel categories", anchor="ct")
    right.y_axis(ticks, "share of device time")
    _stacked(canvas, right, labels, shares)
    right.frame()
    _legend(canvas, 475, 352, 310, [(name, colors[name]) for name in names[:12]])
    return canvas.png()


def top_ops_png(ops: Sequence[tuple[str, float]], title: str = "Host time by CPU op (self time)") -> bytes:
    """Horizontal bars of the heaviest CPU ops by exclusive time (us): the view for CPU-only traces."""
    canvas = Canvas()
    canvas.text(WIDTH / 2, 8, title, large=True, anchor="ct", max_width=WIDTH - 20)
    shown = list(ops)[:12]
    values = [v / 1e3 for _, v in shown]
    ticks = _ticks(max(values, default=0.0))
    panel = _Panel(canvas, (330, 40, 780, 400), ticks[-1])
    panel.x_axis(ticks, "self time (ms) in the profiled steps")
    slot = (400 - 40) / max(len(shown), 1)
    for i, ((name, _), value) in enumerate(zip(shown, values, strict=True)):
        top = 40 + slot * (i + 0.15)
        bottom = 40 + slot * (i + 0.85)
        canvas.rect(330, top, max(panel.x(value), 331), bottom, rgb(_COMPUTE))
        canvas.text(324, (top + bottom) / 2, name, anchor="rm", max_width=315)
    panel.frame()
    return canvas.png()


_VIRIDIS = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")


def _colormap(values: npt.NDArray[np.float64]) -> npt.NDArray[np.uint8]:
    """Viridis-like colours (linear between five of its stops) for values in [0, 1]: shape (..., 3)."""
    stops = np.array([rgb(c) for c in _VIRIDIS], np.float64)
    finite: npt.NDArray[np.float64] = np.nan_to_num(values)
    where = np.minimum(np.maximum(finite, 0.0), 1.0) * (len(stops) - 1)
    low = np.minimum(where.astype(np.int64), len(stops) - 2)
    frac = (where - low)[..., None]
    return (stops[low] + (stops[low + 1] - stops[low]) * frac + 0.5).astype(np.uint8)


def coverage_png(
    matrix: Sequence[Sequence[float]],
    epochs: Sequence[int],
    ranks: Sequence[int],
    title: str = "Sample coverage",
) -> bytes:
    """Heat map of the fraction of expected samples seen, epoch (rows) x rank (columns), 1.0 = full
    coverage, with the value written in each cell large enough to hold it and a colour bar."""
    canvas = Canvas()
    canvas.text(WIDTH / 2, 8, title, large=True, anchor="ct", max_width=WIDTH - 20)
    values = np.reshape(np.array([list(row) for row in matrix], np.float64), (len(epochs), len(ranks)))
    top = max(1.0, float(np.nanmax(values)) if values.size else 1.0)
    x0, y0, x1, y1 = 90, 40, 690, 400
    if values.size:
        # Every pixel of the panel takes the colour of the cell it falls in.
        cols = np.minimum((np.arange(x1 - x0) * len(ranks)) // (x1 - x0), len(ranks) - 1)
        rows = np.minimum((np.arange(y1 - y0) * len(epochs)) // (y1 - y0), len(epochs) - 1)
        canvas.pixels[y0:y1, x0:x1] = _colormap(values / top)[rows[:, None], cols[None, :]]
    cell_w, cell_h = (x1 - x0) / max(len(ranks), 1), (y1 - y0) / max(len(epochs), 1)
    if cell_w >= 5 * 7 + 4 and cell_h >= 14:
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                ink: Color = (255, 255, 255) if value / top < 0.6 else _INK
                canvas.text(
                    x0 + (j + 0.5) * cell_w, y0 + (i + 0.5) * cell_h, f"{value:.2f}", color=ink, anchor="cm"
                )
    every_row = max(1, math.ceil(14 / cell_h))
    for i, epoch in enumerate(epochs):
        if i % every_row == 0:
            canvas.text(x0 - 6, y0 + (i + 0.5) * cell_h, f"epoch {epoch}", anchor="rm", max_width=x0 - 8)
    every_col = max(1, math.ceil(7 * 8 / cell_w))
    for j, rank in enumerate(ranks):
        if j % every_col == 0:
            canvas.text(
                x0 + (j + 0.5) * cell_w, y1 + 5, f"rank {rank}", anchor="ct", max_width=cell_w * every_col
            )
    _Panel(canvas, (x0, y0, x1, y1), 1.0).frame()
    # Colour bar: 0 at the bottom, ``top`` at the top.
    bx0, bx1 = 715, 735
    levels = np.linspace(1.0, 0.0, y1 - y0)
    canvas.pixels[y0:y1, bx0:bx1] = _colormap(levels)[:, None, :]
    bar = _Panel(canvas, (bx0, y0, bx1, y1), top)
    for t in _ticks(top):
        if t <= top:
            canvas.rect(bx1, bar.y(t), bx1 + 4, bar.y(t) + 1, _INK)
            canvas.text(bx1 + 6, bar.y(t), _fmt(t), anchor="lm")
    bar.frame()
    canvas.text(
        WIDTH / 2, y1 + 24, "fraction of the rank's expected share (colour and cell value)", anchor="ct"
    )
    return canvas.png()
