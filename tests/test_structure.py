"""The shape of the package a newcomer extends: short functions, no branching on the model architecture outside
`nxpretrain/models/` (consumers ask the model family), one training path (no duck-typing of the model in the trainer),
and an engine that composes its concern modules."""
import ast, re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / 'nxpretrain'
SOURCES = [p for p in sorted(PKG.rglob('*.py')) if p.name != '_modidx.py']
MAX_FUNCTION_LINES = 60


def test_no_function_longer_than_60_lines():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES: long.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_no_architecture_branches_outside_models():
    pattern = re.compile(r"\barch\s*(==|!=)")
    hits = [f"{p.relative_to(PKG)}:{i}" for p in SOURCES if 'models' not in p.relative_to(PKG).parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, f"ask nxpretrain.models.families.family(arch) instead: {hits}"


def test_the_trainer_does_not_duck_type_the_model():
    text = (PKG / 'train' / 'trainer.py').read_text()
    assert 'hasattr(model' not in text and 'hasattr(self.model' not in text


def test_the_engine_composes_its_concern_modules():
    text = (PKG / 'parallel' / 'parallelize.py').read_text()
    concerns = ('loss', 'pipeline', 'tensor_parallel', 'context_parallel', 'activation_checkpoint', 'saved', 'compile',
                'fsdp', 'init')
    for concern in concerns:
        assert f'from .{concern} import' in text or f'nxpretrain.parallel.{concern} import' in text, concern
    step = (PKG / 'train' / 'step.py').read_text()   # the step apart from the layout: sums, ZeRO-1, loss, schedule
    for concern in ('zero', 'loss', 'pipeline', 'tensor_parallel', 'ring'):
        assert f'from ..parallel.{concern} import' in step, concern
    tree = ast.parse(text)
    attached = [n for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and getattr(t.value, 'id', '') == 'ParallelModel' for t in n.targets)]
    assert not attached, 'ParallelModel methods belong in its class body'


def _is_import(line: str) -> bool:
    return line.startswith('import ') or (line.startswith('from ') and ' import ' in line)


def test_notebook_imports_stand_in_cells_of_their_own():
    """nbdev's docs render runs a notebook's import cells without the cells before them: a cell that mixes imports with
    other code fails there (its API page loses its reference) and warns on every build."""
    import json
    mixed = []
    for nb in sorted((PKG.parent / 'nbs').rglob('*.ipynb')):
        if {'.ipynb_checkpoints', 'runs', '_exec'} & set(nb.parts): continue   # outputs, not sources
        for i, cell in enumerate(json.loads(nb.read_text())['cells']):
            src = ''.join(cell['source'])
            if cell['cell_type'] != 'code' or re.search(r'^#\|\s*export', src, re.M): continue
            code = [l for l in src.splitlines() if l.strip() and not l.startswith('#')]
            if any(map(_is_import, code)) and not all(map(_is_import, code)):
                mixed.append(f"{nb.relative_to(PKG.parent)} cell {i}")
    assert not mixed, mixed


def test_the_monitor_runs_no_scheduler_command():
    "The monitor asks the launcher interface (status, records, logs); only launchers talk to a scheduler."
    text = (PKG / 'monitor.py').read_text()
    for word in ('subprocess', 'scontrol', 'sacct', 'squeue', "scheduler != 'slurm'", '._listed'):
        assert word not in text, word


def test_engines_and_the_node_collector_write_no_scheduler_header():
    "Engines describe jobs and the node collector parses; the Slurm launcher (and its set-up check) run Slurm's tools."
    engines = [PKG / 'launch' / f"{e}.py" for e in ('native', 'nxdt', 'megatron')] + list(PKG.glob('engines/**/*.py'))
    for path in [PKG / 'launch' / 'nodes.py', *[p for p in engines if p.exists()]]:
        text = path.read_text()
        assert 'subprocess' not in text and 'sbatch_header' not in text, path
        assert 'render_job' not in text, f"{path}: return the job's description; its caller has it rendered"
        assert "scheduler='slurm'" not in text, path


