"""Shared pytest configuration: kept minimal. Test helpers live in the modules that own them.

The suite keeps out of the user's own records: it runs with an `NXPRETRAIN_HOME` of its own (the per-user job index
`jobs.jsonl` and what else nxpretrain keeps there), set before any test and inherited by every process a test starts,
and the session ends with an error if a record of one of its jobs (a path under its temporary folder) reached the
user's real `~/.cache/nxpretrain/jobs.jsonl`. (The user may submit jobs meanwhile: only the suite's records count.)"""
import os
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_RECORDS = Path.home() / '.cache' / 'nxpretrain' / 'jobs.jsonl'


def records(f: Path) -> list[str]:
    "The lines of job index `f` ([] when there is none)."
    return f.read_text(errors='replace').splitlines() if f.exists() else []


@pytest.fixture(scope='session')
def repo_root() -> Path:
    "The repository root (tests run from anywhere)."
    return ROOT


@pytest.fixture(scope='session', autouse=True)
def own_home(tmp_path_factory):
    """The suite's own NXPRETRAIN_HOME (unless the gate gave one) and JupyterLab state, no project root from a lab;
    afterwards the user's job index holds none of the session's jobs."""
    before = len(records(USER_RECORDS))
    saved = {k: os.environ.get(k) for k in ('NXPRETRAIN_HOME', 'NXPRETRAIN_PROJECT')}
    if not os.environ.get('NXPRETRAIN_HOME') or Path(os.environ['NXPRETRAIN_HOME']).resolve() == USER_RECORDS.parent:
        os.environ['NXPRETRAIN_HOME'] = str(tmp_path_factory.mktemp('nxpretrain-home'))
    os.environ.pop('NXPRETRAIN_PROJECT', None)
    # JupyterLab keeps its open tabs and settings under ~/.jupyter/lab: a test's lab keeps them to itself (a restored
    # workspace would also reopen the previous test's notebooks, each with a kernel)
    for var, sub in (('JUPYTERLAB_WORKSPACES_DIR', 'workspaces'), ('JUPYTERLAB_SETTINGS_DIR', 'user-settings')):
        saved[var] = os.environ.get(var)
        os.environ[var] = str(tmp_path_factory.mktemp(f'jupyterlab-{sub}'))
    yield Path(os.environ['NXPRETRAIN_HOME'])
    for k, v in saved.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    ours = str(tmp_path_factory.getbasetemp())
    written = [r for r in records(USER_RECORDS)[before:] if ours in r]
    assert not written, f"a test wrote job records into the user's {USER_RECORDS}: {written[:3]}"
