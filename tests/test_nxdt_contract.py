"""Our trn1 and trn2 exports against NxD Training's contract (nxpretrain/engines/nxdt/contract.yaml and its example
configs, read by nxpretrain.engines.nxdt.contract), loaded through Hydra itself."""
import json, os, subprocess
from pathlib import Path
import pytest, yaml
from omegaconf import OmegaConf
from nxpretrain.engines.nxdt.job import export_nxdt
from nxpretrain.engines.nxdt.contract import (NXDT, NXDT_RECIPES, load_struct, contract_problems, missing_example_keys,
                                             differences, differences_markdown)
from nxpretrain.engines.nxdt.job import catalog_differences
from nxpretrain.recipes import get_recipe
from nxpretrain.errors import RecipeError
from nxpretrain.launch.job import render_jobs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def exports(tmp_path_factory):
    out = tmp_path_factory.mktemp('nxdt')
    return {name: (render_jobs(export_nxdt(name, out / name, data_root=out / 'data')), out / name)
            for name in NXDT_RECIPES}


@pytest.mark.parametrize('name', NXDT_RECIPES)
def test_export_keeps_nxdt_contract(exports, name):
    jobs, out = exports[name]
    cfg = load_struct(jobs['train'].recipe_path)
    assert OmegaConf.is_struct(cfg)
    assert contract_problems(cfg) == []
    plain = yaml.safe_load(jobs['train'].recipe_path.read_text())
    assert missing_example_keys(plain, name) == []
    assert all(r['reason'] for r in differences(plain, get_recipe(name)))
    assert cfg.model.encoder_seq_length == get_recipe(name).model.seq_len
    assert cfg.exp_manager.save_xser and cfg.exp_manager.load_xser and cfg.exp_manager.resume_if_exists
    assert cfg.exp_manager.resume_from_checkpoint is None
    if cfg.model_source == 'hf':
        hf = json.loads(Path(cfg.model.model_config).read_text())
        assert Path(cfg.model.model_config).parent == jobs['train'].recipe_path.parent
        assert hf['num_key_value_heads'] == get_recipe(name).model.kv_heads
    else:
        assert cfg.data.data_prefix[1].endswith('my-gpt2_text_document') and cfg.data.seq_length == 2048
    assert set(cfg.model.activations_checkpoint_recompute) <= set(NXDT['recompute_modules'][cfg.model_source]['names'])


@pytest.mark.parametrize('edit, expect', [
    (lambda c: c['exp_manager'].pop('resume_from_checkpoint'), 'exp_manager.resume_from_checkpoint: missing'),
    (lambda c: c['model'].pop('model_config'), 'model.model_config: missing'),
    (lambda c: c['model'].__setitem__('encoder_seq_length', None), 'model.encoder_seq_length: null'),
    (lambda c: c['model'].__setitem__('activations_checkpoint_recompute', ['attention', 'mlp']),
     "'attention' is no hf module class"),
    (lambda c: c['precision'].__setitem__('type', 'bf16'), "precision.type='bf16'"),
    (lambda c: c['model']['optim'].__setitem__('name', 'adamw_fp32'), "model.optim.name='adamw_fp32'"),
    (lambda c: c['exp_manager'].__setitem__('log_training_throughput', True),
     'exp_manager.log_training_throughput: neither'),
])
def test_contract_check_catches_broken_configs(exports, tmp_path, edit, expect):
    "The check fails on each kind of fault the issue found in the old exports."
    problems = _problems_after(edit, exports['llama3_70b'][0], tmp_path)
    assert any(expect in p for p in problems), problems


def _problems_after(edit, jobs, tmp_path) -> list[str]:
    "The contract's problems with the exported YAML of `jobs` after `edit` of its nested dict."
    plain = yaml.safe_load(jobs['train'].recipe_path.read_text())
    edit(plain)
    (tmp_path / 'broken.yaml').write_text(yaml.safe_dump(plain))
    return contract_problems(load_struct(tmp_path / 'broken.yaml'))