def test_no_export_cell_longer_than_60_lines():
    "fastcore's rhythm: a unit, a sentence, its example – a long class is split with @patch, as 41_checkpoint does."
    import json
    long = []
    for nb in sorted((PKG.parent / 'nbs' / 'api').glob('*.ipynb')):
        for i, cell in enumerate(json.loads(nb.read_text())['cells']):
            src = ''.join(cell['source'])
            if cell['cell_type'] == 'code' and re.match(r'#\|\s*export', src) and len(src.splitlines()) > 60:
                long.append(f"{nb.name} cell {i} ({len(src.splitlines())} lines)")
    assert not long, long


def test_no_module_name_is_used_twice():
    """A name says which module it is: no two modules of the package share a file name (`__init__` aside). An engine's
    package names its modules by their role (`engines/NAME/job.py`, `contract.py`, `checkpoint.py`), as torchtitan's
    model folders do: the folder says whose they are."""
    from collections import Counter
    in_engine = lambda p: p.relative_to(PKG).parts[0] == 'engines' and len(p.relative_to(PKG).parts) == 3
    names = Counter(p.name for p in SOURCES if p.name != '__init__.py' and not in_engine(p))
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)


# The package's floors, from the ground up: a module imports only from its own floor or below. A module stands on the
# first floor one of whose names is it or a package above it.
FLOORS = [
    ['nxpretrain.errors', 'nxpretrain.checksum', 'nxpretrain.progress', 'nxpretrain.literate', 'nxpretrain.seeds',
     'nxpretrain.engines.base'],
    ['nxpretrain.models', 'nxpretrain.data'],
    ['nxpretrain.clusters', 'nxpretrain.config', 'nxpretrain.recipes', 'nxpretrain.validate', 'nxpretrain.lab',
     'nxpretrain.machine', 'nxpretrain.data_paths'],
    ['nxpretrain.jobs'],   # the job description an engine returns and a launcher renders
    ['nxpretrain.parallel'],
    ['nxpretrain.steptime', 'nxpretrain.calibration', 'nxpretrain.plan', 'nxpretrain.perf'],
    ['nxpretrain.train', 'nxpretrain.testing'],
    ['nxpretrain.engines'],
    ['nxpretrain.launch', 'nxpretrain.convert'],
    ['nxpretrain.stages', 'nxpretrain.trace', 'nxpretrain.measure', 'nxpretrain.evaluate', 'nxpretrain.runs',
     'nxpretrain.monitor', 'nxpretrain.cli'],
]
KNOWN_UPWARD: set = set()   # none left: an arrow that runs upward fails the test below


def floor_of(module: str) -> int:
    "The floor `module` stands on: the first floor naming it, or a package above it."
    for i, names in enumerate(FLOORS):
        if any(module == n or module.startswith(n + '.') for n in names): return i
    return 0 if module == 'nxpretrain' else -1


def test_every_module_stands_on_a_floor():
    from test_imports import MODULES
    assert not [m for m in MODULES if floor_of(m) < 0], [m for m in MODULES if floor_of(m) < 0]


def test_no_import_runs_upward_and_none_in_a_circle():
    "errors → models, data → recipes → jobs → parallel → plan → train → engines → launch → stages, CLI, monitor."
    from test_imports import cycles, graph
    g = graph()
    up = sorted((a, b) for a, deps in g.items() for b in deps if floor_of(b) > floor_of(a))
    assert [e for e in up if e not in KNOWN_UPWARD] == [], [e for e in up if e not in KNOWN_UPWARD]
    assert [e for e in KNOWN_UPWARD if e not in up] == [], 'an arrow of KNOWN_UPWARD is gone: take it off the list'
    assert not cycles(g)


def test_the_engine_interface_imports_only_the_errors():
    from test_imports import graph
    assert graph()['nxpretrain.engines.base'] <= {'nxpretrain.errors'}


ENGINE_NAMES = {'native', 'nxdt', 'megatron'}
# a field's default names the engine a recipe (or a job written before engines were recorded) runs on
ENGINE_NAME_DEFAULTS = {('config.py', 'engine'), ('jobs/description.py', 'engine')}


