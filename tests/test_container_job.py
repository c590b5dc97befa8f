"""What the container sees is what the job needs: a written Megatron-LM job runs end to end on the local two-node
Slurm inside a container stand-in with pyxis's semantics – `srun --container-image=IMAGE --container-mounts=...` runs
each task in bubblewrap with only the image's root and the mounts visible. Inside it a stand-in `pretrain_gpt.py` reads
the flags file's every path (data, tokenizer, topology file) and writes where the flags say (checkpoints, TensorBoard,
data cache). Every rank finds everything; a job whose script lost one mount fails; and the engine's static check names
a path outside the mounts without any container."""
import dataclasses, json, os, shutil, subprocess, sys
from pathlib import Path
import pytest
from nxpretrain.clusters import PROFILES, profile
from nxpretrain.config import override
from nxpretrain.recipes import get_recipe
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm
from nxpretrain.launch.job import render_jobs

# pyxis's options translated for bubblewrap: the image file lists the host folders that form the image's root
SRUN = r'''#!/bin/bash
args=(); image=''; mounts=''
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
    case "$1" in
        --container-image=*) image=${1#*=} ;;
        --container-mounts=*) mounts=${1#*=} ;;
        --container-env=*|--container-workdir=*) ;;
        *) args+=("$1") ;;
    esac
    shift
done
[ -z "$image" ] && exec REAL_SRUN "${args[@]}" "$@"
box=(bwrap --die-with-parent --proc /proc --dev /dev --tmpfs /tmp)
while read -r dir; do [ -n "$dir" ] && box+=(--ro-bind "$dir" "$dir"); done < "$image"
IFS=, read -ra pairs <<< "$mounts"
for m in "${pairs[@]}"; do src=${m%%:*}; rest=${m#*:}; box+=(--bind "$src" "${rest%%:*}"); done
exec REAL_SRUN "${args[@]}" "${box[@]}" --chdir "$PWD" -- "$@"
'''

# reads every path the flags and the environment name, writes where it saves, and says what it could not find
STAND_IN = r'''import json, os, sys
from pathlib import Path
flags, cur = {}, None
for a in sys.argv[1:]:
    if a.startswith('--'): cur = a[2:]; flags[cur] = []
    else: flags[cur].append(a)
prefixes = flags['data-path'][1::2] or flags['data-path']
reads = [p + s for p in prefixes for s in ('.bin', '.idx')] + flags['vocab-file'] + flags['merge-file']
reads.append(os.environ['NCCL_TOPO_FILE'])
missing = [p for p in reads if not os.path.isfile(p)]
rank = os.environ['RANK']
for d in flags['save'] + flags['tensorboard-dir'] + flags['data-cache-path']:
    os.makedirs(d, exist_ok=True)
    Path(d, f'written-by-rank-{rank}').write_text('ok')
seen = {'rank': rank, 'world': os.environ['WORLD_SIZE'], 'read': reads, 'missing': missing,
        'host_file_visible': os.path.exists(os.environ['HOST_ONLY'])}
Path(flags['save'][0], f'seen.{rank}.json').write_text(json.dumps(seen))
if missing: sys.exit(f"No such file: {missing}")
if rank == '0': Path(flags['save'][0], 'latest_checkpointed_iteration.txt').write_text(flags['train-iters'][0])
'''

SLURM = why_no_slurm()
pytestmark = pytest.mark.skipif(bool(SLURM) or not shutil.which('bwrap'),
                                reason=f"needs a local Slurm ({SLURM or 'ok'}) and bubblewrap (apt-get install "
                                       "bubblewrap)")


def _image(path: Path):
    "The image stand-in: the host folders that make its root (a shell, this Python), nothing of the job's."
    roots = ['/usr', '/etc', '/bin', '/lib', '/lib64', '/sbin', sys.prefix, sys.base_prefix,
             os.path.realpath(sys.prefix)]
    path.write_text('\n'.join(dict.fromkeys(r for r in roots if os.path.exists(r))) + '\n')


