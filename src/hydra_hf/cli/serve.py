"""`hydra-hf serve`: a model folder behind an HTTP server (Ray Serve) with dynamic batching, answering with the
folder's own handler.py. A thin layer over :func:`hydra_hf.workflows.serve.serve`; see docs/serve.md."""

from __future__ import annotations

import argparse

from ..modeling.handler import MAX_INPUTS
from ..workflows.serve import BACKENDS, ServeSpec, serve
from . import finite_float


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a folder over HTTP with its uncertainty (Ray Serve, dynamic batching)",
        description="Serve a Hydra folder (or an ONNX export of one, or a stock text / image classifier) over HTTP "
        "on Ray Serve: POST / and /predict take the Inference Endpoints JSON ({\"inputs\": ..., \"parameters\": "
        "{...}}) and answer with the folder's handler.py (per input a list of {label, score} with the uncertainty; a "
        "causal LM's generated text with every token's uncertainty, streamed with \"stream\": true); GET /health. "
        "Concurrent requests are batched into one padded forward pass. Needs the serve extra: pip install "
        "'hydra-hf[serve]'. Stops gracefully on Ctrl-C / SIGTERM (the requests already accepted are answered).",
    )
    p.add_argument("model", metavar="DIR", help="the folder to serve (hydra-hf convert / finetune / calibrate; with "
                   "--backend onnx: hydra-hf export's folder)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--replicas", type=int, default=1, help="model replicas, each a process (default 1)")
    p.add_argument("--max-batch-size", type=int, default=32,
                   help="inputs per forward pass at most (default 32); a larger request is split")
    p.add_argument("--batch-wait-ms", type=finite_float, default=5.0,
                   help="how long a batch waits for more requests after its first (default 5 ms)")
    p.add_argument("--backend", default="torch", choices=BACKENDS,
                   help="torch (the folder's weights) or onnx (an export folder: its int8 graph when it has one)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch / ONNX Runtime threads per replica, and the CPUs Ray reserves for it (default 1)")
    p.add_argument("--max-inputs", type=int, default=MAX_INPUTS,
                   help=f"inputs one request may hold (default {MAX_INPUTS}); more is a 400 answer")
    p.add_argument("--address", default=None,
                   help="join a running Ray cluster (the address `ray start --head` prints, e.g. HEAD:6379) instead "
                   "of starting Ray here; replicas spread over its nodes")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="port of Ray's Prometheus metrics (Ray Serve's request counters and latencies, the "
                   "hydra_batch_inputs histogram); default: Ray picks one")
    p.add_argument("--trust-foreign-code", action="store_true",
                   help="serve a folder whose handler.py is not the file hydra_hf ships (you vouch for it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = ServeSpec(model=args.model, host=args.host, port=args.port, replicas=args.replicas,
                     max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms, backend=args.backend,
                     threads=args.threads, max_inputs=args.max_inputs, address=args.address,
                     metrics_port=args.metrics_port, trust_foreign_code=args.trust_foreign_code)
    handle = serve(spec, block=True)
    print(f"stopped serving {spec.model} at {handle.url}")
    return 0
