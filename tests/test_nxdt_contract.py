"""Our trn1 exports against NxD Training's contract (nxpretrain.launch.nxdt_contract), loaded through Hydra itself."""
import json, os, subprocess
from pathlib import Path
import pytest, yaml
from omegaconf import OmegaConf
from nxpretrain.launch.nxdt import export_nxdt
from nxpretrain.launch.nxdt_contract import (NXDT_RECIPES, load_struct, contract_problems, missing_example_keys,
                                             differences, differences_markdown, RECOMPUTE_MODULES)
from nxpretrain.launch.nxdt import catalog_differences
from nxpretrain.recipes import get_recipe

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def exports(tmp_path_factory):
    out = tmp_path_factory.mktemp('nxdt')
    return {name: (export_nxdt(name, out / name, data_root=out / 'data'), out / name) for name in NXDT_RECIPES}


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
    names, _ = RECOMPUTE_MODULES[cfg.model_source]
    assert set(cfg.model.activations_checkpoint_recompute) <= set(names)


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
    jobs, _ = exports['llama3_70b']
    plain = yaml.safe_load(jobs['train'].recipe_path.read_text())
    edit(plain)
    (tmp_path / 'broken.yaml').write_text(yaml.safe_dump(plain))
    problems = contract_problems(load_struct(tmp_path / 'broken.yaml'))
    assert any(expect in p for p in problems), problems


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
    jobs = export_nxdt('llama3_8b', tmp_path / 'run', data_root=tmp_path / 'data', init_from=str(init))
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
    (ckpt / 'llama3_8b--step=10-consumed_samples=10240.0.ckpt').mkdir()
    subprocess.run([str(tmp_path / 'run/train.sh')], env=env, check=True, capture_output=True)
    first, second = (tmp_path / 'argv').read_text().splitlines()
    assert 'resume_from_checkpoint' not in first
    assert 'exp_manager.resume_from_checkpoint=null model.weight_init_only=false' in second


def test_train_job_requeues_on_failure_and_time_limit(exports):
    jobs, _ = exports['llama3_70b']
    script = jobs['train'].script
    assert '#SBATCH --requeue' in script and "trap '" in script and 'USR1' in script and 'wait $! || requeue' in script
    assert subprocess.run(['bash', '-n', str(jobs['train'].script_path)]).returncode == 0
