"""Convert one ServeGen model's clients into the compact day trace that `read_servegen` draws from.

ServeGen (Alibaba Model Studio's characterization of its LLM serving, Apache-2.0) publishes, per
model and per client, one row per 10-minute window (`start_s, rate, cv, family, shape, scale`:
the window's request rate and the Weibull or Gamma fit of its inter-arrival times) and, per
6-hour block, the PMFs of the client's prompt and output lengths. That is 117 MB for the
m-large model; this keeps what a request stream needs in a few hundred KB:

- the `--clients` clients with the most requests over the kept days, each as its own stream
  (its rate and fitted IAT family and shape per window: their bursts stay theirs);
- every other client merged into one stream whose rate is their summed rate and whose arrivals
  are Poisson (the sum of many small independent streams tends to Poisson);
- per 6-hour block, one PMF of prompt and one of output lengths: every client's PMF weighted by
  its requests in the block, on log-spaced bins (4 per octave), as integer parts per million.
  Clients whose dataset file is absent (ServeGen's largest files are not in every copy) keep
  their arrivals and take the block's merged lengths; the converter lists them.

    .venv/bin/python bench/traces/servegen.py SERVEGEN/data/language/m-small \
        bench/traces/servegen_m_large.json --days 7 --day 6 --rate-scale 0.1 --commit COMMIT
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

WINDOW_S = 600
BLOCK_S = 21600  # ServeGen's length PMFs are per 6-hour block
BINS_PER_OCTAVE = 4
PPM = 1_000_000
FAMILIES = {"Gamma": "G", "Weibull": "W"}


def log_edges(largest: int) -> list[int]:
    """Bin edges 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, … (4 per octave), past `largest`."""
    edges = [1]
    i = 1
    while edges[-1] <= largest:
        edge = round(2 ** (i / BINS_PER_OCTAVE))
        if edge > edges[-1]:
            edges.append(edge)
        i += 1
    return edges


def read_windows(path: Path, windows: int) -> list[tuple[float, str, float]]:
    """A client's first `windows` rows as (rate, family letter or '-', shape)."""
    out = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            rate = float(row[1])
            family = FAMILIES.get(row[3], "-") if rate > 0 else "-"
            if rate > 0 and family == "-":
                raise ValueError(f"{path}: window {row[0]} has rate {rate} but family {row[3]!r}")
            out.append((rate, family, float(row[4]) if family != "-" else 0.0))
    if len(out) < windows:
        raise ValueError(f"{path} has {len(out)} windows, fewer than {windows}")
    return out[:windows]


def read_pmfs(path: Path, blocks: int) -> dict[int, dict[str, dict[int, float]]]:
    """A client's length PMFs per block index: {block: {"input_tokens": {tokens: p}, …}}."""
    raw = json.loads(path.read_text())
    out: dict[int, dict[str, dict[int, float]]] = {}
    for start, fields in raw.items():
        block = int(float(start)) // BLOCK_S
        if block < blocks:
            # ServeGen writes each PMF as a Python dict literal ({224: 0.0003, …}).
            out[block] = {k: ast.literal_eval(fields[k]) for k in ("input_tokens", "output_tokens")}
    return out


