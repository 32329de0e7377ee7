"""The demo's bandwidth timeline as a PNG, drawn with matplotlib (the lab's ``plot`` extra:
``pip install 'railhop-lab[plot]'``; a node never needs it).

One line per NIC (Mbit/s over seconds), each fault's span shaded in its NIC's colour, the
fault/heal instants as grey marks, the agents' detections as dashed dark-red marks, labelled
axes with ticks at round numbers, and a legend outside the data.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

PLOT_EXTRA_HINT = "the PNG timeline needs matplotlib: pip install 'railhop-lab[plot]'"
FONT_SIZE = 11  # points, at DPI below: readable at the PNG's own size
DPI = 100


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed (the lab's ``plot`` extra)."""


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
    """Bandwidth per NIC over time; returns PNG bytes of ``width`` x ``height`` pixels.

    ``bins``: (t seconds, bytes per second of each NIC); ``marks``: (t, label) fault and heal
    instants; ``bands``: (start, end, nic) a fault holding on that NIC; ``detections``: (t,
    label) an agent declared a NIC down. PlotUnavailableError without matplotlib."""
    try:  # the Figure API (no pyplot): no display, no global state, Agg renders the PNG
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise PlotUnavailableError(PLOT_EXTRA_HINT) from e
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    ax = fig.add_subplot(1, 1, 1)
    colors = [f"C{i}" for i in range(10)]
    nics = len(bins[0][1]) if bins else 0
    ts = [t for t, _ in bins]
    for i in range(nics):
        ax.plot(
            ts,
            [vals[i] * 8 / 1e6 for _, vals in bins],
            color=colors[i % 10],
            linewidth=1.8,
            label=f"nic{i}",
        )
    banded: set[int] = set()
    handles: list[Patch] = []
    for t0, t1, nic in bands:
        ax.axvspan(t0, t1, color=colors[nic % 10], alpha=0.15, linewidth=0)
        if nic not in banded:
            banded.add(nic)
            handles.append(Patch(color=colors[nic % 10], alpha=0.3, label=f"fault on nic{nic}"))
    for t, label in marks:
        ax.axvline(t, color="0.45", linewidth=1.0)
        ax.annotate(
            label,
            (t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            fontsize=FONT_SIZE - 2,
            color="0.3",
            va="top",
            rotation=90,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
    for k, (t, label) in enumerate(detections):
        ax.axvline(
            t,
            color="#aa1414",
            linestyle="--",
            linewidth=1.3,
            label="agent declared NIC down" if k == 0 else None,
        )
        ax.annotate(
            label,
            (t, 0.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 3),
            textcoords="offset points",
            fontsize=FONT_SIZE - 2,
            color="#aa1414",
            va="bottom",
            rotation=90,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
    # ticks at round numbers (steps of 1, 2 or 5 x 10^n), axes from zero
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 5, 10]))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10]))
    ax.set_xlim(0, math.ceil(max(ts, default=1.0)) or 1.0)
    ys = sorted(v * 8 / 1e6 for _, vals in bins for v in vals)
    # the scale ignores the top 1 % of samples (a bin catching up after a sampling gap)
    top = ys[min(len(ys) - 1, int(len(ys) * 0.99))] * 1.15 if ys else 1.0
    ax.set_ylim(0, top or 1.0)
    ax.set_xlabel("time since start (s)", fontsize=FONT_SIZE)
    ax.set_ylabel("transmit rate (Mbit/s)", fontsize=FONT_SIZE)
    ax.tick_params(labelsize=FONT_SIZE - 1)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, fontsize=FONT_SIZE + 1)
    line_handles, _labels = ax.get_legend_handles_labels()
    ax.legend(
        handles=[*line_handles, *handles],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=FONT_SIZE - 1,
        frameon=False,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()
