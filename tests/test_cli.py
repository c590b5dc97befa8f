"""The `nxpretrain` command as people type it: options before, between and after the `key=value` overrides of every
subcommand; one line naming the nearest field for a key that is not one; one line of ours where Slurm's tools would
speak; `--json` parsed from every listing and report; and every example of the README and of the `--help` texts run.

Examples that need Slurm run against a real Slurm controller started here (jobs stay queued: nothing trains on it);
examples that train run 2 steps instead of 50, and `watch` waits 1 s. Where no local Slurm can be started (or other
Slurm tests hold it for a minute) they run with no Slurm configuration and must say so in one line."""
import contextlib, fcntl, io, json, os, re, shlex, shutil, subprocess, sys, time
from pathlib import Path
import pytest
from nxpretrain.cli import main, EXAMPLES
from nxpretrain.testing.local_slurm import LocalSlurm, why_no_slurm

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


def run(*argv) -> tuple[int, str, str]:
    "Exit status, stdout and stderr of `nxpretrain ARGV…`, run in this process."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(list(argv)) or 0
        except SystemExit as e: rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return rc, out.getvalue(), err.getvalue()


def ok(*argv) -> str:
    "stdout of a command that must succeed."
    rc, out, err = run(*argv)
    assert rc == 0, (argv, rc, err[-2000:])
    return out


def one_line_error(*argv) -> str:
    "The one stderr line of a command that must fail with exit status 2."
    rc, out, err = run(*argv)
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith('note: ')]
    assert rc == 2 and len(lines) == 1, (argv, rc, err)
    return lines[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    "Each test runs in its own folder (runs/ lands there); child processes import this checkout."
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('PYTHONPATH', str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return tmp_path


@pytest.fixture
def no_slurm(monkeypatch):
    "A SLURM_CONF that names no file: what a laptop, or a login node with a typo in its profile, looks like."
    monkeypatch.setenv('SLURM_CONF', '/nonexistent/slurm.conf')


# ---- options and overrides in any order ----------------------------------------------------------------------

OPTION_PLACES = ['before', 'between', 'after']

def placed(where: str, head: list, overrides: list, options: list) -> list:
    "A command line with `options` before, between or after the overrides."
    if where == 'before': return head[:1] + options + head[1:] + overrides
    if where == 'between': return head + overrides[:1] + options + overrides[1:]
    return head + overrides + options


@pytest.mark.parametrize('where', OPTION_PLACES)
def test_show_options_anywhere(where, workdir):
    d = json.loads(
        ok(*placed(where, ['show', 'gpt3_tiny'], ['optim.lr=1e-3', 'cluster.profile=cpu', 'parallel.tp=2'], ['--json']))
    )
    assert (d['optim']['lr'], d['parallel']['tp']) == (1e-3, 2)


@pytest.mark.parametrize('where', OPTION_PLACES)
def test_plan_options_anywhere(where, workdir):
    argv = placed(where, ['plan', 'gpt3_tiny'], ['parallel.tp=2', 'data.global_batch=32'], ['--world', '4', '--json'])
    d = json.loads(ok(*argv))
    assert (d['world'], d['layout']['tp'], d['layout']['dp']) == (4, 2, 2), d


@pytest.mark.parametrize('where', OPTION_PLACES)
def test_train_options_anywhere(where, workdir):
    "The issue's own command line: options first, then an override; a dry run writes the job that would be submitted."
    options = ['--cluster', 'ci@2', '--dry-run', '--out', 'out']
    out = ok(*placed(where, ['train', 'gpt3_tiny'], ['optim.lr=1e-3', 'data.global_batch=16'], options))
    assert 'stop: dry run, nothing submitted' in out
    script = (workdir / 'out/jobs/gpt3_tiny/train.sbatch').read_text()
    recipe = (workdir / 'out/jobs/gpt3_tiny/recipe.yaml').read_text()
    # ci: the profile of the test Slurm
    assert '#SBATCH --nodes=2' in script and "on 2 × ci (2 devices, gloo)" in script
    assert 'lr: 0.001' in recipe and 'global_batch: 16' in recipe


@pytest.mark.parametrize('where', OPTION_PLACES)
def test_compile_options_anywhere(where, workdir, no_slurm):
    """The compile job is written wherever the options go; with a cluster given and no Slurm answering, `compile` exits
    2 in one line, as `train` does (it used to say "no cluster given" and exit 0)."""
    argv = placed(where, ['compile', 'gpt3_23b'], ['optim.lr=1e-4', 'trainer.max_steps=1000'],
                  ['--cluster', 'trn1', '--out', 'c'])
    line = one_line_error(*argv)
    assert line.startswith('nxpretrain compile: ') and 'slurm.conf' in line and 'c/compile.sbatch' in line, line
    assert (workdir / 'c/compile.sbatch').exists()
    assert any('lr: 0.0001' in f.read_text() for f in (workdir / 'c').rglob('*.yaml'))


@pytest.mark.parametrize('argv', [['evaluate', '--json', 'CKPT', '--steps', '1'],
                                  ['evaluate', 'CKPT', '--json', '--steps', '1'],
                                  ['evaluate', '--steps', '1', 'CKPT', '--json']])
def test_evaluate_options_anywhere(argv, checkpoint):
    d = json.loads(ok(*[str(checkpoint) if a == 'CKPT' else a for a in argv]))
    assert d['loss'] > 0 and abs(d['perplexity'] - __import__('math').exp(d['loss'])) < 1e-3 * d['perplexity']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    "A gpt3_tiny checkpoint after 2 real steps, trained with options between the overrides (one real run is enough)."
    root = tmp_path_factory.mktemp('ckpt')
    old = os.getcwd()
    os.chdir(root)
    try:
        ok(
            *placed('between', ['train', 'gpt3_tiny'], ['optim.lr=2e-3', 'trainer.log_every=1'],
                    ['--max-steps', '2', '--out', 'out'])
        )
    finally: os.chdir(old)
    return root / 'out/gpt3_tiny/checkpoints/step_2'


def test_train_here_options_between_overrides(checkpoint):
    "The run's recipe carries the overrides given around the options."
    from nxpretrain.config import from_yaml
    r = from_yaml(next(checkpoint.parent.parent.rglob('recipe.yaml')))
    assert (r.optim.lr, r.trainer.log_every, r.trainer.max_steps) == (2e-3, 1, 2)


# ---- one-line errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize('argv', [['show', 'gpt3_tiny'], ['plan', 'gpt3_tiny'], ['train', 'gpt3_tiny', '--dry-run'],
                                  ['compile', 'gpt3_tiny', '--out', 'c']])
