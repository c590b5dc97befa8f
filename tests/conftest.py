"""Shared pytest configuration: kept minimal. Test helpers live in the modules that own them.

The suite keeps out of the user's own records: it runs with an `NXPRETRAIN_HOME` of its own (the per-user job index
`jobs.jsonl` and what else nxpretrain keeps there), set before any test and inherited by every process a test starts,
and the session ends with an error if a record of one of its jobs (a path under its temporary folder) reached the
user's real `~/.cache/nxpretrain/jobs.jsonl`. (The user may submit jobs meanwhile: only the suite's records count.)

The gate runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`): a test file is one unit of work (its
module fixtures are built once), the files that start a local Slurm share one worker (their clusters share names,
ports and network namespaces) and so do the files that drive Chromium (two labs and two browsers at once would crowd a
small machine's memory and the tests' progress deadlines)."""
import os
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_RECORDS = Path.home() / '.cache' / 'nxpretrain' / 'jobs.jsonl'


# What a file's source holds that puts it in a shared worker (see above)
SHARED_WORKERS = {'slurm': ('LocalSlurm', 'start_cluster.sh'), 'browser': ('why_no_browser',)}


def worker_group(path: Path) -> str:
    "The xdist group of test file `path`: the shared worker its source asks for, else the file itself."
    text = path.read_text()
    return next((g for g, marks in SHARED_WORKERS.items() if any(m in text for m in marks)), path.stem)


@pytest.hookimpl(tryfirst=True)   # before xdist's worker hook, which turns the marks into each test's group
def pytest_collection_modifyitems(config, items):
    groups = {}
    for item in items:
        path = Path(item.path)
        if path not in groups: groups[path] = worker_group(path)
        item.add_marker(pytest.mark.xdist_group(groups[path]))


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
