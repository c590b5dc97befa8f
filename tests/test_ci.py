"The CI gate and the README's set-up commands: the gate must fail, naming the file, on each kind of drift."
import json, os, re, shutil, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


def sh(cmd, cwd, check=True, timeout=300):
    r = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=timeout)
    if check: assert r.returncode == 0, f'{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}'
    return r


@pytest.fixture(scope='module')
def repo(tmp_path_factory) -> Path:
    "A copy of this working tree (tracked and new files, nothing ignored) as a fresh git repo, cleaned and exported."
    dest = tmp_path_factory.mktemp('repo')
    files = sh(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], ROOT).stdout.split('\0')
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    sh('git init -q && git config user.email ci@example.com && git config user.name ci', dest)
    sh('nbdev-clean && nbdev-export && git add -A && git commit -qm baseline && git tag baseline', dest)
    return dest


@pytest.fixture
def clean_repo(repo):
    "The copy as its baseline commit, again after each test: a test that commits (a stale README) leaves no trace."
    yield repo
    sh('git reset -q --hard baseline && git clean -qfd', repo)


def gate(repo, *steps):
    return sh(['bash', 'tools/ci_gate.sh', *steps], repo, check=False)


def test_gate_passes_on_a_clean_tree(clean_repo):
    r = gate(clean_repo, 'clean', 'sync', 'readme')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'gate: 3 passed, 0 failed' in r.stdout


def test_gate_catches_an_unclean_notebook(clean_repo):
    nb_path = clean_repo / 'nbs' / 'api' / '03_machine.ipynb'
    nb = json.loads(nb_path.read_text())
    code = next(c for c in nb['cells'] if c['cell_type'] == 'code')
    code['execution_count'], code['metadata'] = 7, {'collapsed': True, 'scrolled': True}
    nb_path.write_text(json.dumps(nb, indent=1))
    sh('git commit -qam dirty', clean_repo)
    r = gate(clean_repo, 'clean', 'sync')
    assert r.returncode == 1
    assert 'notebooks are not clean' in r.stdout and 'modified nbs/api/03_machine.ipynb' in r.stdout
    assert 'gate: 1 passed, 1 failed' in r.stdout


def test_gate_catches_a_new_module_that_was_never_exported(clean_repo):
    nb = {'cells': [{'cell_type': 'code', 'execution_count': None, 'id': 'a1', 'metadata': {}, 'outputs': [],
                     'source': '#| default_exp probe'},
                    {'cell_type': 'code', 'execution_count': None, 'id': 'a2', 'metadata': {}, 'outputs': [],
                     'source': '#| export\ndef probe(): return 1'}],
          'metadata': {'kernelspec': {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}},
          'nbformat': 4, 'nbformat_minor': 5}
    (clean_repo / 'nbs' / 'api' / '98_probe.ipynb').write_text(json.dumps(nb, indent=1) + '\n')
    sh('nbdev-clean && git add -A && git commit -qm "notebook without its module"', clean_repo)
    r = gate(clean_repo, 'sync')
    assert r.returncode == 1
    assert 'out of sync' in r.stdout and 'new nxpretrain/probe.py' in r.stdout, r.stdout


def test_gate_catches_an_edited_module(clean_repo):
    mod = clean_repo / 'nxpretrain' / 'machine.py'
    mod.write_text(mod.read_text().replace('def host_info()', 'def host_info( )'))
    sh('git commit -qam "hand edit"', clean_repo)
    r = gate(clean_repo, 'sync')
    assert r.returncode == 1 and 'modified nxpretrain/machine.py' in r.stdout


def test_gate_catches_a_stale_readme(clean_repo):
    readme = clean_repo / 'README.md'
    readme.write_text(readme.read_text() + '\nedited by hand\n')
    sh('git commit -qam "readme by hand"', clean_repo)
    r = gate(clean_repo, 'readme')
    assert r.returncode == 1 and 'README.md differs from nbs/index.ipynb' in r.stderr


def test_unknown_step_is_refused(clean_repo):
    r = gate(clean_repo, 'deploy')
    assert r.returncode == 2 and "unknown step 'deploy'" in r.stdout


def test_pytest_exit_5_is_not_a_failure(clean_repo):
    shutil.rmtree(clean_repo / 'tests')
    (clean_repo / 'tests').mkdir()
    r = gate(clean_repo, 'pytest')
    assert r.returncode == 0 and 'no tests collected' in r.stdout, r.stdout


