"Shared pytest configuration: kept minimal. Test helpers live in the modules that own them."
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='session')
def repo_root() -> Path:
    "The repository root (tests run from anywhere)."
    return ROOT
