"""The (pp, dp, cp, tp) mesh on real processes: NxD's rank grid, getters, neighbours, log tags; the harness's failure
modes."""
import os, time, pytest, torch, torch.distributed as dist
from nxpretrain.testing.spawn import run_distributed, DistributedError, fail_on_rank
from nxpretrain.parallel import state as ps

def layout(tp, pp, cp):
    st = ps.initialize_model_parallel(tp, pp, cp, 'cpu')
    out = dict(rank=dist.get_rank(), tp=ps.get_tensor_model_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
               dp=ps.get_data_parallel_rank(), cp=ps.get_context_parallel_rank(), dp_size=ps.get_data_parallel_size(),
               tp_ranks=ps.get_tensor_model_parallel_ranks(), dp_ranks=ps.get_data_parallel_ranks(),
               next=ps.get_next_rank(), prev=ps.get_prev_rank(), tag=st.tag)
    t = torch.ones(1)
    dist.all_reduce(t, group=ps.get_tensor_model_parallel_group())
    out['tp_sum'] = t.item()
    ps.destroy_model_parallel()
    return out

def test_rank_grid_is_nxd_order():
    "arange(8).reshape(PP=2, DP=2, CP=1, TP=2): TP neighbours adjacent, PP outermost."
    res = run_distributed(layout, 8, 2, 2, 1, timeout=60)
    grid = torch.arange(8).reshape(2, 2, 1, 2)
    for r in res:
        pp, dp, cp, tp = (grid == r['rank']).nonzero()[0].tolist()
        assert (r['pp'], r['dp'], r['cp'], r['tp']) == (pp, dp, cp, tp) and r['dp_size'] == 2
        assert r['tp_ranks'] == grid[pp, dp, cp].tolist() and r['dp_ranks'] == grid[pp, :, cp, tp].tolist()
        assert r['next'] == grid[(pp + 1) % 2, dp, cp, tp].item() and r['prev'] == grid[(pp - 1) % 2, dp, cp, tp].item()
        assert r['tag'] == f"[rank_{r['rank']}_pp{pp}_tp{tp}_dp{dp}_cp{cp}]" and r['tp_sum'] == 2

def test_cp_between_dp_and_tp():
    res = run_distributed(layout, 4, 1, 1, 2, timeout=60)
    assert [(r['dp'], r['cp']) for r in res] == [(0, 0), (0, 1), (1, 0), (1, 1)]

def test_bad_layout_refused_before_any_process_group():
    from nxpretrain.recipes import get_recipe
    from nxpretrain.errors import RecipeError
    with pytest.raises(RecipeError, match='world size 6 is not divisible by tp×pp×cp=4'):
        ps.init_distributed(get_recipe('gpt3_tiny', 'parallel.tp=4'), env={'RANK': '0', 'WORLD_SIZE': '6'})
    assert not dist.is_initialized()

def test_slurm_env_start():
    env = {'SLURM_PROCID': '0', 'SLURM_NTASKS': '1', 'SLURM_LOCALID': '0', 'SLURM_JOB_NODELIST': 'localhost',
           'MASTER_ADDR': '127.0.0.1',
           'MASTER_PORT': str(__import__('nxpretrain.testing.spawn', fromlist=['x']).free_port())}
    st = ps.init_distributed(env=env, device='cpu')
    try: assert st.world == 1 and st.tag == '[rank_0_pp0_tp0_dp0_cp0]'
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()

def die_on_rank(bad):
    if dist.get_rank() == bad: os._exit(3)
    dist.barrier()

def hang_on_rank(bad):
    if dist.get_rank() == bad: time.sleep(60)
    return 'never'

def test_harness_reports_exception_with_traceback():
    with pytest.raises(DistributedError, match=r'rank 1: ValueError: deliberate failure on rank 1[\s\S]*Traceback'):
        run_distributed(fail_on_rank, 2, 1, timeout=30)

def test_harness_reports_dead_rank_fast():
    t = time.monotonic()
    with pytest.raises(DistributedError, match='rank 0 died with exit code 3'):
        run_distributed(die_on_rank, 2, 0, timeout=30)
    assert time.monotonic() - t < 20

def test_harness_times_out():
    with pytest.raises(DistributedError, match=r'timed out after 3s; ranks without a result: \[1\]'):
        run_distributed(hang_on_rank, 2, 1, timeout=3)
