"""The step-time model against its published anchors: every anchor within ±25 %, the fractions in `FITS` equal to
their fits, the seeds' recipes equal to the seeds' layouts, and `nxpretrain plan` printing the breakdown."""
import json
import os
import subprocess
import sys

import pytest

from nxpretrain.plan import plan
from nxpretrain.config import data_parallel_size
from nxpretrain.recipes import get_recipe
from nxpretrain.calibration import anchor_step, calibration, fit_achievable
from nxpretrain.steptime import ANCHORS, FITS


@pytest.mark.parametrize('row', calibration(), ids=lambda r: r['anchor'])
def test_anchor_within_25_percent(row):
    assert abs(row['error']) <= 0.25, row


def test_fractions_are_the_fits():
    for framework, device in {(a.framework, a.device) for a in ANCHORS}:
        fit = fit_achievable(framework, device)
        assert fit == pytest.approx(FITS[framework, device].achievable, abs=0.005), (framework, device)


def test_every_framework_fitted_on_part_and_gpus_held_out_on_the_rest():
    key = lambda a: (a.framework, a.device)
    roles = {key(a): {b.role for b in ANCHORS if key(b) == key(a)} for a in ANCHORS}
    assert all('fit' in r for r in roles.values())
    assert roles['Megatron-LM', 'a100'] == roles['Megatron-LM', 'h100'] == {'fit', 'held-out'}
    assert sum(a.role == 'held-out' for a in ANCHORS) >= 5


def test_seed_recipes_reproduce_the_seed_layouts():
    r23, r70 = get_recipe('gpt3_23b'), get_recipe('llama3_70b')
    # seed 0: TP 8, PP 4, DP 4 on 4 nodes, micro 1, global 32 × nodes, seq 2048; its log: 128 samples a step
    assert (r23.parallel.tp, r23.parallel.pp, data_parallel_size(r23), r23.cluster.nodes) == (8, 4, 4, 4)
    assert (r23.data.micro_batch, r23.data.global_batch, r23.model.seq_len) == (1, 128, 2048)
    # seed 4 / NxD Training hf_llama3_70B_config.yaml: TP 32, PP 8 on 16 nodes, micro 1, global 1024, seq 8192
    assert (r70.parallel.tp, r70.parallel.pp, r70.cluster.nodes, r70.parallel.kv_replicator) == (32, 8, 16, 4)
    assert (r70.data.micro_batch, r70.data.global_batch, r70.model.seq_len) == (1, 1024, 8192)
    assert r70.parallel.zero1 and r70.parallel.sequence_parallel
    assert r70.parallel.checkpoint_modules == ['attention', 'mlp']


def test_breakdown_adds_up_and_the_bubble_follows_the_schedule():
    st = plan('llama3_70b').step
    assert st.total == pytest.approx(st.compute + st.bubble + sum(l.exposed for l in st.links))
    assert plan('llama3_70b').step_seconds == pytest.approx(st.total)
    assert st.bubble == pytest.approx(7 / 512 * st.compute)                       # 1F1B: (p−1) of m micro-batches
    inter = plan(get_recipe('llama3_70b', 'parallel.virtual_pp=2', 'parallel.pp_schedule=interleaved')).step
    assert inter.bubble == pytest.approx(st.bubble / 2, rel=0.01)                # interleaved: ÷ v


def test_anchor_error_moves_with_the_formula():
    a = next(a for a in ANCHORS if a.role == 'held-out')
    base = anchor_step(a).total
    assert anchor_step(a, FITS[a.framework, a.device].achievable / 2).total > 1.5 * base


def _cli(*argv) -> str:
    code = f"from nxpretrain.cli import main; main({list(argv)!r})"
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, timeout=120).stdout


def test_cli_prints_the_breakdown():
    out = _cli('plan', 'llama3_70b')
    for item in ('step time', 'compute', 'tp comm (NeuronLink)', 'dp comm (EFA)', 'bubble'):
        assert item in out, out
    rows = {line.split('  ')[0]: line.split('  ', 1)[1].strip() for line in out.splitlines() if '  ' in line}
    assert rows['engine'] == 'NxD Training (nxdt)' and rows['published'].startswith('321 s with NxD Training'), out
    d = json.loads(_cli('plan', 'gpt3_175b_gpu', '--json'))
    assert d['step']['comm']['tp']['link'] == 'NVLink' and d['step']['comm']['pp']['link'] == 'InfiniBand'
    assert d['step_seconds'] == pytest.approx(d['step']['compute'] + d['step']['bubble'] +
                                              sum(c['exposed'] for c in d['step']['comm'].values()))


def test_cli_compares_a_published_figure_only_with_its_own_run():
    "An override that makes another run (32 nodes, not seed 4's 16) names what differs and gives no percentage."
    out = _cli('plan', 'llama3_70b', 'cluster.nodes=32')
    lines = [line for line in out.splitlines() if line.startswith('published')]
    assert lines == ['published               321 s with NxD Training (seed 4) is for another run: '
                     'cluster.nodes 32 here, 16 there'], out
    d = json.loads(_cli('plan', 'llama3_70b', 'parallel.pp=4', '--json'))
    assert d['other_run'] == ['parallel.pp 4 here, 8 there'] and d['published'][0]['this_run'] is False, d['other_run']
    same = json.loads(_cli('plan', 'llama3_70b', 'cluster.account=a1', '--json'))   # a site option: the same run
    assert same['other_run'] == [] and same['published'][0]['this_run'] is True, same['other_run']


def test_the_cpu_plan_gives_each_process_its_share_of_this_machines_memory():
    "The `local` profile's device is a process: the machine's memory (sysconf) over the processes; a cluster's fixed."
    ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    one = json.loads(_cli('plan', 'gpt3_tiny', '--json'))
    assert (one['profile'], one['world']) == ('local', 1) and one['device_gib'] == pytest.approx(ram, rel=0.02), one
    assert f"of {one['device_gib']:.3g} GiB" in _cli('plan', 'gpt3_tiny')
    assert plan(get_recipe('gpt3_tiny', 'parallel.tp=2'), world=2).device_gib == pytest.approx(ram / 2, rel=0.02)
    assert json.loads(_cli('plan', 'gpt3_175b_gpu', '--json'))['device_gib'] == 80      # nd_h100_v5's H100