def setup_commands(readme: str) -> list[str]:
    "The shell blocks of the README's 'Set up' section."
    section = re.search(r'^## Set up\n(.*?)^## ', readme, re.S | re.M).group(1)
    return re.findall(r'```sh\n(.*?)\n```', section, re.S)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_second():
    readme = (ROOT / 'README.md').read_text()
    demo, test = setup_commands(readme)
    assert demo.startswith('python3 -m pip install torch==2.13.0 -e ".[notebooks]"') and demo.endswith(
        'nxpretrain demo'
    )
    assert test == 'bash tools/test.sh'
    run = (ROOT / '.ci' / 'run').read_text()
    assert [l for l in run.splitlines() if l and not l.startswith(('#', 'set ', 'cd '))] == [f'exec {test}']
    assert os.access(ROOT / '.ci' / 'run', os.X_OK)
    assert 'settings.ini' in readme and '[tool.nbdev]' in readme


def test_ci_run_exits_non_zero_when_the_gate_fails(tmp_path):
    "`.ci/run` passes the gate's failure through: here test.sh is replaced by one that fails."
    (tmp_path / '.ci').mkdir()
    (tmp_path / 'tools').mkdir()
    shutil.copy2(ROOT / '.ci' / 'run', tmp_path / '.ci' / 'run')
    (tmp_path / 'tools' / 'test.sh').write_text('echo gate failing; exit 3\n')
    r = sh(['bash', '.ci/run'], tmp_path, check=False)
    assert r.returncode == 3 and 'gate failing' in r.stdout


def readme_venv(readme: str) -> str:
    "The README's command that makes and enters a virtual environment (Debian's Python refuses pip outside one)."
    return re.search(r'`(python3 -m venv \.venv && \. \.venv/bin/activate)`', readme).group(1)


def demo_ending(readme: str) -> re.Pattern:
    """The lines the README says `nxpretrain demo` ends with, as a pattern: any run name in place of the README's, and
    any clone in place of its example clone (the demo prints absolute run folders)."""
    text = re.search(r'^## Set up\n.*?```text\n(.*?)\n```', readme, re.S | re.M).group(1)
    name = re.search(r'gpt3_tiny-\d{8}-\d{6}', text).group(0)
    clone = re.search(r'(/\S+)/runs/' + name, text).group(1)
    return re.compile(r'\s*\n'.join(re.escape(line).replace(re.escape(name), r'gpt3_tiny-\d{8}-\d{6}')
                                    .replace(re.escape(clone), r'/\S+') for line in text.rstrip().splitlines()))


def test_readme_setup_typed_into_its_own_venv_passes_the_gate(clean_repo):
    """A new user on Debian's Python, word for word: the README's venv at `.venv` in a fresh clone, command 1 (install
    and demo), then command 2 with the gate steps that read the tree (clean, sync, lint, readme) – the ones a venv
    inside the clone once broke. pip takes torch 2.13.0 from this machine's disk, not a CUDA build."""
    readme = (clean_repo / 'README.md').read_text()
    install_and_demo, test = setup_commands(readme)
    script = '\n'.join([
        'set -e', readme_venv(readme), install_and_demo, 'echo "== command 2"', f'{test} clean sync lint readme',
        'echo "== where"', 'python3 -c "import sys, torch, nxpretrain; print(sys.prefix, torch.__version__, '
        'nxpretrain.__file__)"', 'python3 -m pip list 2>/dev/null | grep -ci nvidia || true'])
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME')}
    try: r = subprocess.run(['bash', '-c', script], cwd=clean_repo, env=env, capture_output=True, text=True,
                            timeout=2400)
    finally:
        shutil.rmtree(clean_repo / '.venv', ignore_errors=True)   # 2.3 GB, not for pytest's kept temporary folders
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    demo, rest = r.stdout.split('== command 2\n')
    assert demo_ending(readme).search(demo), demo[-3000:]
    gate, where = rest.split('== where\n')
    assert 'gate: 4 passed, 0 failed' in gate, gate[-3000:]
    prefix, torch_version, package = where.split('\n')[0].split()
    assert (prefix, torch_version) == (str(clean_repo / '.venv'), '2.13.0+cpu'), where
    assert package == str(clean_repo / 'nxpretrain' / '__init__.py') and where.split('\n')[1] == '0', where
