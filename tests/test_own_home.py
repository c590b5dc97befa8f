"""The suite stays out of the user's records: a job test run the way the gate runs it, in a pytest of its own whose
HOME is a stand-in for the user's, leaves that HOME's `~/.cache/nxpretrain` without a job record – the records went to
the session's own NXPRETRAIN_HOME (tests/conftest.py)."""
import os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB_TEST = 'tests/test_launch.py::test_local_mode_passes_values_as_text'   # writes a job record through run_local


def test_job_tests_leave_the_users_job_index_alone(tmp_path):
    home = tmp_path / 'home'
    records = home / '.cache' / 'nxpretrain' / 'jobs.jsonl'
    records.parent.mkdir(parents=True)
    records.write_text('{"job_id": "the user\'s own job"}\n')
    env = {k: v for k, v in os.environ.items() if k not in ('NXPRETRAIN_HOME', 'NXPRETRAIN_PROJECT')}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    out = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', JOB_TEST,
                          '--basetemp', str(tmp_path / 'inner')], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert '1 passed' in out.stdout, out.stdout[-2000:]
    assert records.read_text() == '{"job_id": "the user\'s own job"}\n'
    # the job did write its record: into the session's own home, under the inner run's temporary folder
    written = list((tmp_path / 'inner').rglob('jobs.jsonl'))
    assert any('nxpretrain-home' in str(p) for p in written), written
