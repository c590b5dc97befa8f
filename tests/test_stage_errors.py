"""Stage notebooks under papermill: bad input ends the cell with nxpretrain's message (one line per problem, with its
fix), no traceback."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('stage, params, says', [('02_plan', ['-p', 'overrides', 'parallel.tp=3'], 'parallel.tp=3'),
                                                 ('04_train', ['-p', 'model', 'gpt3_nosuch'], 'gpt3_nosuch'),
                                                 ('04_train', ['-p', 'overrides', 'optim.nosuch=1'], 'optim.nosuch')])
def test_bad_input_ends_the_cell_in_one_line(tmp_path, stage, params, says):
    out = tmp_path / 'out.ipynb'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    r = subprocess.run(
        [sys.executable, '-m', 'papermill', str(ROOT / 'nbs' / f'{stage}.ipynb'), str(out), *params, '-k', 'python3',
         '--cwd', str(tmp_path), '--no-progress-bar'],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    [err] = [
        o for c in json.loads(out.read_text())['cells'] for o in c.get('outputs', []) if o['output_type'] == 'error'
    ]
    assert err['ename'] == 'RecipeError' and says in err['evalue'], err
    assert len(err['traceback']) == 1 and err['traceback'][0] == f"RecipeError: {err['evalue']}", err['traceback']
    # a line per problem, nothing else
    assert 'Traceback' not in err['traceback'][0] and 'File "' not in err['traceback'][0]