def test_no_engine_is_named_outside_the_engines():
    """The stages, the plan, the monitor and the launchers ask the engine (`nxpretrain.engines.base.Engine`), never its
    name: an engine name as a string outside `nxpretrain/engines/` (a field's default aside), or `engine=NAME` in a
    message."""
    hits = []
    for path in SOURCES:
        rel = path.relative_to(PKG)
        if rel.parts[0] == 'engines': continue
        tree = ast.parse(path.read_text())
        defaults = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and n.value is not None
                    and (rel.as_posix(), getattr(n.target, 'id', '')) in ENGINE_NAME_DEFAULTS}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in defaults: continue
            if node.value in ENGINE_NAMES or re.search(r'\bengine=(native|nxdt|megatron)\b', node.value):
                hits.append(f"{rel}:{node.lineno} {node.value[:60]!r}")
    assert not hits, hits


SLURM_COMMANDS = {'squeue', 'sbatch', 'srun', 'sinfo', 'scancel', 'scontrol', 'sacct'}
SLURM_LAUNCHER = {'launch/slurm.py', 'launch/slurmcheck.py'}
# the local test cluster is Slurm itself: it looks for Slurm's own programs to start them
SLURM_ITSELF = {'testing/local_slurm.py'}
KNOWN_SLURM_CALLERS: set = set()   # none left: the machine report is handed the Slurm launcher's sinfo answer


def _slurm_argv(node) -> bool:
    """Is `node` a list or tuple literal that starts with a Slurm command (an argv, wherever it is built)? A literal of
    names only, every one a Slurm command (`('sbatch', 'srun')`: whose option lists), is no argv."""
    if not (isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant)):
        return False
    names_only = all(isinstance(e, ast.Constant) and e.value in SLURM_COMMANDS for e in node.elts)
    return node.elts[0].value in SLURM_COMMANDS and not names_only


def test_only_the_slurm_launcher_runs_slurm_commands():
    """A Slurm command (`squeue`, `sbatch`, …) at the head of a list or tuple – the argv a call is handed, or one built
    in a variable first: only in the Slurm launcher's modules."""
    callers = set()
    for path in SOURCES:
        if any(map(_slurm_argv, ast.walk(ast.parse(path.read_text())))): callers.add(path.relative_to(PKG).as_posix())
    strays = callers - SLURM_LAUNCHER - KNOWN_SLURM_CALLERS - SLURM_ITSELF
    assert strays == set(), strays
    assert KNOWN_SLURM_CALLERS <= callers, 'a known caller runs no Slurm command now: take it off the list'


def test_a_slurm_argv_built_in_a_variable_counts():
    "The probe's old shape – the argv in a variable, then `subprocess.run(argv)` – is a Slurm command too."
    built = "argv = ['srun', '--nodes=1', *part, 'bash', '-c', script]\np = subprocess.run(argv)"
    assert any(map(_slurm_argv, ast.walk(ast.parse(built))))
    assert not any(map(_slurm_argv, ast.walk(ast.parse("subprocess.run(['bash', '-c', 'srun hostname'])"))))
    assert not any(map(_slurm_argv, ast.walk(ast.parse("SITE_LISTS = ('sbatch', 'srun')"))))


