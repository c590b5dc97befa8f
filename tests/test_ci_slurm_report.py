"The machine report against a real Slurm: two nodes started with the launcher's tools/slurm scripts, then stopped."
import os, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get('NXP_SLURM_TOOLS', ROOT / 'tools' / 'slurm'))
NAME, PORT = 'nxpsetup', 6950   # its own cluster name and ports: other Slurm tests may run beside it


def why_not() -> str:
    if not (TOOLS / 'start_cluster.sh').exists(): return f'{TOOLS}/start_cluster.sh not present'
    if os.geteuid() != 0: return 'starting Slurm daemons needs root'
    if not (shutil.which('slurmctld') or Path('/usr/sbin/slurmctld').exists()):
        return 'Slurm not installed (tools/slurm/install.sh)'
    return ''


@pytest.fixture(scope='module')
def slurm_conf():
    r = subprocess.run(['bash', str(TOOLS / 'start_cluster.sh'), '--name', NAME, '--nodes', '2', '--port', str(PORT)],
                       capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, f'start_cluster.sh failed: {r.stderr[-2000:]}'
        yield r.stdout.strip().splitlines()[-1].split('=', 1)[1]
    finally:
        subprocess.run(['bash', str(TOOLS / 'stop_cluster.sh'), '--name', NAME], capture_output=True, timeout=120)


@pytest.mark.skipif(bool(why_not()), reason=f'no local Slurm: {why_not()}')
def test_report_sees_the_slurm_nodes(slurm_conf):
    code = ("from nxpretrain.machine import machine_report, recipe_gaps, readiness\nfrom nxpretrain.recipes import "
            "CATALOG\nfrom nxpretrain.launch.slurmcheck import slurm_info\nr = machine_report(slurm=slurm_info())\n"
            "print(r.slurm.version, len(r.slurm.node_names), "
            "sorted(r.slurm.partitions), r.slurm.error)\nprint('\\n'.join(recipe_gaps(CATALOG['gpt3_23b'], r, "
            "'/nowhere')))\nprint('\\n'.join(recipe_gaps(CATALOG['gpt3_64m'], r, '/nowhere')))\nprint(r)")
    env = {**os.environ, 'SLURM_CONF': slurm_conf, 'PYTHONPATH': str(ROOT)}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    first, *rest = out.stdout.splitlines()
    assert first.startswith('22.') or first.split()[0][:2].isdigit(), first
    assert first.split()[1:3] == ['2', "['debug']"], first
    assert 'cluster: needs 4 × trn1.32xlarge via Slurm; Slurm here has 2 nodes' in rest
    assert 'cluster: needs 2 × nd_h100_v5 via Slurm; 0 of the 2 Slurm nodes offer --gres=gpu:8' in rest
    assert any(l.startswith('Slurm') and 'debug: 2 nodes (idle)' in l for l in rest), out.stdout
