"""Runs that do not clobber each other, and JupyterLab for the head node, as people start them: `nxpretrain demo` twice
(a new run, then the same run taken further, each with its own executed notebook), a refused third call that writes
nothing, `nxpretrain runs`, and `nxpretrain lab` serving on localhost with its token."""
import json, os, re, subprocess, sys, time, urllib.error, urllib.request
from pathlib import Path
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


def nxp(*argv, cwd, timeout=300) -> subprocess.CompletedProcess:
    code = 'import sys; from nxpretrain.cli import main; sys.exit(main(sys.argv[1:]))'
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', '')}
    return subprocess.run([sys.executable, '-c', code, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def images(nb: Path) -> int:
    "How many image outputs an executed notebook holds."
    cells = nbformat.read(nb, as_version=4).cells
    return sum('image/png' in o.get('data', {}) for c in cells if c.cell_type == 'code' for o in c.outputs)


def test_second_demo_goes_on_in_its_own_notebook(tmp_path):
    first = nxp('demo', '--name', 'r1', '--max-steps', '2', cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = tmp_path / 'runs/r1'
    nb1 = (run / 'train.ipynb').read_bytes()
    assert images(run / 'train.ipynb') >= 1
    assert 'nxpretrain lab' in first.stdout and f'runs/r1/train.ipynb' in first.stdout             # what to open next
    assert 'nxpretrain evaluate runs/r1/checkpoints/step_2' in first.stdout

    again = nxp('demo', '--name', 'r1', '--max-steps', '3', cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (run / 'train.ipynb').read_bytes() == nb1 and images(run / 'train-2.ipynb') >= 1       # the first one kept
    assert 'run r1: step 3, last checkpoint runs/r1/checkpoints/step_3' in again.stdout

    refused = nxp('demo', '--name', 'r1', '--max-steps', '3', cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        'nxpretrain demo: run r1 is already at step 3: give --max-steps above 3 to train it further, or another '
        '--name for a new run')
    assert sorted(p.name for p in run.glob('train*.ipynb')) == ['train-2.ipynb', 'train.ipynb']

    listed = json.loads(nxp('runs', '--json', cwd=tmp_path).stdout)
    assert [(r['run'], r['model'], r['step'], Path(r['checkpoint']).name, r['notebooks']) for r in listed] == [
        ('r1', 'gpt3_tiny', 3, 'step_3', ['train.ipynb', 'train-2.ipynb'])]
    table = nxp('runs', cwd=tmp_path).stdout
    assert re.search(r'^r1\s+gpt3_tiny\s+3\s+\d+\.\d+\s+step_3\s+train-2\.ipynb$', table, re.M), table


def test_lab_serves_localhost_with_its_token(tmp_path):
    pytest.importorskip('jupyterlab')
    (tmp_path / 'nbs').mkdir()
    code = 'import sys; from nxpretrain.cli import main; sys.exit(main(sys.argv[1:]))'
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    p = subprocess.Popen([sys.executable, '-c', code, 'lab', '--port', '18931', '--dir', str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = [p.stdout.readline() for _ in range(3)]
        port = int(re.search(r'port (\d+)', lines[0]).group(1))
        assert re.fullmatch(rf'On your laptop, forward the port:  ssh -N -L {port}:localhost:{port} \S+@\S+\n',
                            lines[1]), lines
        url = re.search(r'then open:  (http://localhost:\d+/lab\?token=(\w+))', lines[2])
        assert url and len(url.group(2)) >= 32, lines
        status = None
        for _ in range(120):
            try:
                status = json.load(
                    urllib.request.urlopen(f'http://127.0.0.1:{port}/api/status?token={url.group(2)}', timeout=2)
                )
                break
            except (urllib.error.URLError, ConnectionError): time.sleep(0.5)
        assert status is not None and 'started' in status, 'JupyterLab did not answer within 60 s'
        with pytest.raises(urllib.error.HTTPError, match='403'):                                    # no token, no entry
            urllib.request.urlopen(f'http://127.0.0.1:{port}/api/contents', timeout=5)
        assert urllib.request.urlopen(url.group(1).replace('localhost', '127.0.0.1'), timeout=10).status == 200
    finally:
        os.killpg(p.pid, 15)
        p.wait(30)
