"""Every family modeling file opens with its route map (which file and function its task model's ``forward``
runs, in order), and the map is what ``forward`` runs now: ``tools/route_maps.py`` traces a tiny model of every
family and renders the map; a committed map that differs (a renamed function, a new call) fails here, with the
command that rewrites it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("route_maps", REPO / "tools" / "route_maps.py")
route_maps = importlib.util.module_from_spec(spec)
sys.modules["route_maps"] = route_maps  # its dataclass looks its module up there
spec.loader.exec_module(route_maps)
LINE = re.compile(r"^#\s+(?P<file>[\w.]+): (?P<name>[\w.]+)$")


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return route_maps.expected_maps()


@pytest.mark.parametrize("name", route_maps.modeling_files())
def test_the_route_map_is_what_forward_runs(name, expected):
    block = route_maps.committed(route_maps.MODELING / name)
    assert block is not None, f"{name} has no route map; run python tools/route_maps.py --write"
    assert block == expected[name], f"{name}'s route map is stale; run python tools/route_maps.py --write"


@pytest.mark.parametrize("name", route_maps.modeling_files())
def test_every_line_names_a_function_of_a_shipped_file(name, expected):
    """The map names files a folder ships (or transformers) and functions those files define."""
    lines = [LINE.match(line) for line in expected[name].splitlines() if LINE.match(line)]
    assert len(lines) >= 10 and lines[0]["name"].split(".")[-1].startswith("forward")
    for line in lines:
        if line["file"] == "transformers":
            continue
        source = (route_maps.MODELING / line["file"]).read_text(encoding="utf-8")
        *owner, function = line["name"].split(".")
        assert re.search(rf"^\s*def {function}\(", source, re.M), line.group(0)
        assert all(re.search(rf"^class {cls}\b", source, re.M) for cls in owner), line.group(0)