@pytest.mark.parametrize('key, near', [('optim.lrr', 'optim.lr'), ('lr', 'optim.lr'), ('paralel.tp', 'parallel.tp'),
                                       ('trainer.max_step', 'trainer.max_steps')])
def test_unknown_field_names_the_nearest(argv, key, near, workdir):
    line = one_line_error(*argv[:2], f'{key}=1', *argv[2:])
    assert line == f"nxpretrain {argv[0]}: override {key}=1: no such field {key}; did you mean {near}?", line


def test_seed_names_load_the_renamed_recipes_with_a_note(workdir):
    rc, out, err = run('show', '--json', 'gpt3_857m')
    assert rc == 0 and json.loads(out)['name'] == 'gpt3_356m'
    assert err == ("note: gpt3_857m is the seed's name for gpt3_356m (its numbers make 356M parameters); using "
                   "gpt3_356m\n")
    sizes = {d['name']: d['parameters'] for d in json.loads(ok('recipes', '--json'))}
    assert round(sizes['gpt3_64m'] / 1e6) == 64 and round(sizes['gpt3_356m'] / 1e6) == 356
    assert 'gpt3_375m' not in sizes and 'gpt3_857m' not in sizes


SLURM_COMMANDS = [['train', 'gpt3_tiny', '--cluster', 'nosuch'],
                  ['train', '--cluster', 'nosuch', 'gpt3_tiny', 'optim.lr=1e-3'], ['tail', '12'], ['watch', '12'],
                  ['cancel', '12'], ['cancel', '12', '--signal', 'USR1']]