@pytest.fixture
def box(tmp_path, monkeypatch):
    "A profile whose container is the stand-in, its seed-style mounts (a topology file's folder), and the job written."
    from nxpretrain.engines.megatron.job import export_megatron
    stage, topo = tmp_path / 'stage', tmp_path / 'opt-microsoft'
    topo.mkdir(parents=True)
    (topo / 'topo.xml').write_text('<system/>')
    stage.mkdir()
    _image(stage / 'image.sqsh')
    prof = dataclasses.replace(profile('nd_h100_v5'), name='gpu-box', devices_per_node=1, cpus_per_node=1, gres='',
                               container=str(stage / 'image.sqsh'), stage=str(stage),
                               container_mounts=f"{topo}:{topo},/var/tmp:/var/tmp",
                               env={'NCCL_TOPO_FILE': str(topo / 'topo.xml')})
    monkeypatch.setitem(PROFILES, 'gpu-box', prof)
    r = override(get_recipe('gpt3_126m_p4de'), 'cluster.nodes=2', 'cluster.time=00:10:00', 'parallel.tp=1',
                 'parallel.pp=1', 'data.micro_batch=1', 'data.global_batch=2', 'trainer.max_steps=3',
                 'optim.warmup_steps=1', 'optim.decay_steps=3', f"cluster.stage={stage}")
    job = render_jobs(export_megatron(r, stage / 'jobs' / r.name, 'gpu-box', data_root=str(stage / 'data')))['train']
    flags = {}
    for line in (job.out_dir / 'megatron.args').read_text().splitlines():
        if line.startswith('--'): flags[line.split()[0][2:]] = line.split()[1:]
    for p in flags['data-path'][1::2]:
        for s in ('.bin', '.idx'):
            Path(p + s).parent.mkdir(parents=True, exist_ok=True)
            Path(p + s).write_bytes(b'x')
    for k in ('vocab-file', 'merge-file'):
        Path(flags[k][0]).parent.mkdir(parents=True, exist_ok=True)
        Path(flags[k][0]).write_text('{}')
    mlm = Path(f"{stage}/Megatron-LM")
    mlm.mkdir()
    (mlm / 'pretrain_gpt.py').write_text(STAND_IN)
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    (bin_ / 'srun').write_text(SRUN.replace('REAL_SRUN', shutil.which('srun')))
    (bin_ / 'srun').chmod(0o755)
    (tmp_path / 'host-only').write_text('the container must not see this')
    monkeypatch.setenv('PATH', f"{bin_}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv('HOST_ONLY', str(tmp_path / 'host-only'))
    return job, flags, topo


def test_the_static_check_names_a_path_outside_the_mounts(box):
    from nxpretrain.engines.megatron.job import mount_problems
    job, flags, topo = box
    pairs = [tuple([k, *v]) for k, v in flags.items()]
    assert mount_problems(job, pairs) == []
    assert f"{topo}:{topo}" in job.mounts and f"{job.out_dir.parent.parent}:{job.out_dir.parent.parent}" in job.mounts
    less = dataclasses.replace(job, mounts=[m for m in job.mounts if not m.startswith(str(topo))])
    assert [p.split(':')[0] for p in mount_problems(less, pairs)] == [str(topo / 'topo.xml')]


@pytest.mark.timeout(400)
def test_the_job_runs_in_the_container_and_finds_every_path(box):
    from nxpretrain.launch.launcher import submit, wait, tail
    job, flags, topo = box
    save = Path(flags['save'][0])
    with LocalSlurm('i33box', nodes=2, port=6881):
        s = wait(submit(job), timeout=180)
        assert s.state == 'COMPLETED', (s, tail(s.job_id, 40))
        seen = [json.loads((save / f"seen.{k}.json").read_text()) for k in (0, 1)]
        for one in seen:
            assert one['missing'] == [] and one['world'] == '2' and not one['host_file_visible'], one
            assert str(topo / 'topo.xml') in one['read']
        for d in flags['save'] + flags['tensorboard-dir'] + flags['data-cache-path']:
            assert {p.name for p in Path(d).glob('written-by-rank-*')} == {'written-by-rank-0', 'written-by-rank-1'}
        # the same job with one mount fewer (the topology file's folder): its ranks stop, "No such file"
        for f in save.glob('seen.*.json'): f.unlink()
        job.script = job.script.replace(f"{topo}:{topo},", '')
        assert str(topo) not in job.script.split('--container-mounts=')[1].split()[0]
        s = wait(submit(job), timeout=180)
        assert s.state == 'FAILED', s
        assert 'No such file' in tail(s.job_id, 60)
        # the rank that stops first writes what it missed; srun's --kill-on-bad-exit may stop the other one before
        seen = [json.loads(f.read_text()) for f in save.glob('seen.*.json')]
        assert seen and all(one['missing'] == [str(topo / 'topo.xml')] for one in seen), seen
