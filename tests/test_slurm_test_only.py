"""Every catalog recipe's job passes `sbatch --test-only` against a slurmctld whose nodes have its profile's shape (e.g.
16 nodes × 128 CPUs for trn1.32xlarge, gpu:8 for the GPU profiles), and a request the cluster cannot meet is refused.
Skipped, with the reason, where a local Slurm cannot be started."""
from collections import defaultdict
import pytest
from nxpretrain.recipes import CATALOG
from nxpretrain.clusters import profile
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm
from nxpretrain.errors import SlurmError
from nxpretrain.launch.job import export_jobs, make_job
from nxpretrain.launch.slurm import SlurmLauncher

check = SlurmLauncher().check   # sbatch --test-only: when would it start, nothing submitted
from nxpretrain.engines.base import engine_of

REASON = why_no_slurm()
pytestmark = [pytest.mark.skipif(bool(REASON), reason=f"no local Slurm: {REASON}"), pytest.mark.timeout(300)]

BY_PROFILE = defaultdict(list)
for name, r in CATALOG.items(): BY_PROFILE[r.cluster.profile].append(name)


@pytest.mark.parametrize('prof', sorted(BY_PROFILE))
def test_catalog_jobs_fit_their_profile(prof, tmp_path):
    names = BY_PROFILE[prof]
    nodes = max(CATALOG[n].cluster.nodes for n in names)
    with LocalSlurm.shaped_like(prof, nodes, name='shape', port=6900):
        for name in names:
            job = make_job(name, None, tmp_path / name)
            answer = check(job)
            r = CATALOG[name]
            cpus = r.cluster.nodes * profile(prof).cpus_per_node
            assert f"using {cpus} processors" in answer, (name, answer)
            if r.engine != 'native' or profile(prof).backend == 'xla':   # the engine's own compile and train jobs
                for kind, j in export_jobs(engine_of(r), r, tmp_path / f"{r.engine}-{name}").items():
                    assert 'to start at' in check(j), (name, kind)
        # one node more than the cluster has: refused now, not after the queue wait
        big = make_job(names[0], None, tmp_path / 'too-big')
        big.script = big.script.replace(f"--nodes={CATALOG[names[0]].cluster.nodes}", f"--nodes={nodes + 1}")
        with pytest.raises(SlurmError, match='not available|Node count'):
            check(big)
