"""The verbs that combine the library's wings: one module per verb, each a typed ``<Verb>Spec`` and one
function (the CLI is argparse and one call into here; no wing imports this package).

- :mod:`.serve`: ``hydra-hf serve``, a model folder behind Ray Serve (dynamic batching, the folder's own
  ``handler.py``).
"""
