"Helpers of the trainer tests: runs on real gloo processes whose ranks must agree, and float comparison."
import math
from nxpretrain.testing.spawn import run_distributed
from nxpretrain.train.trainer import train


def dist_train(recipe, out, steps, world=2, timeout=300, **kw):
    "Train `recipe` on `world` gloo processes; every rank must report the same losses and validation figures."
    res = run_distributed(train, world, recipe, str(out), steps, timeout=timeout, progress=False, **kw)
    assert all(r.losses == res[0].losses for r in res), 'ranks disagree on the loss'
    assert all(r.eval == res[0].eval for r in res), 'ranks disagree on the validation figures'
    return res[0]


def close(a, b, tol=2e-5):
    assert len(a) == len(b) and all(math.isclose(x, y, rel_tol=tol, abs_tol=tol) for x, y in zip(a, b)), (a, b)
