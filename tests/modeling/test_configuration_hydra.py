"""The attribute contract of every family's Hydra config, as transformers' ``ConfigTester`` checks it: a config
built without arguments answers the common properties (``hidden_size``, ``num_attention_heads``,
``num_hidden_layers``, ``vocab_size``) as its base model type's stock config built without arguments does, and a
property whose value the base does not give raises ``AttributeError`` (what ``hasattr`` and
``getattr(config, name, default)`` catch), never another error."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

import hydra_hf  # noqa: F401  (registers every family)
from hydra_hf.families import families

CONFIG_CLASSES = sorted({family.config_class() for family in families()}, key=lambda cls: cls.__name__)
COMMON = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
ids = [cls.__name__ for cls in CONFIG_CLASSES]


def _properties(config_class: type) -> list[str]:
    """The properties the Hydra config classes define (transformers' own are not this contract's)."""
    return sorted(
        name
        for klass in config_class.__mro__
        if klass.__module__.startswith("hydra_hf.")
        for name, value in vars(klass).items()
        if isinstance(value, property)
    )


@pytest.mark.parametrize("config_class", CONFIG_CLASSES, ids=ids)
def test_a_config_built_without_arguments_answers_the_common_properties_as_its_stock_base(config_class):
    config = config_class()
    stock = AutoConfig.for_model(config.base_model_type)
    for name in COMMON:
        if hasattr(stock, name):  # a two-tower base keeps vocab_size in its text tower
            assert getattr(config, name) == getattr(stock, name), name
    assert config.base_config == {} and config.kept_heads == []  # answered, not stored
    saved = json.loads(config.to_json_string(use_diff=False))
    assert saved["base_config"] == {} and "hidden_size" not in saved


@pytest.mark.parametrize("config_class", CONFIG_CLASSES, ids=ids)
def test_every_property_raises_attribute_error_when_the_base_lacks_its_value(config_class):
    """A config that names members but has no base settings (its base_config emptied after it was built): every
    property answers or raises AttributeError, so hasattr() answers False instead of raising."""
    config = config_class()
    two_towers = hasattr(config, "vision_kept_heads")  # CLIP, SigLIP: their members are named per tower
    setattr(config, "vision_kept_heads" if two_towers else "kept_heads", [[[0]]])
    names = _properties(config_class)
    assert {"hidden_size", "num_attention_heads", "num_hidden_layers"} <= set(names)
    for name in names:
        hasattr(config, name)  # any error but AttributeError escapes hasattr() and fails the test
    assert not hasattr(config, "hidden_size") and not hasattr(config, "num_hidden_layers")
    assert getattr(config, "num_attention_heads", None) is None
    with pytest.raises(AttributeError, match="hidden_size|base_config"):
        config.hidden_size

