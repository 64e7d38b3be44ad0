"""The verbs that combine the library's wings: one module per ``hydra-hf`` verb, each a typed, frozen
``<Verb>Spec`` (checked when it is built: one line naming the value and the fix) and one function that
does the verb. ``hydra_hf.cli`` is argparse and one call into here; no wing below imports this package
(the recipes above it do).

- :mod:`.prune`: ``hydra-hf prune``, the head masks of M members chosen on a model's data
  (:func:`~.prune.build_members`: data specs -> masks, the path every recipe takes too).
- :mod:`.convert`: ``hydra-hf convert``, checkpoints and a masks file fused into one Hydra folder.
- :mod:`.finetune`: ``hydra-hf finetune``, the members fine-tuned, then fused (or the fused model trained).
- :mod:`.calibrate`: ``hydra-hf calibrate``, a copy of a folder with calibrated decisions in its config.
- :mod:`.evaluate`: ``hydra-hf evaluate``, a model folder and its baselines measured: report.json, report.md,
  figures.
- :mod:`.aggregate`: ``hydra-hf aggregate``, one report of several seeds' reports.
- :mod:`.export`: ``hydra-hf export``, a Hydra folder as one ONNX graph (and its int8 graph, measured).
- :mod:`.push`: ``hydra-hf push``, a folder staged, validated and uploaded to the Hub in one commit.
- :mod:`.serve`: ``hydra-hf serve``, a model folder behind Ray Serve (dynamic batching, the folder's own
  ``handler.py``).
"""
