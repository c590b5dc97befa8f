"""One place decides whether a recipe can run: over a generated sweep of layouts of every catalog recipe, `validate()`
passes exactly when the engine builds that layout for the first and the last rank of its world (full-size models on
`meta`, torch's fake process group, pipeline schedule included); a real step of each layout kind on gloo is the
equality matrix of test_parallel.py."""
import itertools, pytest, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from nxpretrain.recipes import CATALOG
from nxpretrain.config import override
from nxpretrain.validate import problems
from nxpretrain.parallel.state import initialize_model_parallel, destroy_model_parallel
from nxpretrain.parallel.parallelize import build_parallel_model, attach_schedule

GRID = dict(tp=(1, 2, 8), pp=(1, 2, 4), cp=(1, 2), dp=(1, 2), sp=(False, True), vpp=(1, 2),
            dp_kind=('none', 'fsdp', 'zero1'))


def layouts():
    "A deterministic spread of the grid: every value of every knob appears, with its neighbours varied."
    for i, (tp, pp, cp, dp, sp, vpp, kind) in enumerate(itertools.product(*GRID.values())):
        if i % 37 == 0: yield tp, pp, cp, dp, sp, vpp, kind


def layout_recipe(r, tp, pp, cp, dp, sp, vpp, kind):
    world = tp * pp * cp * dp
    overrides = [f'parallel.tp={tp}', f'parallel.pp={pp}', f'parallel.cp={cp}',
                 f'parallel.sequence_parallel={str(sp).lower()}', f'parallel.virtual_pp={vpp}',
                 f"parallel.pp_schedule={'interleaved' if vpp > 1 else '1f1b'}",
                 f"parallel.fsdp={str(kind == 'fsdp').lower()}", f"parallel.zero1={str(kind == 'zero1').lower()}",
                 'parallel.kv_replicator=1', 'parallel.dp=-1', 'cluster.profile=local', 'cluster.nodes=1',
                 'engine=native']
    if r.parallel.pp_cuts: overrides.append('parallel.pp_cuts=[]')
    return override(r, *overrides), world


def engine_builds(recipe, world: int):
    "None when the engine builds `recipe` on the first and last rank of `world`, else the engine's error."
    for rank in (0, world - 1):
        dist.init_process_group('fake', store=FakeStore(), rank=rank, world_size=world)
        try:
            p = recipe.parallel
            pm = build_parallel_model(recipe, initialize_model_parallel(p.tp, p.pp, p.cp, 'cpu'), device='meta')
            if p.pp > 1: attach_schedule(pm)
        except Exception as e: return f"{type(e).__name__}: {e}"
        finally:
            destroy_model_parallel()
            dist.destroy_process_group()
    return None


@pytest.mark.parametrize('name', sorted(CATALOG))
def test_validate_agrees_with_the_engine(name):
    disagree, checked = [], 0
    for layout in layouts():
        recipe, world = layout_recipe(CATALOG[name], *layout)
        refused = problems(recipe, world)
        error = engine_builds(recipe, world)
        checked += 1
        if bool(refused) != bool(error):
            disagree.append((layout, refused[:1], error))
    assert checked >= 10 and not disagree, disagree[:3]


def test_the_sweep_covers_refusals_and_acceptances():
    "The check can fail both ways: the sweep holds layouts validate refuses and layouts it accepts."
    outcomes = {bool(problems(*layout_recipe(CATALOG['bert_large'], *l))) for l in layouts()}
    assert outcomes == {True, False}
