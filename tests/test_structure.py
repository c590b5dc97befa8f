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
    assert not hits, f"ask nxpretrain.families.family(arch) instead: {hits}"


def test_the_trainer_does_not_duck_type_the_model():
    text = (PKG / 'train' / 'trainer.py').read_text()
    assert 'hasattr(model' not in text and 'hasattr(self.model' not in text


def test_the_engine_composes_its_concern_modules():
    text = (PKG / 'parallel' / 'parallelize.py').read_text()
    concerns = ('loss', 'pipeline', 'tensor_parallel', 'context_parallel', 'activation_checkpoint', 'saved', 'compile',
                'fsdp', 'init', 'zero')
    for concern in concerns:
        assert f'from .{concern} import' in text or f'nxpretrain.parallel.{concern} import' in text, concern
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


def test_only_the_slurm_launcher_runs_slurm_commands():
    "Engines describe jobs and the node collector parses; the Slurm launcher (and its set-up check) run Slurm's tools."
    engines = [PKG / 'launch' / f"{e}.py" for e in ('native', 'nxdt', 'megatron')] + list(PKG.glob('engines/**/*.py'))
    for path in [PKG / 'launch' / 'nodes.py', *[p for p in engines if p.exists()]]:
        text = path.read_text()
        assert 'subprocess' not in text and 'sbatch_header' not in text, path
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
    "A name says which module it is: no two modules of the package share a file name (`__init__` aside)."
    from collections import Counter
    names = Counter(p.name for p in SOURCES if p.name != '__init__.py')
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
