"""The stage notebooks as sources: committed without outputs (a lab runs in working copies, tests/test_browser.py),
their test-harness cells collapsed in JupyterLab and hidden on the site, and each ending with what to run next."""
import json
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted((ROOT / 'nbs').glob('0*.ipynb'))


def test_there_are_seven_stages():
    assert [p.stem for p in STAGES] == ['00_setup', '01_data', '02_plan', '03_compile', '04_train', '05_monitor',
                                        '06_evaluate']


@pytest.mark.parametrize('nb', STAGES, ids=lambda p: p.stem)
def test_stage_source_is_clean(nb):
    cells = json.loads(nb.read_text())['cells']
    code = [c for c in cells if c['cell_type'] == 'code']
    assert not [i for i, c in enumerate(code) if c.get('outputs') or c.get('execution_count')], (
        f"{nb.name} holds outputs: clear them (nbdev-clean keeps outputs; run the stage in a working copy)")
    assert any('parameters' in c['metadata'].get('tags', []) for c in code), f"{nb.name}: no parameters cell"
    harness = [c for c in code if 'IN_TEST' in ''.join(c['source'])]
    for c in harness:
        src = ''.join(c['source'])
        assert src.startswith('#| hide'), f"{nb.name}: an IN_TEST cell without #| hide shows on the site:\n{src}"
        assert c['metadata'].get('jupyter', {}).get('source_hidden'), f"{nb.name}: IN_TEST cell not collapsed:\n{src}"
    assert "stage_next(" in ''.join(code[-1]['source']), f"{nb.name} does not end with its Next: cell"
