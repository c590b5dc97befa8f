"""Each node's use, gathered on a running job's own nodes: a real two-node Slurm here (network namespaces), a job that
holds both nodes, and `nxpretrain watch JOB --nodes` asking each node through `srun --overlap` with the /proc collector
(no GPU or Trainium here: their parsers are tested on recorded outputs in nbs/api/59_nodes.ipynb)."""
import contextlib, fcntl, io, os, re, subprocess, time
import pytest
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm

REASON = why_no_slurm(install=False)
pytestmark = [pytest.mark.skipif(bool(REASON), reason=f"cannot run: {REASON}"), pytest.mark.timeout(300)]


@pytest.fixture(scope='module')
def two_nodes():
    with open('/tmp/nxp-slurm.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                       # one local Slurm test at a time
        with LocalSlurm('nodes2', nodes=2, netns=True, port=6834) as c: yield c


def test_watch_shows_both_nodes(two_nodes, tmp_path):
    from nxpretrain.cli import main
    from nxpretrain.launch.slurm import SlurmLauncher
    p = subprocess.run(['sbatch', '--parsable', '-N', '2', '-o', str(tmp_path / 'j.log'), '--wrap', 'sleep 120'],
                       capture_output=True, text=True, check=True)
    job = p.stdout.strip().split(';')[0]
    try:
        t0 = time.time()
        while time.time() - t0 < 60:
            if (
                subprocess.run(['squeue', '-h', '-j', job, '-o', '%T'], capture_output=True, text=True).stdout.strip()
                == 'RUNNING'
            ):
                break
            time.sleep(0.5)
        rows = SlurmLauncher().node_usage(job)     # only the Slurm launcher runs Slurm's commands
        assert len(rows) == 2 and len({r['node'] for r in rows}) == 2, rows
        for r in rows: assert 0 <= r['cpu'] <= 100 and 0 < r['mem_used_bytes'] < r['mem_total_bytes'], r
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try: main(['watch', job, '--nodes', '--timeout', '1'])
            except SystemExit: pass
        lines = out.getvalue().splitlines()
        assert lines[0].split() == ['node', 'cpu', 'memory', 'accelerators'], lines
        assert sorted(l.split()[0] for l in lines[1:3]) == sorted(r['node'] for r in rows), lines
        assert all(re.search(r'\d+%\s+[\d.]+/[\d.]+ GiB\s+–$', l) for l in lines[1:3]), lines
    finally:
        subprocess.run(['scancel', job])


def test_monitor_shows_both_nodes_and_the_end(two_nodes, tmp_path):
    "`05_monitor`'s job view on a two-node job: both nodes' rows while it runs; its final state and elapsed time after."
    from nxpretrain import monitor
    p = subprocess.run(
        ['sbatch', '--parsable', '-N', '2', '-o', str(tmp_path / 'j.log'), '--wrap', 'echo started; sleep 120'],
        capture_output=True,
        text=True,
        check=True,
    )
    job = p.stdout.strip().split(';')[0]
    try:
        t0 = time.time()
        while str(monitor.job_status(job).state) != 'RUNNING' and time.time() - t0 < 60: time.sleep(0.5)
        running = time.time()
        t = monitor.node_table(job)
        assert t.header == ['node', 'cpu', 'memory', 'accelerators'] and len(t.rows) == 2, t
        assert len({r[0] for r in t.rows}) == 2 and all(r[3] == '–' for r in t.rows), t
        row = monitor.status_table(job).rows[0]
        assert row[2] == 'RUNNING' and row[3].startswith('2 '), row
        time.sleep(max(0.0, running + 2 - time.time()))   # Slurm counts whole seconds: let it run two before the cancel
    finally:
        subprocess.run(['scancel', job])
    t0 = time.time()
    while not (s := monitor.job_status(job)).done and time.time() - t0 < 30: time.sleep(0.5)
    assert str(s.state) == 'CANCELLED' and s.elapsed_s >= 2, s
    assert monitor.status_table(job).rows[0][2] == 'CANCELLED'
