"""Every YAML under examples/ loads and validates (with its environment defaults)."""

import glob
import os

import pytest

from trinity.common.config import load_config
from trinity.preflight.derive import finalize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.yaml"), recursive=True))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.relpath(p, ROOT))
def test_example_config_validates(path):
    config = load_config(path)
    stages = [finalize(stage) for stage in config.stage_configs()]
    assert stages and all(s.buffer.batch_size > 0 for s in stages)


def test_there_are_examples():
    assert EXAMPLES