def _sig(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")


def convert(
    source: Path, *, days: int, clients: int, commit: str, rate_scale: float, day: int
) -> dict:
    windows = days * 86400 // WINDOW_S
    blocks = days * 86400 // BLOCK_S
    number = re.compile(r"chunk-(\d+)-trace\.csv")
    ids = sorted(int(m.group(1)) for p in source.iterdir() if (m := number.fullmatch(p.name)))
    if not ids:
        raise ValueError(f"{source} has no chunk-N-trace.csv")
    rows = {i: read_windows(source / f"chunk-{i}-trace.csv", windows) for i in ids}
    volume = {i: sum(r for r, _, _ in rows[i]) for i in ids}
    top = sorted(ids, key=lambda i: -volume[i])[:clients]
    rest = [i for i in ids if i not in top]
    streams = [
        {
            "clients": [f"chunk-{i}"],
            "rate": [_sig(r, 4) for r, _, _ in rows[i]],
            "family": "".join(f for _, f, _ in rows[i]),
            "shape": [_sig(s, 3) for _, _, s in rows[i]],
        }
        for i in top
    ]
    merged = [sum(rows[i][w][0] for i in rest) for w in range(windows)]
    streams.append(
        {
            "clients": [f"chunk-{i}" for i in rest],
            "rate": [_sig(r, 4) for r in merged],
            "family": "".join("G" if r > 0 else "-" for r in merged),
            "shape": [1.0 if r > 0 else 0.0 for r in merged],  # Gamma of shape 1: Poisson
        }
    )
    absent = [i for i in ids if not (source / f"chunk-{i}-dataset.json").is_file()]
    weight: dict[str, list[dict[int, float]]] = {
        k: [defaultdict(float) for _ in range(blocks)] for k in ("input_tokens", "output_tokens")
    }
    largest = 1
    for i in ids:
        if i in absent:
            continue
        pmfs = read_pmfs(source / f"chunk-{i}-dataset.json", blocks)
        for block, fields in pmfs.items():
            span = range(block * BLOCK_S // WINDOW_S, (block + 1) * BLOCK_S // WINDOW_S)
            requests = sum(rows[i][w][0] for w in span)
            for key, pmf in fields.items():
                for tokens, p in pmf.items():
                    weight[key][block][max(1, int(tokens))] += requests * p
                    largest = max(largest, int(tokens))
    edges = log_edges(largest)
    lengths = {}
    for key, per_block in weight.items():
        binned = []
        for block, pmf in enumerate(per_block):
            total = sum(pmf.values())
            if total <= 0:
                raise ValueError(f"{source}: no {key} PMF for block {block}")
            bins = [0.0] * (len(edges) - 1)
            for tokens, w in pmf.items():
                bins[_bin(edges, tokens)] += w / total
            ppm = [round(PPM * b) for b in bins]
            while ppm and ppm[-1] == 0:
                ppm.pop()
            binned.append(ppm)
        lengths[key.removesuffix("_tokens")] = binned
    return {
        "format": "wok-servegen-1",
        "source": f"ServeGen {source.parent.name}/{source.name}, commit {commit}",
        "licence": "Apache-2.0",
        "window_s": WINDOW_S,
        "block_s": BLOCK_S,
        "days": days,
        # What a reader draws unless asked otherwise: one day, at a rate one service sees.
        "default_day": day,
        "default_rate_scale": rate_scale,
        "absent_datasets": [f"chunk-{i}" for i in absent],
        "streams": streams,
        "edges": edges,
        "input_ppm": lengths["input"],
        "output_ppm": lengths["output"],
    }


def _bin(edges: list[int], tokens: int) -> int:
    """The bin [edges[k], edges[k + 1]) that holds `tokens`."""
    lo, hi = 0, len(edges) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if edges[mid] <= tokens else (lo, mid)
    return lo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a ServeGen data/<category>/<model> folder")
    parser.add_argument("out", type=Path)
    parser.add_argument("--days", type=int, default=7, help="the first DAYS days (ServeGen: 14)")
    parser.add_argument("--clients", type=int, default=8, help="clients kept as their own stream")
    parser.add_argument("--commit", default="unknown", help="the ServeGen commit, for the record")
    parser.add_argument("--day", type=int, default=0, help="the day a reader draws by default")
    parser.add_argument(
        "--rate-scale", type=float, default=1.0, help="the rate multiplier a reader uses by default"
    )
    args = parser.parse_args()
    if args.days < 1 or args.clients < 0 or not 0 <= args.day < args.days or args.rate_scale <= 0:
        raise SystemExit("want --days >= 1, --clients >= 0, 0 <= --day < --days, --rate-scale > 0")
    trace = convert(
        args.source,
        days=args.days,
        clients=args.clients,
        commit=args.commit,
        rate_scale=args.rate_scale,
        day=args.day,
    )
    args.out.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    kib = args.out.stat().st_size / 1024
    print(f"wrote {args.out} ({kib:.0f} KiB, {len(trace['streams'])} streams)", file=sys.stderr)
    for name in trace["absent_datasets"]:
        print(f"absent: {name}-dataset.json (it takes the merged lengths)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
