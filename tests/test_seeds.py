"""The seeds' own scripts (facts with provenance in nxpretrain/catalog/seeds/) against the catalog and the jobs: every
seed recipe's model, layout, batch, schedule and recompute equal its seed run's or differ with a recorded reason; every
variable and node command of a seed's scripts is in its job, or in the job folder's differences.md with the reason."""
import re, shlex
from pathlib import Path
import pytest, yaml
from nxpretrain.recipes import CATALOG, get_recipe
from nxpretrain.seeds import (accepted_differences, job_seed, recipe_seed, run_facts, seed_facts, seeds_dir,
                              value_differences)
from nxpretrain.launch.job import export_jobs, render_jobs

SEEDS = range(5)


@pytest.mark.parametrize('seed', SEEDS)
def test_every_fact_has_provenance(seed):
    f = seed_facts(seed)
    assert f['seed'] == seed and f['repo'] and f['dir'] and f['commit']
    if f['repo'] != 'seed text': assert re.fullmatch(r'[0-9a-f]{40}', f['commit']), f['commit']
    facts = [*f['env'].items(), *(f.get('commands') or {}).items(), *(f.get('shared') or {}).items()]
    facts += [kv for run in (f.get('runs') or {}).values() for kv in run.items()]
    for name, fact in facts:
        assert re.search(r':\d', fact['where']), (seed, name, fact)          # FILE:LINE
        assert 'value' in fact or 'per_node' in fact, (seed, name)


def test_every_seed_recipe_is_compared_with_its_seed_run():
    unread = yaml.safe_load((seeds_dir() / 'accepted.yaml').read_text())['unread']
    seed_recipes = [n for n, r in CATALOG.items() if recipe_seed(r) is not None]
    assert len(seed_recipes) >= 14
    for name in seed_recipes:
        found = run_facts(name)
        assert found or name in unread, f"{name}: no run of seed {recipe_seed(CATALOG[name])} recorded"
        if found: assert found[0] == recipe_seed(CATALOG[name]), name


@pytest.mark.parametrize('name', [n for n, r in CATALOG.items() if recipe_seed(r) is not None])
def test_recipe_values_are_the_seeds_or_give_a_reason(name):
    r = CATALOG[name]
    rows = value_differences(r)
    for row in rows:
        assert row['reason'], f"{name}: {row['key']}={row['ours']} but seed {row['seed']} has {row['seed_value']} " \
                              f"({row['where']}): fix it or give the reason in catalog/seeds/accepted.yaml"
        assert row['key'] in (r.notes or ''), f"{name}: its notes do not name {row['key']}"
    stale = set(accepted_differences().get(name, {})) - {row['key'] for row in rows}
    assert not stale, f"{name}: accepted.yaml gives reasons for values that equal the seed's: {stale}"


def test_a_changed_value_fails_without_a_reason():
    rows = value_differences(get_recipe('gpt3_23b', 'parallel.tp=4'))
    assert [(r['key'], r['seed_value'], r['reason']) for r in rows if r['key'] == 'parallel.tp'] == [
        ('parallel.tp', 8, '')]


def test_bert_large_is_seed3s_batch_and_plans_at_it():
    from nxpretrain.plan import plan
    r = get_recipe('bert_large')
    assert (r.data.global_batch, get_recipe('bert_large_ph2').data.global_batch) == (16384, 32768)
    p = plan(r)
    hours = p.step_seconds * r.trainer.max_steps / 3600
    assert 3 < hours < 10, hours            # the seed: "This step takes around 5 hours" (16 nodes)


