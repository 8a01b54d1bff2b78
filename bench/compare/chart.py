"""Draws the chart of `make bench-compare` from its CSV.

Usage: chart.py <results.csv> <chart.png>

One bar per metric and Kafka Streams variant: how many times better streamapp-processor is
(higher throughput, or lower CPU, latency, memory, recovery time, records restored). Bars
above 1 favour streamapp-processor. The scale is logarithmic, so 2x better and 2x worse are
the same length. The goals of the comparison are drawn as dashed lines.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")  # no display here: write the file only
import matplotlib.pyplot as plt  # noqa: E402

PEERS = [
    ("kafka_streams_eos", "vs Kafka Streams EOS (wipe and restore)"),
    ("kafka_streams_txn", "vs Kafka Streams EOS + transactional stores"),
]


def advantage(row, peer):
    """How many times better streamapp-processor is than `peer` on `row` (> 1: better)."""
    ours, theirs = float(row["streamapp"]), float(row[peer])
    if row["higher_is_better"] == "true":
        return ours / theirs
    return theirs / ours


def drawable(row):
    """A ratio needs two non-zero values (streamapp restores 0 records after a crash: that
    row is listed under the chart with its values instead)."""
    return all(float(row[k]) > 0 for k in ("streamapp",) + tuple(p for p, _ in PEERS))


def main(csv_path, png_path):
    with open(csv_path, newline="") as f:
        all_rows = list(csv.DictReader(f))
    rows = [r for r in all_rows if drawable(r)]
    listed = [r for r in all_rows if not drawable(r)]
    labels = [f'{r["metric"]}\n({r["unit"]})' for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, 1.1 * len(rows)), 8))
    width = 0.38
    for i, (peer, title) in enumerate(PEERS):
        values = [advantage(r, peer) for r in rows]
        xs = [j + (i - 0.5) * width for j in range(len(rows))]
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
    ax.set_yscale("log")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.axhline(2, color="tab:green", linestyle="--", linewidth=0.8, label="goal: 2x throughput per core")
    ax.axhline(10, color="tab:red", linestyle="--", linewidth=0.8, label="goal: 10x faster recovery")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("times better: streamapp-processor / Kafka Streams (log scale)")
    ax.set_title("streamapp-processor vs Kafka Streams 4.4, same dedup topology, same broker, same run")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2)
    if listed:
        note = "; ".join(
            f'{r["metric"]}: streamapp {float(r["streamapp"]):.0f}, '
            f'KS EOS {float(r["kafka_streams_eos"]):.0f}, KS txn {float(r["kafka_streams_txn"]):.0f}'
            for r in listed
        )
        fig.text(0.01, 0.01, note, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.04 if listed else 0, 1, 1))
    fig.savefig(png_path, dpi=110)
    print(f"chart: {png_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
