"""Draws the chart of `make bench-compare` from its CSV.

Usage: chart.py <results.csv> <chart.png>

One group of bars per metric: how many times better streamapp-processor is (higher throughput,
or lower CPU, latency, memory, recovery time) than the best Kafka Streams configuration on that
metric, and than Kafka Streams at its defaults. Bars above 1 favour streamapp-processor. The
scale is logarithmic, so 2x better and 2x worse are the same length. Rows that are context, not
a comparison (the machine's load, the rate latency was measured at), and rows without two
non-zero figures (streamapp restores 0 records after a crash) are listed under the chart.
"""

import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")  # no display here: write the file only
import matplotlib.pyplot as plt  # noqa: E402

BARS = [
    ("best_ks", "vs the best Kafka Streams configuration (per metric)"),
    ("ks_defaults", "vs Kafka Streams at its defaults"),
]


def value(row, column):
    """The figure in `column`, or None when the CSV has none."""
    try:
        v = float(row.get(column) or "nan")
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def advantage(row, column):
    """How many times better streamapp-processor is than `column` on `row` (> 1: better)."""
    ours, theirs = value(row, "streamapp"), value(row, column)
    if not ours or not theirs:
        return None
    if row["higher_is_better"] == "true":
        return ours / theirs
    return theirs / ours


def drawable(row):
    return row["higher_is_better"] in ("true", "false") and advantage(row, "best_ks") is not None


def main(csv_path, png_path):
    with open(csv_path, newline="") as f:
        all_rows = list(csv.DictReader(f))
    rows = [r for r in all_rows if drawable(r)]
    listed = [r for r in all_rows if not drawable(r)]
    labels = [f'{r["metric"]}\n({r["unit"]})' for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, 1.1 * len(rows)), 8))
    width = 0.38
    for i, (column, title) in enumerate(BARS):
        xs, values = [], []
        for j, r in enumerate(rows):
            v = advantage(r, column)
            if v is not None:
                xs.append(j + (i - 0.5) * width)
                values.append(v)
        # Bars start at 1x (parity): up when streamapp-processor is better, down when worse.
        ax.bar(xs, [v - 1 for v in values], width, bottom=1, label=title)
        for x, v in zip(xs, values):
            ax.annotate(
                f"{v:.1f}x",
                (x, v),
                ha="center",
                va="bottom" if v >= 1 else "top",
                fontsize=7,
                xytext=(0, 2 if v >= 1 else -2),
                textcoords="offset points",
            )
    if rows:
        ax.set_yscale("log")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.axhline(2, color="tab:green", linestyle="--", linewidth=0.8, label="goal: 2x throughput per core")
    ax.axhline(3, color="tab:red", linestyle="--", linewidth=0.8, label="goal: 3x fewer CPU s per 1M records")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("times better: streamapp-processor / Kafka Streams (log scale)")
    ax.set_title("streamapp-processor vs Kafka Streams 4.4, same dedup topology, same broker, same run (medians)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2)
    if listed:

        def figures(r):
            cells = [
                f"{name} {value(r, name):.4g}"
                for name in ("streamapp", "streamapp_walsync", "streamapp_nowal", "skeleton", "copy", "ks_defaults", "ks_window", "ks_kv", "ks_window_txn")
                if value(r, name) is not None
            ]
            return f'{r["metric"]} ({r["unit"]}): ' + ", ".join(cells or ["no figure"])

        fig.text(0.01, 0.01, "; ".join(figures(r) for r in listed), fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.06 if listed else 0, 1, 1))
    fig.savefig(png_path, dpi=110)
    print(f"chart: {png_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
