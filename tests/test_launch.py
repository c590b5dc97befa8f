"""Launcher checks that need processes but no Slurm: every generated script is valid bash, and the local mode hands
adversarial values to the ranks as text."""
import json, subprocess, sys
from pathlib import Path
import pytest
from nxpretrain.recipes import CATALOG
from nxpretrain.errors import RecipeError
from nxpretrain.launch.job import export_jobs, make_job, make_array_job
from nxpretrain.launch.local import run_local
from nxpretrain.engines.base import engine_of


@pytest.mark.parametrize('name', sorted(CATALOG))
def test_every_catalog_job_is_valid_bash(name, tmp_path):
    r = CATALOG[name]
    jobs = list(export_jobs(engine_of(r), r, tmp_path / 'job').values())
    for job in jobs:
        p = subprocess.run(['bash', '-n', str(job.script_path)], capture_output=True, text=True)
        assert p.returncode == 0, (name, job.kind, p.stderr)
        assert job.script.count('#SBATCH --nodes=') == 1
    node_script = jobs[-1].argv[0]   # a framework's script that srun runs on every node
    if not jobs[-1].distributed and node_script.endswith('.sh'):
        assert subprocess.run(['bash', '-n', node_script]).returncode == 0


EVIL = ["$(touch {p})", "`touch {p}`", "'; touch {p}; '", '"; touch {p}; "', "x\ntouch {p}", "a && touch {p} || b",
        "| touch {p}", "$HOME * ? ~ {{a,b}} \\ %x"]


def test_local_mode_passes_values_as_text(tmp_path):
    pwned = tmp_path / 'pwned'
    # a recipe name becomes a folder and a job name: metacharacters there are refused before anything is written
    with pytest.raises(RecipeError, match="name="):
        make_job('gpt3_tiny', 'local', tmp_path / 'bad', overrides=[f"name={EVIL[0].format(p=pwned)}"])
    assert not (tmp_path / 'bad').exists()
    overrides = [f"source={EVIL[0].format(p=pwned)}"] + [f"notes={e.format(p=pwned)}" for e in EVIL[1:]]
    dump = tmp_path / 'dump.py'
    dump.write_text("import sys, json, os, "
                    "pathlib\npathlib.Path(os.environ['DUMP']).write_text(json.dumps(sys.argv[1:]))\n")
    job = make_job('gpt3_tiny', 'local', tmp_path / 'job', overrides=overrides, entry=str(dump))
    res = run_local(job, echo=False, env={'DUMP': str(tmp_path / 'argv.json')}, timeout=120)
    assert res.exit_code == 0, Path(res.log).read_text()
    assert json.loads((tmp_path / 'argv.json').read_text()) == ['--recipe', str(job.recipe_path), *overrides]
    assert not pwned.exists()


def test_array_script_quotes_its_command(tmp_path):
    pwned = tmp_path / 'pwned'
    job = make_array_job(f"x; touch {pwned}", ['echo', f"$(touch {pwned})"], tmp_path / 'arr', tasks=2, cluster='cpu')
    assert f"srun --ntasks=1 echo '$(touch {pwned})'" in job.script
    # the script body, run by bash outside Slurm (srun replaced by `env`), prints the value and runs nothing
    body = job.script.replace('srun --ntasks=1 ', 'env ')
    out = subprocess.run(['bash', '-c', body], capture_output=True, text=True, env={'PATH': '/usr/bin:/bin'})
    assert f"$(touch {pwned})" in out.stdout and not pwned.exists()
