"""The plan's checkpoint size is what the trainer writes: every CPU recipe trained two steps at its full size, its
checkpoint weighed on disk; a tied embedding/head and its optimizer state are in it once."""
from pathlib import Path
import pytest
import torch
from nxpretrain.clusters import profile
from nxpretrain.plan import checkpoint_bytes
from nxpretrain.recipes import CATALOG, get_recipe
from nxpretrain.train.checkpoint import safe_reader
from nxpretrain.train.trainer import train

CPU_RECIPES = [name for name, r in CATALOG.items() if profile(r.cluster.profile).backend == 'gloo']


def test_the_cpu_recipes_are_found():
    assert {'gpt3_tiny', 'llama3_tiny', 'bert_tiny'} <= set(CPU_RECIPES), CPU_RECIPES


@pytest.mark.parametrize('name', CPU_RECIPES)
def test_checkpoint_is_the_planned_size(tmp_path, name):
    torch.set_num_threads(2)
    r = get_recipe(name, 'trainer.save_every=2', 'trainer.eval_every=0')
    folder = Path(train(r, str(tmp_path), max_steps=2, progress=False).last_checkpoint)
    written, planned = sum(f.stat().st_size for f in folder.iterdir()), checkpoint_bytes(r)
    print(f"{name}: {written} bytes written, {planned:.0f} planned ({written / planned - 1:+.1%})")
    assert abs(written / planned - 1) < 0.05, f"{name}: {written} bytes written, the plan says {planned:.0f}"
    keys = set(safe_reader(folder).read_metadata().state_dict_metadata)
    assert not [k for k in keys if k.startswith('optim.param_groups.')], 'hyperparameters are the recipe\'s'
    tied = r.model.tie_embeddings
    assert ('model.output.weight' in keys) == (not tied) and ('optim.state.output.weight.exp_avg' in keys) == (not tied)
    assert 'model.tok_embeddings.weight' in keys and 'optim.state.tok_embeddings.weight.exp_avg_sq' in keys
