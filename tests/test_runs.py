"""Runs that do not clobber each other, and JupyterLab for the head node, as people start them: `nxpretrain demo` twice
(a new run, then the same run taken further, each with its own executed notebook), a refused third call that writes
nothing, `nxpretrain runs`, and `nxpretrain lab` serving on localhost with its token."""
import json, os, re, shutil, subprocess, sys, time, urllib.error, urllib.request
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
    assert 'nxpretrain lab' in first.stdout and f'{run}/train.ipynb' in first.stdout               # what to open next
    assert f'nxpretrain evaluate {run}/checkpoints/step_2' in first.stdout
    assert f'04_train: done at step 2, run folder {run}' in first.stdout + first.stderr           # papermill's end

    again = nxp('demo', '--name', 'r1', '--max-steps', '3', cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (run / 'train.ipynb').read_bytes() == nb1 and images(run / 'train-2.ipynb') >= 1       # the first one kept
    assert f'run r1: step 3, last checkpoint {run}/checkpoints/step_3' in again.stdout

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


def test_papermill_in_a_terminal_says_how_it_went_and_links_the_run(tmp_path):
    """`papermill nbs/04_train.ipynb runs/x.ipynb --log-output` from a clone's nbs/: the step lines, then a closing
    line with the outcome and the absolute run folder in the clone's runs/; `nxpretrain runs` leads to runs/x.ipynb."""
    for folder in ('nbs', 'runs'): (tmp_path / folder).mkdir()
    (tmp_path / 'pyproject.toml').touch()
    shutil.copy(ROOT / 'nbs/04_train.ipynb', tmp_path / 'nbs')
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', '')}
    env.pop('IN_TEST', None)
    p = subprocess.run([sys.executable, '-m', 'papermill', '04_train.ipynb', '../runs/x.ipynb', '-p', 'max_steps', '2',
                        '-k', 'python3', '--log-output', '--no-progress-bar'], cwd=tmp_path / 'nbs', env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    said = [line for line in (p.stdout + p.stderr).splitlines()      # what the cells said, papermill's markers apart
            if line.strip() and not re.match(r'(Executing|Ending) Cell \d+-+$', line)]
    run = tmp_path.resolve() / 'runs/gpt3_tiny'
    assert any(re.match(r'step 2/2 \| loss [\d.]+ \| lr ', line) for line in said), said[-30:]
    assert said[-1] == f'04_train: done at step 2, run folder {run}', said[-10:]
    assert (run / 'checkpoints').is_dir() and not (tmp_path / 'nbs/runs').exists()
    listed = json.loads(nxp('runs', '--json', cwd=tmp_path / 'nbs').stdout)
    assert [(r['run'], r['exit_code'], r['notebooks']) for r in listed] == [
        ('gpt3_tiny', 0, [str(tmp_path.resolve() / 'runs/x.ipynb')])]


def test_lab_serves_localhost_with_its_token_and_stops_its_kernels(tmp_path):
    """`nxpretrain lab` on a clone: working copies of the stage notebooks under runs/lab/<user>/, the server on
    localhost with its token, and on SIGTERM nothing left behind – neither JupyterLab nor the kernel it started."""
    pytest.importorskip('jupyterlab')
    from nxpretrain.lab import descendants
    (tmp_path / 'nbs').mkdir()
    (tmp_path / 'pyproject.toml').touch()
    for nb in ('00_setup', '04_train'): shutil.copy(ROOT / f'nbs/{nb}.ipynb', tmp_path / 'nbs')
    code = 'import sys; from nxpretrain.cli import main; sys.exit(main(sys.argv[1:]))'
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    p = subprocess.Popen([sys.executable, '-c', code, 'lab', '--port', '18931', '--dir', str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = [p.stdout.readline()]
        while not lines[-1].startswith('then open:') and len(lines) < 8: lines.append(p.stdout.readline())
        copies = next(Path(m.group(1)) for m in [re.search(r'working copies of the stage notebooks: (\S+)', lines[0])])
        assert sorted(f.name for f in copies.iterdir()) == ['00_setup.ipynb', '04_train.ipynb'], lines
        assert copies.parent.parent == tmp_path / 'runs' and copies.parent.name == 'lab'
        port = int(re.search(r'port (\d+)', lines[1]).group(1))
        assert re.fullmatch(rf'On your laptop, forward the port:  ssh -N -L {port}:localhost:{port} \S+@\S+\n',
                            lines[2]), lines
        assert '@localhost' not in lines[2], lines
        url = re.search(r'then open:  (http://localhost:\d+/lab/tree/runs/lab/\S+/00_setup.ipynb\?token=(\w+))',
                        lines[-1])
        assert url and len(url.group(2)) >= 32, lines
        token, api = url.group(2), f'http://127.0.0.1:{port}/api'
        status = None
        for _ in range(120):
            try:
                status = json.load(urllib.request.urlopen(f'{api}/status?token={token}', timeout=2))
                break
            except (urllib.error.URLError, ConnectionError): time.sleep(0.5)
        assert status is not None and 'started' in status, 'JupyterLab did not answer within 60 s'
        with pytest.raises(urllib.error.HTTPError, match='403'):                                    # no token, no entry
            urllib.request.urlopen(f'{api}/contents', timeout=5)
        assert urllib.request.urlopen(url.group(1).replace('localhost', '127.0.0.1'), timeout=10).status == 200
        kernel = urllib.request.Request(f'{api}/kernels?token={token}', data=b'{"name": "python3"}', method='POST')
        assert urllib.request.urlopen(kernel, timeout=60).status == 201
        tree = []
        for _ in range(60):                       # the server, and under it the kernel's process
            if len(tree := descendants(p.pid)) >= 2: break
            time.sleep(0.5)
        assert len(tree) >= 2, tree
        p.send_signal(15)                         # to `nxpretrain lab` alone: what a job scheduler or `kill` does
        assert p.wait(60) == 0
        assert 'stopping JupyterLab and its kernels' in p.stdout.read()
        alive = [pid for pid in tree if Path(f'/proc/{pid}').exists()
                 and 'zombie' not in Path(f'/proc/{pid}/status').read_text()]
        assert not alive, [Path(f'/proc/{pid}/cmdline').read_bytes()[:200] for pid in alive]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 15)
            p.wait(30)