@pytest.mark.parametrize('argv', SLURM_COMMANDS)
def test_no_slurm_configuration_is_one_line_of_ours(argv, workdir, no_slurm):
    line = one_line_error(*argv)
    assert line.startswith(f"nxpretrain {argv[0]}: "), line
    assert "SLURM_CONF=/nonexistent/slurm.conf: no such file; point it at the cluster's slurm.conf" in line, line
    assert not (workdir / 'runs/jobs').exists()                 # refused before anything is written


@pytest.mark.parametrize('argv', SLURM_COMMANDS[:3])
def test_no_sbatch_is_one_line_of_ours(argv, workdir, monkeypatch):
    monkeypatch.setenv('PATH', str(Path(sys.executable).parent))   # python, but no Slurm tools
    line = one_line_error(*argv)
    assert "no Slurm here: sbatch is not on PATH; run on the cluster's login node" in line, line


def test_jobs_without_slurm_lists_this_machines_jobs(workdir, no_slurm):
    "With no Slurm, `jobs` still answers for the schedulers that do (this machine): JSON rows, no Slurm words."
    rc, out, err = run('jobs', '--json')
    assert rc == 0 and isinstance(json.loads(out), list) and 'sbatch' not in err + out, err
    text = ok('jobs')
    assert max(map(len, text.splitlines())) <= 100, text


@pytest.mark.skipif(not shutil.which('sbatch') or Path('/etc/slurm/slurm.conf').exists(),
                    reason='needs the Slurm client with no /etc/slurm/slurm.conf')
def test_no_slurm_conf_at_all_is_one_line_of_ours(workdir, monkeypatch):
    "The issue's case: Slurm's client installed, no configuration anywhere (sbatch would say 'Could not establish…')."
    monkeypatch.delenv('SLURM_CONF', raising=False)
    line = one_line_error('train', 'gpt3_tiny', '--cluster', 'nosuch')
    assert line.startswith('nxpretrain train: no Slurm configuration here: SLURM_CONF is not set, '
                           '/etc/slurm/slurm.conf'), line
    assert line.endswith("set SLURM_CONF to the cluster's slurm.conf"), line


# ---- every subcommand, given bad input ------------------------------------------------------------------------

BAD_INPUT = {  # subcommand: [(argv, words the one line must hold)]
    'recipes': [(['recipes', '--bogus'], 'unrecognized arguments: --bogus; see nxpretrain recipes --help')],
    'show': [(['show', 'nosuch'], "model 'nosuch': no such recipe; choose one of bert_tiny, gpt3_tiny")],
    'plan': [(['plan', 'gpt3_tiny', '--world', 'many'], "argument --world: invalid int value: 'many'")],
    'train': [
        (['train', 'nosuch.yaml'], 'nosuch.yaml'),
        (['train', 'gpt3_tiny', 'optim.lrr=1'], 'did you mean optim.lr?'),
    ],
    'setup': [(['setup', '--recipe', 'nosuch'], "model 'nosuch': no such recipe")],
    'data': [
        (['data', 'nosuch.jsonl'], "corpus 'nosuch.jsonl': not in the catalog"),
        (['data', 'demo', '--workers', 'x'], "argument --workers: invalid int value: 'x'; see nxpretrain data --help"),
    ],
    'compile': [(['compile', 'nosuch'], "model 'nosuch': no such recipe")],
    'jobs': [(['jobs', '--bogus'], 'unrecognized arguments: --bogus')],
    'tail': [
        (['tail', 'abc'], 'job abc: no job of that id was submitted from here'),
        (['tail', '12', '-n', 'x'], "argument -n: invalid int value: 'x'"),
    ],
    'watch': [(['watch', '12'], 'job 12: no job of that id was submitted from here')],
    'cancel': [(['cancel', 'x1'], 'job x1: no job of that id was submitted from here')],
    'evaluate': [(['evaluate', 'runs/nosuch'], 'runs/nosuch: no such checkpoint folder')],
    'export-hf': [(['export-hf', 'runs/nosuch', 'hf'], 'runs/nosuch: no such checkpoint or folder')],
    'import-hf': [(['import-hf', 'nosuch', 'out'], 'nosuch: no config.json; give a Hugging Face model folder')],
    'convert': [(['convert', 'nosuch', '--to', 'hf', '--out', 'out'], 'nosuch: no such checkpoint or folder')],
    'demo': [
        (['demo', '--model', 'nosuch'], "model 'nosuch': no such recipe"),
        (['demo', '--name', '../up'], "run name '../up': use letters"),
    ],
    'runs': [(['runs', '--bogus'], 'unrecognized arguments: --bogus')],
    'lab': [(['lab', '--dir', 'nosuch'], 'nosuch: no such folder; give --dir')],
}