def test_gpt3_175b_exports_seed0s_schedule_and_recompute(tmp_path):
    from nxpretrain.engines.nxdt.job import export_nxdt
    jobs = render_jobs(export_nxdt('gpt3_175b', tmp_path / 'run', data_root=tmp_path / 'data'))
    cfg = yaml.safe_load(jobs['train'].recipe_path.read_text())
    sched = cfg['model']['optim']['sched']
    got = (cfg['model']['optim']['lr'], sched['constant_steps'], cfg['trainer']['max_steps'])
    assert got == (5e-5, 80000, 300000)
    assert sched.get('max_steps', 300000) == 300000   # NeMo's CosineAnnealing decays until max_steps - constant_steps
    assert cfg['model']['activations_checkpoint_granularity'] == 'selective'


def _exports(text: str) -> dict:
    "{variable: value} of the `export NAME=VALUE` lines (the last one wins), values unquoted as bash would."
    out = {}
    for line in text.splitlines():
        m = re.match(r'\s*export ([A-Za-z_]\w*)=(.*)$', line)
        if m: out[m[1]] = ' '.join(shlex.split(m[2])) if m[2].strip() else ''
    return out


def _flat(d: dict, prefix='') -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict): out.update(_flat(v, f"{prefix}{k}."))
        else: out[f"{prefix}{k}"] = v
    return out


def _export_job(name: str, d: Path):
    from nxpretrain.engines.base import engine_of
    r = get_recipe(name)
    return r, export_jobs(engine_of(r), r, d / 'job', cache_url=str(d / 'cache'))


JOBS = {0: 'gpt3_23b', 2: 'gpt3_175b_gpu', 3: 'bert_large', 4: 'llama3_70b'}


@pytest.mark.parametrize('seed, name', JOBS.items())
def test_job_carries_its_seeds_environment_or_says_why(tmp_path, seed, name):
    r, jobs = _export_job(name, tmp_path)
    assert job_seed(r) == seed
    folder = tmp_path / 'job'
    texts = [p.read_text() for p in folder.rglob('*') if p.is_file() and p.suffix in ('.sh', '.sbatch', '.args', '')]
    exports = _exports('\n'.join(texts))
    configs = [yaml.safe_load(p.read_text()) for p in (folder / 'conf').glob('*.yaml')] if seed in (0, 4) else []
    config = _flat(configs[0]) if configs else {}
    md = (folder / 'differences.md').read_text()
    f = seed_facts(seed)
    for var, fact in f['env'].items():
        if 'yaml' in fact:                      # NxDT sets it from its config: the config has the seed's value
            for key, value in fact['yaml'].items(): assert config[key] == value, (var, key, config.get(key))
            assert var not in exports, var      # an exported value would win over the config (NxDT's set_env_variable)
        elif 'reason' not in fact:
            assert exports.get(var) == str(fact['value']), (var, exports.get(var), fact)
        else:
            row = next((line for line in md.splitlines() if f"| `{var}` |" in line), None)
            assert row and ' '.join(fact['reason'].split())[:40].replace('|', '\\|') in row, (var, row)
            if 'job_value' in fact: assert exports.get(var) == str(fact['job_value']), (var, exports.get(var))
    lines = '\n'.join(texts).splitlines()
    for command, fact in (f.get('commands') or {}).items():
        if 'reason' in fact:
            assert f"| `{command}` |" in md, command
            continue
        option, value = command.split()[-1], str(fact['value'])
        assert any(option in line and value in line for line in lines), (command, value)


def test_differences_md_lists_the_recipes_own_differences(tmp_path):
    r, jobs = _export_job('gpt3_175b_gpu', tmp_path)
    md = (tmp_path / 'job' / 'differences.md').read_text()
    for row in value_differences(r): assert f"| `{row['key']}` |" in md and 'NO REASON' not in md
    assert md.startswith("# gpt3_175b_gpu: where this job departs from seed 2's scripts")


def test_trn1_profile_env_reaches_no_job_or_goes():
    "catalog/clusters/profiles.yaml's trn1 env went: the trn1 jobs export their seed's variables."
    from nxpretrain.clusters import profile
    assert profile('trn1.32xlarge').env == {} and profile('trn1n.32xlarge').env == {}
