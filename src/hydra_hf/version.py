"""The hydra_hf version, in a module of its own: reading it imports nothing (not the package root,
whose import registers the Hydra classes with transformers)."""


__version__ = "0.1.0"