def subcommands() -> dict:
    from nxpretrain.cli import _parser
    import argparse
    return next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_bad_input_covers_every_subcommand():
    assert set(BAD_INPUT) == set(subcommands()), set(subcommands()) ^ set(BAD_INPUT)


@pytest.mark.parametrize('argv,words', [c for cases in BAD_INPUT.values() for c in cases],
                         ids=lambda v: ' '.join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_naming_the_fix(argv, words, workdir, no_slurm):
    """Exit status 2, one stderr line that starts with the command and holds what was wrong; no traceback, nothing
    written."""
    rc, out, err = run(*argv)
    assert 'Traceback' not in err + out, err
    line = one_line_error(*argv)
    assert line.startswith(f"nxpretrain {argv[0]}: ") and words in line, line
    assert not (workdir / 'runs').exists() or argv[0] == 'jobs', list((workdir / 'runs').rglob('*'))


def test_every_option_has_help_and_data_names_itself():
    import argparse
    for name, p in subcommands().items():
        if name == 'data': continue
        for act in p._actions:
            assert act.help or isinstance(act, argparse._HelpAction), (name, act.dest)
    text = ok('data', '--help')
    assert text.startswith('usage: nxpretrain data') and re.search(r'--workers WORKERS\s+tokenizer processes', text), (
        text
    )


# ---- what people read ----------------------------------------------------------------------------------------

def test_setup_fits_100_columns_one_line_per_recipe(workdir):
    from nxpretrain.recipes import CATALOG
    out = ok('setup')
    assert max(map(len, out.splitlines())) <= 100, max(out.splitlines(), key=len)
    rows = [l for l in out.splitlines() if l.split(' ')[0] in CATALOG]
    assert [l.split()[0] for l in rows] == list(CATALOG)        # exactly one line each, in catalog order
    detail = ok('setup', '--recipe', 'gpt3_23b')
    assert detail.splitlines()[0].split() == ['recipe', 'gpt3_23b'] and 'needs' in detail
    assert max(map(len, detail.splitlines())) <= 100


def test_json_of_every_listing_and_report(workdir, checkpoint):
    "recipes, show, plan, setup and evaluate print JSON that parses to what the text says (jobs: see the Slurm test)."
    from nxpretrain.recipes import CATALOG
    recipes = json.loads(ok('recipes', '--json'))
    assert [r['name'] for r in recipes] == list(CATALOG)
    assert json.loads(ok('show', 'gpt3_23b', '--json'))['parallel']['tp'] == 8
    listed = next(r['parameters'] for r in recipes if r['name'] == 'gpt3_23b')   # the plan counts the padded vocabulary
    assert abs(json.loads(ok('plan', 'gpt3_23b', '--json'))['parameters'] / listed - 1) < 1e-4
    setup = json.loads(ok('setup', '--json', '--recipes', 'gpt3_tiny,gpt3_23b'))
    assert [(r['recipe'], r['ready']) for r in setup['recipes']] == [('gpt3_tiny', True), ('gpt3_23b', False)]
    assert setup['machine']['host']['cpus'] >= 1
    one = json.loads(ok('setup', '--json', '--recipe', 'gpt3_23b'))
    assert [r['recipe'] for r in one['recipes']] == ['gpt3_23b'] and one['recipes'][0]['missing']
    ev = json.loads(
        ok('evaluate', str(checkpoint), '--json', '--steps', '1', '--prompt', 'def ', '--max-new-tokens', '4')
    )
    assert ev['checkpoint'] == str(checkpoint) and ev['sample'].startswith('def') and ev['tokens'] == 8 * 128


def test_the_installed_command(workdir):
    "The console script itself (not only `main`): JSON on stdout, the one-line error on stderr."
    exe = shutil.which('nxpretrain') or pytest.skip('the nxpretrain console script is not installed')
    p = subprocess.run([exe, 'recipes', '--json'], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)[1]['name'] == 'gpt3_tiny'
    p = subprocess.run([exe, 'plan', 'gpt3_tiny', 'optim.lrr=1'], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stderr) == (2, "nxpretrain plan: override optim.lrr=1: no such field optim.lrr; did you "
                                           "mean optim.lr?\n")


# ---- every documented example --------------------------------------------------------------------------------

def help_examples() -> list[str]:
    "The example lines of `nxpretrain --help` and of every subcommand's `--help`, as printed."
    out = []
    for cmd in ['', *EXAMPLES]:
        text = ok(*([cmd] if cmd else []), '--help')
        out += [l.strip() for l in text.split('examples:', 1)[-1].splitlines() if l.strip().startswith('nxpretrain ')]
    return out


def readme_examples() -> list[str]:
    "Every `nxpretrain …` command of the README: lines of its sh blocks (after `&&` too) and inline code."
    text = (ROOT / 'README.md').read_text()
    out = []
    for block in re.findall(r'```(?:sh|bash)\n(.*?)```', text, re.S):
        for line in block.splitlines():
            out += [p.strip() for p in line.split('&&') if p.strip().startswith('nxpretrain ')]
    return out + re.findall(r'`(nxpretrain [^`]*)`', text)


def test_help_shows_the_examples_and_the_readme_shows_commands():
    helps, readme = help_examples(), readme_examples()
    assert len(helps) >= 2 * len(EXAMPLES) - 6 and {e for es in EXAMPLES.values() for e in es} <= set(helps)
    assert len(readme) >= 15 and any('--cluster' in r for r in readme)


ORDER = ['--help', 'recipes', 'show', 'plan', 'setup', 'data', 'train', 'evaluate', 'export-hf', 'import-hf', 'convert',
         'compile', 'jobs', 'tail', 'watch', 'cancel', 'demo', 'runs', 'lab']


def cheap(words: list[str], job_id: str) -> list[str]:
    """The cheap form of an example: 2 training steps (step_2 checkpoints), 1 validation batch, a 1 s watch, a real job
    id."""
    w = [job_id if x == 'JOB_ID' else re.sub(r'(checkpoints/step_)\d+', r'\g<1>2', x) for x in words]
    for opt, value in (('--max-steps', '2'), ('--timeout', '1'), ('--steps', '1')):
        if opt in w: w[w.index(opt) + 1] = value
    if w[0] in ('train', 'demo') and '--max-steps' not in w and '--dry-run' not in w: w += ['--max-steps', '2']
    if w[0] == 'lab' and '--no-start' not in w: w += ['--no-start']               # the server itself: tests/test_lab.py
    if 'parallel.tp=2' in w and w[0] == 'train':
        w[w.index('--max-steps') + 1] = '1'   # two processes: one step shows it
    if w[0] == 'evaluate' and '--steps' not in w: w += ['--steps', '1', '--max-new-tokens', '8']
    if w[0] == 'setup' and '--prepare' in w and '--dry-run' not in w: w += ['--dry-run']   # the real one: test_setup
    return w


def run_with_s3(argv: list[str], monkeypatch):
    "An example that uploads checkpoints: against a local S3 server holding its bucket; the checkpoints must arrive."
    pytest.importorskip('moto')
    from s3_helpers import s3_server
    from nxpretrain.data import s3
    url = next(a for a in argv if a.startswith('trainer.upload_to=')).split('=', 1)[1]
    with s3_server() as endpoint:
        monkeypatch.setenv('AWS_ENDPOINT_URL', endpoint)
        s3.s3_client().create_bucket(Bucket=url[len('s3://'):].split('/')[0])
        ok(*argv, '--out', 'runs/s3')
        assert any(key.endswith('COMPLETE') for key, _, _ in s3.list_objects(url + '/')), (
            'no complete checkpoint arrived'
        )


def needs_slurm(w: list[str]) -> bool:
    return w[0] in ('jobs', 'tail', 'watch', 'cancel') or (
        w[0] in ('train', 'compile') and '--cluster' in w and '--dry-run' not in w
    )


@contextlib.contextmanager
def local_slurm():
    "A real Slurm controller with two nodes' worth of queue and no slurmd (jobs stay queued), or None."
    if why_no_slurm(install=False):
        yield None
        return
    with open('/tmp/nxp-slurm.lock', 'w') as lock:
        t0 = time.time()
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() - t0 > 60:                   # other Slurm tests hold it: the no-Slurm form, said so
                    print('the Slurm test lock stayed taken for 60 s: Slurm examples run in their no-Slurm form')
                    yield None
                    return
                time.sleep(1)
        with LocalSlurm.shaped_like('local', 2, name='cli', port=6960) as c: yield c


def test_every_documented_example_runs(workdir, monkeypatch):
    examples = dict.fromkeys(
        tuple(shlex.split(e, comments=True)[1:] or ['--help']) for e in help_examples() + readme_examples()
    )
    words = sorted(map(list, examples), key=lambda w: ORDER.index(w[0]))
    (workdir / 'docs.jsonl').write_text('{"text": "def f(x):\\n    return x + 1"}\n{"text": "the quick brown fox"}\n')
    here, slurm_ones = [w for w in words if not needs_slurm(w)], [w for w in words if needs_slurm(w)]
    for w in here:
        t0 = time.time()
        argv = cheap(w, '')
        if w[0] == 'demo':                                    # papermill runs the stage notebook in a kernel of its own
            code = f"from nxpretrain.cli import main; main({argv!r})"
            p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
        elif any(a.startswith('trainer.upload_to=s3://') for a in argv): run_with_s3(argv, monkeypatch)
        else: ok(*argv)
        print(f"{time.time() - t0:6.1f} s  {shlex.join(argv)}")
    assert (workdir / 'runs/gpt3_tiny/checkpoints/step_2').is_dir() and (
        workdir / 'runs/hf/gpt3_tiny/config.json'
    ).exists()
    assert (workdir / 'runs/gpt3_tiny_from_hf').is_dir() and list(workdir.glob('runs/gpt3_tiny-*/train.ipynb'))
    # A real controller, its nodes without slurmd: sbatch --test-only answers, submitted jobs queue and none runs.
    job_id = ''
    with local_slurm() as slurm:
        if slurm is None: monkeypatch.setenv('SLURM_CONF', '/nonexistent/slurm.conf')   # never a real cluster by chance
        for w in slurm_ones:
            argv = cheap(w, job_id or '12345')
            if slurm is None and w[0] == 'jobs':                # this machine's jobs, whatever Slurm says
                ok(*argv)
                continue
            if slurm is None:                                   # no Slurm here: say so, in one line
                assert one_line_error(*argv).startswith(f"nxpretrain {w[0]}: "), argv
                continue
            if w[0] == 'compile':        # the example's partition (trn1) may not be the local controller's
                rc, out, err = run(*argv)
                refused = rc == 2 and err.startswith('nxpretrain compile: ') and 'trn1' in err
                assert rc == 0 or refused, (argv, rc, err)
                continue
            if w[0] == 'train' and '--test-only' not in w:   # nodes without slurmd: drain them so the job stays queued
                subprocess.run(['scontrol', 'update', 'NodeName=node[1-2]', 'State=DRAIN', 'Reason=queued-only'],
                               check=True)
            if w[0] == 'cancel' and '--signal' in w:     # a queued job takes no signal: our line, not scancel's retries
                assert one_line_error(*argv) == (f"nxpretrain cancel: job {job_id} is still queued: only a running "
                                                 "job takes a signal; cancel it without --signal")
                continue
            out = ok(*argv)
            if m := re.search(r'submitted as slurm job (\d+)', out, re.I): job_id = m.group(1)
            if argv[:2] == ['jobs', '--json']: assert job_id in {str(j['job_id']) for j in json.loads(out)}, out
    assert slurm is None or job_id, 'the Slurm submission example gave no job id'
    assert len(here) >= 20 and len(slurm_ones) >= 8, (here, slurm_ones)