def _calls(path: Path) -> list[tuple[str, int]]:
    "(called expression, line) of every call in `path`."
    return [(ast.unparse(n.func), n.lineno) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


STEP = PKG / 'train' / 'step.py'
# harnesses that run the step's pieces one by one with checks between: the layout and memory tests' reference, the trace
STEP_HARNESSES = (PKG / 'testing', PKG / 'trace.py')


def test_one_micro_batch_loop():
    "Micro-batches are cut in one place, `train.step.split_micro_batches`, which the engine and the XLA path share."
    cuts = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == 'slice' and node.args and isinstance(
                    node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Mult):
                cuts.append(f"{path.relative_to(PKG)}:{node.lineno}")
            if isinstance(node, ast.For) and re.search(r'range\(.*//', ast.unparse(node.iter)):
                cuts.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert [c.split(':')[0] for c in cuts] == ['train/step.py'], cuts
    users = [p.relative_to(PKG).as_posix() for p in SOURCES if any(c == 'split_micro_batches' for c, _ in _calls(p))]
    assert users == ['train/step.py', 'train/xla_model.py'], users


def test_one_optimizer_builder():
    """Optimizers are built in one place, `ParallelModel.build_optimizer`; ZeRO-1 builds its inner optimizer over its
    shard, and the layout test's single-process reference its own."""
    built = re.compile(r'^(torch\.optim\.[A-Z]\w*|Lamb|Zero1Optimizer|FlatZero1Optimizer|optim_cls|zero1)$')
    allowed = {STEP, PKG / 'parallel' / 'zero.py', PKG / 'testing' / 'layouts.py'}
    hits = [f"{p.relative_to(PKG)}:{line} {c}" for p in SOURCES if p not in allowed for c, line in _calls(p)
            if built.match(c)]
    assert not hits, hits


def test_one_step_function():
    "One step, `ParallelModel.train_step`: the trainer calls it, and nothing else strings the step's pieces together."
    pieces = ('.forward_backward', '.clip_grad_norm_')
    hits = [f"{p.relative_to(PKG)}:{line} {c}" for p in SOURCES if p != STEP
            and not any(p == h or h in p.parents for h in STEP_HARNESSES)
            for c, line in _calls(p) if c.endswith(pieces)]
    assert not hits, hits
    trainer = [c for c, _ in _calls(PKG / 'train' / 'trainer.py')]
    assert 'self.model.train_step' in trainer and not any(c.endswith('optimizer.step') for c in trainer), trainer


MAX_TABLE_LINES = 20
HELP_TEXT: set = set()   # (module, name) of a long literal that is no table (none left)


def _assigned_name(tree: ast.Module, node: ast.AST) -> str:
    "The module-level name `node` is (part of) the value of, or ''."
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.lineno <= node.lineno <= stmt.end_lineno:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            return ','.join(ast.unparse(t) for t in targets)
    return ''


def test_no_data_table_written_as_a_long_literal():
    """Data stays data: catalogs, contracts and facts are YAML files under `nxpretrain/` (`catalog/…`,
    `engines/*/contract.yaml`), read by a few lines of code – no dict, list, tuple or set literal outside a function
    spans more than 20 lines (a function's literal maps its arguments: code, not a table)."""
    long = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        functions = [(f.lineno, f.end_lineno) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.Lambda))]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)): continue
            if not any(a <= node.lineno <= b for a, b in functions):
                n = node.end_lineno - node.lineno + 1
                name = _assigned_name(tree, node)
                if n > MAX_TABLE_LINES and (path.relative_to(PKG).as_posix(), name) not in HELP_TEXT:
                    long.append(f"{path.relative_to(PKG)}:{node.lineno} {name or type(node).__name__} ({n} lines)")
    assert not long, f"move these tables into YAML files under nxpretrain/catalog/: {long}"


def test_every_data_file_ships_in_the_wheel():
    "Each YAML file the package reads is matched by `pyproject.toml`'s package-data, so an installed wheel has it."
    import tomllib
    setuptools = tomllib.loads((PKG.parent / 'pyproject.toml').read_text())['tool']['setuptools']
    globs = setuptools['package-data']['nxpretrain']
    data = sorted(p.relative_to(PKG) for p in PKG.rglob('*.yaml'))
    assert data and not [str(p) for p in data if not any(p.match(g) and len(p.parts) == len(Path(g).parts)
                                                         for g in globs)]


def _example_cells(nb: Path) -> list:
    "A notebook's example cells: code cells that are no export, hidden or `default_exp` cell and not only imports."
    import json
    cells = []
    for cell in json.loads(nb.read_text())['cells']:
        src = ''.join(cell['source'])
        if cell['cell_type'] != 'code' or re.search(r'^#\|\s*(export|hide|default_exp)', src, re.M): continue
        code = [l for l in src.splitlines() if l.strip() and not l.startswith('#')]
        if code and all(map(_is_import, code)): continue
        cells.append(cell)
    return cells


def test_a_quarter_of_the_examples_show_their_output():
    """A module notebook is read as documentation: an example that shows its result (a plan, a job script's line, a
    table, a loss) teaches more than one that only asserts. At least a quarter of `nbs/api`'s examples keep an
    output."""
    cells = [c for nb in sorted((PKG.parent / 'nbs' / 'api').glob('*.ipynb')) for c in _example_cells(nb)]
    shown = [c for c in cells if c.get('outputs')]
    share = len(shown) / len(cells)
    assert share >= 0.25, f"{len(shown)} of {len(cells)} examples keep an output ({share:.1%}); show more results"
