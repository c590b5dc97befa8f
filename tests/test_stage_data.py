"""The data stage uses the stage folder: with `NXPRETRAIN_STAGE` set, `nxpretrain data` writes under its `data/`, where
the cluster jobs read (`nxpretrain.data_paths.data_root`)."""
import os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def data_cli(args, cwd, **env):
    full = {**os.environ, 'PYTHONPATH': str(ROOT), **env}
    full.pop('NXPRETRAIN_DATA', None)
    code = 'import sys; from nxpretrain.cli import main; main(sys.argv[1:])'
    return subprocess.run([sys.executable, '-c', code, 'data', *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=600)


def test_the_data_stage_writes_under_the_stage(tmp_path):
    stage = tmp_path / 'fsx' / 'stage'
    p = data_cli(['demo', '--workers', '1', '--no-progress'], tmp_path, NXPRETRAIN_STAGE=str(stage))
    assert p.returncode == 0, p.stderr[-2000:]
    written = sorted(f.relative_to(stage).parts[0] for f in stage.rglob('*.idx'))
    assert written and set(written) == {'data'}, written
    assert not (tmp_path / 'runs').exists()


def test_its_help_names_the_stage_default(tmp_path):
    p = data_cli(['--help'], tmp_path, NXPRETRAIN_STAGE='/fsx/stage')
    assert '(default: /fsx/stage/data)' in ' '.join(p.stdout.split())