def test_megatron_contract_needs_data_prefix_and_tokenizer(exports, tmp_path):
    jobs, _ = exports['gpt3_23b']
    plain = yaml.safe_load(jobs['train'].recipe_path.read_text())
    plain['data'].pop('data_prefix')
    plain['data'].pop('tokenizer')
    plain['distributed_strategy']['zero1'] = False
    (tmp_path / 'broken.yaml').write_text(yaml.safe_dump(plain))
    problems = contract_problems(load_struct(tmp_path / 'broken.yaml'))
    assert any('data.data_prefix: missing' in p for p in problems) and any(
        'data.tokenizer: missing' in p for p in problems
    )
    assert any('zero1 must be true' in p for p in problems)
    assert missing_example_keys(plain, 'gpt3_23b')[:1] == ['data.data_prefix']


def test_docs_table_is_what_the_code_exports():
    "The differences table in the contract notebook (the docs) equals the one the exports produce now."
    nb = json.loads((ROOT / 'nbs/api/58_nxdt_contract.ipynb').read_text())
    cells = [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown']
    table = next(c for c in cells if c.startswith('| key | recipes |'))
    assert table.strip() == differences_markdown(catalog_differences()).strip()


def test_continual_pretraining_loads_weights_once_then_resumes(tmp_path):
    "Seed 4's continual pretraining: weights from the converted checkpoint until the run has its own, then resume."
    init = tmp_path / 'pretrained_weight'
    init.mkdir()
    jobs = render_jobs(export_nxdt('llama3_8b', tmp_path / 'run', data_root=tmp_path / 'data', init_from=str(init)))
    cfg = load_struct(jobs['train'].recipe_path)
    assert cfg.exp_manager.resume_from_checkpoint == str(init) and cfg.model.weight_init_only is True
    assert contract_problems(cfg) == []
    Path(cfg.data.train_dir).mkdir(parents=True)
    stub = tmp_path / 'bin'
    stub.mkdir()
    (stub / 'examples').mkdir()
    (stub / 'torchrun').write_text('#!/bin/sh\necho "$*" >> "$ARGV_LOG"\n')
    (stub / 'torchrun').chmod(0o755)
    env = {**os.environ, 'PATH': f"{stub}:{os.environ['PATH']}", 'ARGV_LOG': str(tmp_path / 'argv'),
           'NXDT_EXAMPLES': str(stub / 'examples'), 'COMPILE': '0'}
    env.pop('SLURM_JOB_NODELIST', None)
    subprocess.run([str(tmp_path / 'run/train.sh')], env=env, check=True, capture_output=True)
    ckpt = Path(cfg.exp_manager.explicit_log_dir) / 'checkpoints'
    ckpt.mkdir(parents=True)
    (ckpt / 'llama3_8b--step=10-consumed_samples=10240.0.ckpt').mkdir()    # a save cut short: NxD wrote no `done`
    subprocess.run([str(tmp_path / 'run/train.sh')], env=env, check=True, capture_output=True)
    (ckpt / 'llama3_8b--step=10-consumed_samples=10240.0.ckpt').mkdir()
    (ckpt / 'llama3_8b--step=10-consumed_samples=10240.0.ckpt/done').write_text('1')
    subprocess.run([str(tmp_path / 'run/train.sh')], env=env, check=True, capture_output=True)
    first, cut_short, whole = (tmp_path / 'argv').read_text().splitlines()
    assert 'resume_from_checkpoint' not in first and 'resume_from_checkpoint' not in cut_short
    assert 'exp_manager.resume_from_checkpoint=null model.weight_init_only=false' in whole


def test_train_job_requeues_on_failure_and_time_limit(exports):
    jobs, _ = exports['llama3_70b']
    script = jobs['train'].script
    assert '#SBATCH --requeue' in script and "trap '" in script and 'USR1' in script and 'wait $! || requeue' in script
    assert subprocess.run(['bash', '-n', str(jobs['train'].script_path)]).returncode == 0


def test_trn2_export_is_seed4s_trn2_run(exports):
    "llama3_70b_trn2 as NxDT's trn2 example runs it: LNC 2, 64 ranks a node, its cuts, move factor and reduce dtype."
    jobs, out = exports['llama3_70b_trn2']
    cfg = load_struct(jobs['train'].recipe_path)
    example = NXDT['examples']['hf_llama3_70B_trn2_config']['keys']
    assert (cfg.trainer.devices, cfg.trainer.lnc, cfg.trainer.num_nodes) == (64, 2, 8)
    cuts = [f"model.layers.{n}" for n in (18, 39, 60)]        # the last layer of stages 0-2
    assert list(cfg.model.pipeline_cuts) == example['model.pipeline_cuts'] == cuts
    assert cfg.trainer.sequential_move_factor == 32 and cfg.precision.parallel_layers_reduce_dtype == 'bf16'
    assert cfg.distributed_strategy.pipeline_model_parallel_size == 4 and cfg.trainer.max_steps == 10000
    assert (jobs['train'].devices_per_node, jobs['train'].profile) == (64, 'trn2.48xlarge')
    rows = {r['key']: r for r in differences(yaml.safe_load(jobs['train'].recipe_path.read_text()),
                                             get_recipe('llama3_70b_trn2'))}
    trn2_keys = {'trainer.devices', 'trainer.lnc', 'model.pipeline_cuts', 'trainer.sequential_move_factor',
                 'precision.parallel_layers_reduce_dtype', 'distributed_strategy.pipeline_model_parallel_size'}
    assert not trn2_keys & set(rows)
    assert 'ActivationMultiplyMLP' in rows['model.activations_checkpoint_recompute']['reason']


def test_trn2_lnc1_and_trn1_layouts(tmp_path):
    """LNC 1 gives 128 ranks a node and lnc 1; the trn2 recipe on trn1 keeps NxDT's key at 1 (NxDT forces 1 off trn2);
    a trn1 recipe on trn2 gets the profile's LNC; every difference from the examples has its reason."""
    for name, cluster, overrides, want in (('llama3_70b_trn2', 'trn2.48xlarge-lnc1:4', [], (128, 1)),
                                           ('llama3_70b_trn2', 'trn1.32xlarge:16', [], (32, 1)),
                                           ('llama3_70b', 'trn2.48xlarge:8', ['parallel.pp=4'], (64, 2))):
        jobs = render_jobs(export_nxdt(name, tmp_path / cluster.replace(':', '-'), cluster, overrides,
                                       data_root=tmp_path / 'data'))
        cfg = load_struct(jobs['train'].recipe_path)
        assert (cfg.trainer.devices, cfg.trainer.lnc, contract_problems(cfg)) == (*want, []), (name, cluster)
        rows = differences(yaml.safe_load(jobs['train'].recipe_path.read_text()), get_recipe(name, *overrides))
        assert all(r['reason'] for r in rows), [r for r in rows if not r['reason']]


@pytest.mark.parametrize('edit, expect', [
    (lambda c: c['model'].__setitem__('pipeline_cuts', ['model.layers.19', 'model.layers.40', 'model.layers.61',
                                                         'model.layers.79']), 'model.pipeline_cuts='),
    (lambda c: c['model'].__setitem__('pipeline_cuts', ['layers.18', 'layers.39', 'layers.60']),
     'model.pipeline_cuts='),
    (lambda c: c['trainer'].__setitem__('sequential_move_factor', 96), 'at most trainer.devices (64)'),
    (lambda c: c['trainer'].__setitem__('lnc', 3), 'trainer.lnc=3'),
    (lambda c: c['trainer'].__setitem__('lnc_size', 2), 'trainer.lnc_size: neither'),
])
def test_contract_check_catches_broken_trn2_configs(exports, tmp_path, edit, expect):
    "Cuts that are not PP-1 last layers of stages, a move factor above the devices, an LNC NxDT does not know."
    problems = _problems_after(edit, exports['llama3_70b_trn2'][0], tmp_path)
    assert any(expect in p for p in problems), problems


def test_contract_files_are_nxdts_examples():
    "Every example file was read at the contract's commit and names its source; the trn2 one has all 86 keys."
    for name, ex in NXDT['examples'].items():
        assert (ex['repo'], ex['commit'], ex['path']) == (NXDT['repo'], NXDT['commit'], f"examples/conf/{name}.yaml")
        assert list(ex['keys']) == list(ex['lines'])
    assert len(NXDT['examples']['hf_llama3_70B_trn2_config']['keys']) == 86
    assert set(NXDT['example_for'].values()) == set(NXDT['examples'])


def test_continual_pretraining_refuses_cuts_the_converter_cannot_make(tmp_path):
    "NxD's converter splits layers evenly: seed 4's trn2 cuts cannot start from its output, and the export says why."
    with pytest.raises(RecipeError, match='create_partitions') as e:
        export_nxdt('llama3_70b_trn2', tmp_path / 'run', data_root=tmp_path / 'data', init_from=str(tmp_path / 'w'))
    assert '\n' not in str(e.value)
