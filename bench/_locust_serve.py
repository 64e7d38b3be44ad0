"""The locust file of bench/bench_serve.py: closed-loop clients (no wait between requests) posting one request after
another to a ``hydra-hf serve`` server, each response recorded for the bench to check against a direct call.

Run by bench_serve.py as its own process (``python -m locust --headless -f bench/_locust_serve.py ...``: locust
patches the standard library when it is imported, so it never shares a process with the bench). Settings come
from the environment:

- ``HYDRA_BENCH_TEXTS``: a JSON file holding the list of texts; request ``i`` sends text ``i % len(texts)``
  (``HYDRA_BENCH_TEXTS_PER_REQUEST`` consecutive texts per request, default 1);
- ``HYDRA_BENCH_MAX_REQUESTS``: the run stops after this many requests (locust's ``--run-time`` bounds its
  seconds);
- ``HYDRA_BENCH_RECORDS``: where the records go (JSON lines, written when the run stops): ``index``, ``start`` and
  ``end`` (``time.time()`` seconds), ``status`` and the answer (or the error).
"""

from __future__ import annotations

import itertools
import json
import os
import time

from locust import FastHttpUser, constant, events, task

TEXTS = json.loads(open(os.environ["HYDRA_BENCH_TEXTS"], encoding="utf-8").read())
PER_REQUEST = int(os.environ.get("HYDRA_BENCH_TEXTS_PER_REQUEST", "1"))
MAX_REQUESTS = int(os.environ["HYDRA_BENCH_MAX_REQUESTS"])
RECORDS = os.environ["HYDRA_BENCH_RECORDS"]
_counter = itertools.count()
_records: list[dict] = []


class ServeClient(FastHttpUser):
    wait_time = constant(0)  # closed loop: the next request leaves when the answer arrives

    @task
    def predict(self) -> None:
        index = next(_counter)
        if index >= MAX_REQUESTS:
            self.environment.runner.quit()
            return
        texts = [TEXTS[(index * PER_REQUEST + k) % len(TEXTS)] for k in range(PER_REQUEST)]
        start = time.time()
        with self.client.post("/predict", json={"inputs": texts}, catch_response=True) as response:
            end = time.time()
            record = {"index": index, "start": start, "end": end, "status": response.status_code}
            if response.status_code == 200:
                record["answer"] = response.json()
                response.success()
            else:
                record["error"] = (response.text or str(response.error))[:300]
                response.failure(record["error"])
            _records.append(record)


@events.quitting.add_listener
def _write(environment, **_) -> None:
    with open(RECORDS, "w", encoding="utf-8") as handle:
        for record in _records:
            handle.write(json.dumps(record) + "\n")
