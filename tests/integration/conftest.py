import os

import pytest

HERE = os.path.dirname(__file__)


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def base_overrides(tmp_path, micro_model, data) -> list:
    """Point the small test config at the fixtures."""
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"buffer.explorer_input.taskset.path={data['rl']}",
        f"buffer.explorer_input.eval_tasksets.0.path={data['rl']}",
    ]
