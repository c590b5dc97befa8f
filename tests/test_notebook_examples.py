"""fastcore's rhythm in the module notebooks (`nbs/api/41_checkpoint.ipynb` is the house's anchor): each exported
unit is followed – before the next exported cell – by a sentence (a Markdown cell) and its example (a shown code cell
that uses every public name the unit defines, and is also a test). Every module notebook keeps it whole (331 of 655
units lacked one when this test came)."""
import ast, json, re
from pathlib import Path

API = Path(__file__).resolve().parents[1] / 'nbs' / 'api'
UNIT = re.compile(r'^#\|\s*exports?\s*$', re.M)        # a cell whose code is exported and shown
EXPORTED = re.compile(r'^#\|\s*export', re.M)          # any exported cell (`exporti` too) ends a unit's examples
NOT_SHOWN = re.compile(r'^#\|\s*(hide|default_exp)', re.M)


def public_names(src: str) -> list[str]:
    "The public functions and classes a cell defines (`@patch`ed methods by their own names)."
    try: tree = ast.parse(src)
    except SyntaxError: return []
    units = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n.name for n in tree.body if isinstance(n, units) and not n.name.startswith('_')]


def used_names(src: str) -> set[str]:
    "Every name and attribute a cell's code mentions (IPython's `!` and `%` lines aside)."
    code = '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith(('!', '%')))
    try: tree = ast.parse(code)
    except SyntaxError: return set(re.findall(r'\w+', code))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def gaps(cells: list) -> list[str]:
    "'cell I: what is missing' for each exported unit of `cells` (a notebook's) without its sentence or its example."
    found = []
    for i, cell in enumerate(cells):
        src = ''.join(cell['source'])
        names = public_names(src) if cell['cell_type'] == 'code' and UNIT.search(src) else []
        if not names: continue
        sentence, used = False, set()
        for after in cells[i + 1:]:
            text = ''.join(after['source'])
            if after['cell_type'] == 'markdown': sentence = True
            elif EXPORTED.search(text): break
            elif after['cell_type'] == 'code' and not NOT_SHOWN.search(text): used |= used_names(text)
        missing = ([] if sentence else ['sentence']) + [f"example of {n}" for n in names if n not in used]
        if missing: found.append(f"cell {i} ({', '.join(names)}): no {', no '.join(missing)}")
    return found


def notebook_gaps() -> dict[str, list[str]]:
    return {nb.stem: gaps(json.loads(nb.read_text())['cells']) for nb in sorted(API.glob('*.ipynb'))}


def _cell(kind: str, src: str) -> dict: return {'cell_type': kind, 'source': [src]}


def test_the_check_sees_a_missing_sentence_or_example():
    unit = _cell('code', '#| export\ndef area(w, h): return w * h\n\ndef _helper(): pass')
    sentence = _cell('markdown', 'The area of a rectangle.')
    example = _cell('code', 'test_eq(area(2, 3), 6)')
    hidden = _cell('code', '#| hide\ntest_eq(area(2, 3), 6)')
    nxt = _cell('code', '#| export\nclass Box: pass')
    assert gaps([unit, sentence, example, nxt, sentence, _cell('code', 'Box()')]) == []
    assert gaps([unit, example, nxt]) == ['cell 0 (area): no sentence', 'cell 2 (Box): no sentence, no example of Box']
    assert gaps([unit, sentence, hidden]) == ['cell 0 (area): no example of area']
    assert gaps([unit, sentence, nxt, example]) == ['cell 0 (area): no example of area',
                                                    'cell 2 (Box): no sentence, no example of Box']
    patched = _cell('code', '#| export\n@patch\ndef grow(self: Box, by): pass')
    assert gaps([patched, sentence, _cell('code', 'Box().grow(2)')]) == []


def test_each_exported_unit_has_its_sentence_and_example():
    found = {name: g for name, g in notebook_gaps().items() if g}
    assert not found, found
