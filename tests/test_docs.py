"The docs site: built offline from every notebook, then opened in headless Chromium."
import json, os, re, shutil, subprocess, sys, tempfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import docs  # tools/docs.py

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync']


_BUILD = {}


def build_once(tmp_path_factory):
    "One build per test run, whatever it gave: a failing build is reported once, by test_the_site_builds."
    if not _BUILD:
        out = tmp_path_factory.mktemp('site')
        r = subprocess.run([sys.executable, str(ROOT / 'tools' / 'docs.py'), 'build', '--out', str(out)],
                           capture_output=True, text=True, timeout=900)
        _BUILD.update(out=out, result=r)
    return _BUILD


@pytest.fixture(scope='module')
def site(tmp_path_factory) -> Path:
    "The built site; pages nbdev could not render are still there (without their API reference)."
    b = build_once(tmp_path_factory)
    if not (b['out'] / 'index.html').exists(): pytest.fail(f"no site was built:\n{b['result'].stderr[-3000:]}")
    return b['out']


def test_the_site_builds(tmp_path_factory):
    r = build_once(tmp_path_factory)['result']
    assert r.returncode == 0, f'docs build failed:\n{r.stdout}\n{r.stderr[-6000:]}'


def test_every_notebook_has_a_page(site):
    nbs = ROOT / 'nbs'
    sources = docs.notebooks(nbs)
    assert nbs / 'index.ipynb' in sources and nbs / 'api' / '03_machine.ipynb' in sources
    missing = [
        str(p.relative_to(nbs)) for p in sources if not (site / p.relative_to(nbs)).with_suffix('.html').exists()
    ]
    assert not missing, f'notebooks without a page: {missing}'


def test_api_reference_and_navigation(site):
    html = (site / 'api' / '03_machine.html').read_text()
    for name in ('machine_report', 'recipe_gaps', 'readiness', 'parse_sinfo'):  # show_doc headings
        assert re.search(rf'<h3 id="{name}"', html), f'no show_doc section for {name}'
    assert 'def machine_report(' in re.sub(r'<[^>]+>', '', html)  # the rendered signature
    assert '#|' not in html and '{target=' not in html           # no nbdev directives or Quarto attributes left
    nav = (site / 'index.html').read_text()
    for label in ('Stages', 'API reference', '00 · Setup', 'Machine report'):
        assert label in nav, f'navigation lacks {label!r}'
    index = json.loads((site / 'search' / 'search_index.json').read_text())
    assert any('machine_report' in d.get('title', '') + d.get('text', '') for d in index['docs'])


STAGES = ['00_setup', '01_data', '02_plan', '03_compile', '04_train', '05_monitor', '06_evaluate']
text_of = lambda html: re.sub(r'\s+', ' ', re.sub(r'<[^>]+>', ' ', html).replace('&nbsp;', ' ').replace('&amp;', '&'))


def test_classes_render_as_classes(site):
    """A class's section: `class Name(…)` with its constructor's arguments, its docstring, then its methods and
    properties."""
    text = text_of((site / 'api' / '60_monitor.html').read_text())
    m = re.search(r'class\s+JobWatch\s*\(\s*job_id', text)
    assert m and not re.search(r'def\s+JobWatch\s*\(', text), 'JobWatch is not shown as a class'
    after = text[m.start():]
    assert 'redrawn in place every' in after[:800], after[:800]
    for method in ('JobWatch.redraw', 'JobWatch.follow', 'JobWatch.start', 'JobWatch.stop', 'JobWatch.running'):
        assert method in after, f'{method} is not under its class'
    assert 'Redraw in this cell until the job ends' in after
    machine = text_of((site / 'api' / '03_machine.html').read_text())
    assert re.search(r'class\s+Table\s*\(', machine) and 'Table.text' in machine
    assert not re.search(r'\)\s*->\s*None', machine), 'a class signature shows its __init__ return type'


@pytest.mark.parametrize('stage', STAGES)
def test_stage_pages_show_how_to_run_and_their_outputs(site, stage):
    "Each stage page: how to run it three ways, its parameters as a table, the parameters it ran with, real outputs."
    html = (site / f'{stage}.html').read_text()
    text = text_of(html)
    for e in ('How to run', 'In JupyterLab', f'papermill nbs/{stage}.ipynb', 'From a terminal', 'Parameters',
              'This page was run with'):
        assert e in text, f'{stage}: the page lacks {e!r}'
    assert re.search(r'<th[^>]*>\s*parameter\s*</th>', html), f'{stage}: no parameters table'
    assert html.count('jp-OutputArea-output') >= 2, f'{stage}: the page shows no outputs'
    assert 'In [ ]' not in text and 'Traceback' not in text and 'IN_TEST' not in html


@pytest.mark.parametrize('stage, figures, tables', [('02_plan', 0, 3), ('04_train', 1, 2), ('05_monitor', 1, 2),
                                                    ('06_evaluate', 0, 1), ('01_data', 1, 1), ('00_setup', 0, 2)])
def test_stage_pages_hold_figures_and_tables(site, stage, figures, tables):
    "Tables counted include the parameters table; figures are the notebook's own plots (inline PNG)."
    html = (site / f'{stage}.html').read_text()
    assert html.count('src="data:image/png;base64') >= figures, f'{stage}: fewer than {figures} figure(s)'
    assert html.count('<table') >= tables, f'{stage}: fewer than {tables} table(s)'


def test_04_train_page_holds_the_run_and_its_last_progress(site):
    text = text_of((site / '04_train.html').read_text())
    assert re.search(r'step 30/30 \| loss [\d.]+ \| [\d,]+ tokens/s \| elapsed [\d:]+ \| done', text), (
        'no final progress line'
    )
    assert 'Epoch' not in text and 'loss' in text and 'first step done' in text
    # and the exact job of a cluster recipe: gpt3_23b's plan and its sbatch script (folded)
    assert 'The same stage for a cluster recipe' in text and 'gpt3_23b' in text and '#SBATCH --nodes=4' in text
    assert '<details><summary>The job it would submit' in (site / '04_train.html').read_text()


def test_no_page_holds_test_harness_code_or_dead_links(site):
    for page in site.rglob('*.html'):
        assert 'IN_TEST' not in page.read_text(), f'{page.relative_to(site)} shows IN_TEST'
    from urllib.parse import urlsplit
    dead = docs.dead_links(site, urlsplit(docs.site_url(docs.nbdev_config())).path)
    assert not dead, f'{len(dead)} dead internal links: {dead[:20]}'


def test_dead_links_finds_missing_pages_and_anchors(tmp_path):
    (tmp_path / 'a.html').write_text('<h2 id="x">x</h2><a href="b.html#y">b</a><a href="#x">x</a><a href="#z">z</a>'
                                     '<a href="https://example.com/#q">out</a><a href="/docs/b.html">root</a>')
    (tmp_path / 'b.html').write_text('<h2 id="w">w</h2><a href="c.html">c</a>')
    assert docs.dead_links(tmp_path, '/docs/') == ['a.html: b.html#y', 'a.html: #z', 'b.html: c.html']


def test_papermill_output_of_04_train_advances_in_text(site):
    """The executed 04_train (from the build's cache): plain step lines that advance, the progress display's last state
    as HTML and text, no Epoch."""
    [nb] = list(docs.EXEC.glob('stages-*/04_train.ipynb'))
    outputs = [o for c in json.loads(nb.read_text())['cells'] for o in c.get('outputs', [])]
    stream = ''.join(''.join(o.get('text', '')) for o in outputs if o['output_type'] == 'stream')
    steps = [int(s) for s in re.findall(r'^step (\d+)/30 \|', stream, re.M)]
    assert steps == list(range(5, 31, 5)), steps
    shown = [
        o['data']
        for o in outputs
        if o['output_type'] == 'display_data' and '<progress' in ''.join(o['data'].get('text/html', ''))
    ]
    assert len(shown) == 1 and ''.join(shown[0]['text/plain']).startswith('step 30/30 | loss ')
    # no widget model: the output is its own last state
    assert 'application/vnd.jupyter.widget-view+json' not in shown[0]
    assert 'Epoch' not in json.dumps(outputs)


def test_parameters_table():
    src = "model: str = 'gpt3_tiny'  # recipe name\nsteps = 2  # how many\n           # and more\nflag: bool = False"
    assert docs.parameters_table(src).splitlines()[2:] == [
        "| `model` | `str` | `'gpt3_tiny'` | recipe name |", '| `steps` | `int` | `2` | how many and more |',
        '| `flag` | `bool` | `False` |  |']


def test_plain_notebook_turns_show_doc_into_markdown():
    nb = {
        'cells': [
            {'cell_type': 'raw', 'metadata': {}, 'source': '---\ndescription: one line\ntitle: My title\n---\n'},
            {'cell_type': 'markdown', 'metadata': {},
             'source': '<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->'},
            {
                'cell_type': 'code',
                'metadata': {'execution': {'total': 0.1}},
                'source': '#| echo: false\n#| output: asis\nshow_doc(f)',
                'outputs': [
                    {'output_type': 'display_data', 'data': {'text/markdown': '### f\n[src](x){target="_blank"}'}}
                ],
            },
            {'cell_type': 'code', 'metadata': {}, 'source': '#| eval: false\nf(1)', 'outputs': []},
        ]
    }
    out = docs.plain_notebook(nb, Path('x.ipynb'))
    assert [c['cell_type'] for c in out['cells']] == ['markdown', 'markdown', 'code']
    assert out['cells'][0]['source'] == '# My title\n\n> one line\n'
    assert out['cells'][1]['source'] == '### f\n[src](x)'
    assert out['cells'][2]['source'] == 'f(1)' and out['cells'][2]['metadata'] == {}


def chromium(*args, timeout=90) -> str:
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f'--user-data-dir={profile}', *args],
                           capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f'chromium failed: {r.stderr[-2000:]}'
    return r.stdout


needs_chromium = pytest.mark.skipif(not CHROMIUM and not os.environ.get('CI'),
                                    reason='Debian chromium not installed (tools/test.sh installs it)')


@needs_chromium
@pytest.mark.parametrize('page, expected', [
    ('index.html', ['nxpretrain', 'Set up', 'Where is settings.ini?', 'bash tools/test.sh']),
    ('api/03_machine.html', ['Machine report', 'machine_report', 'recipe_gaps', 'What each recipe needs here']),
    ('00_setup.html', ['00 · Setup', 'missing here', 'What this stage does not check yet']),
])
def test_pages_render_in_chromium(site, page, expected):
    assert CHROMIUM, 'chromium is required in CI: tools/test.sh installs it with apt-get'
    dom = chromium('--virtual-time-budget=3000', '--dump-dom', (site / page).as_uri())
    text = re.sub(r'<[^>]+>', '', dom)
    text = re.sub(r'\s+', ' ', text.replace('&nbsp;', ' ').replace('&amp;', '&'))
    for e in expected: assert e in text, f'{page}: rendered page lacks {e!r}'
    assert 'md-sidebar' in dom and 'md-content' in dom, f'{page}: the theme did not render its layout'


def saturated_colours(png: bytes, step: int = 1) -> set:
    "The strongly coloured pixels of an image (plot lines and bars, not text, grid or background), quantised."
    import io
    from PIL import Image
    im = Image.open(io.BytesIO(png)).convert('RGB')
    if step > 1: im = im.resize((im.width // step, im.height // step), Image.NEAREST)
    b = im.tobytes()
    px = zip(b[0::3], b[1::3], b[2::3])
    return {(r // 8, g // 8, b // 8) for r, g, b in px if max(r, g, b) - min(r, g, b) > 80}


@needs_chromium
@pytest.mark.parametrize('page, png, figure', [('index.html', 'docs_home.png', False),
                                                ('04_train.html', 'docs_04_train.png', True),
                                                ('api/03_machine.html', 'docs_api_machine.png', False)])
def test_screenshots_show_the_figure_and_the_table(site, page, png, figure):
    """Headless Chromium screenshots (saved under runs/): the page's table is there, and the figure's colours are on
    screen."""
    import base64
    assert CHROMIUM, 'chromium is required in CI: tools/test.sh installs it with apt-get'
    runs = ROOT / 'runs'
    runs.mkdir(exist_ok=True)
    shot = runs / png
    shot.unlink(missing_ok=True)
    chromium('--window-size=1280,5000', '--hide-scrollbars', f'--screenshot={shot}', (site / page).as_uri())
    data = shot.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n', f'{shot} is not a PNG'
    dom = chromium('--virtual-time-budget=3000', '--dump-dom', (site / page).as_uri())
    assert '<table' in dom, f'{page}: no table rendered'
    if figure:
        figs = re.findall(r'<img[^>]* src="data:image/png;base64,([^"]+)"', dom)
        assert figs, f'{page}: no figure rendered'
        want = saturated_colours(base64.b64decode(figs[0]))
        seen = saturated_colours(data, step=2)
        assert len(want & seen) >= min(5, len(want)), (f'{page}: the screenshot does not show the figure '
                                                       f'({len(want & seen)} colours)')


def test_a_notebook_nbdev_cannot_render_fails_the_build_by_name(tmp_path):
    "The site is still built (the page shows the notebook without its API reference), but the build exits 1 naming it."
    for d in ('nbs', 'nxpretrain', 'tools'):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy2(ROOT / 'pyproject.toml', tmp_path / 'pyproject.toml')
    for nb in (tmp_path / 'nbs').rglob('*.ipynb'):
        if nb.name not in ('index.ipynb', '03_machine.ipynb'): nb.unlink()
    cell = lambda src: {'cell_type': 'code', 'execution_count': None, 'id': f'c{abs(hash(src)) % 10**8}',
                        'metadata': {}, 'outputs': [], 'source': src}
    broken = {
        'cells': [
            {'cell_type': 'markdown', 'id': 'm1', 'metadata': {}, 'source': '# Broken\n> a cell nbdev runs fails'},
            cell('#| default_exp broken'),
            cell('#| export\ndef probe():\n    "Documented."\n    return 1'),
            cell('import os\nvalue = defined_in_an_earlier_cell'),
        ],
        'metadata': {'kernelspec': {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}},
        'nbformat': 4,
        'nbformat_minor': 5,
    }
    (tmp_path / 'nbs' / 'api' / '97_broken.ipynb').write_text(json.dumps(broken))
    r = subprocess.run([sys.executable, 'tools/docs.py', 'build', '--no-execute', '--out', str(tmp_path / 'site')],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert (
        'nbs/api/97_broken.ipynb: nbdev could not render' in r.stderr
        and "'defined_in_an_earlier_cell' is not defined" in r.stderr
    )
    assert '1 notebook(s) failed to render: nbs/api/97_broken.ipynb' in r.stderr
    assert 'Broken' in (tmp_path / 'site' / 'api' / '97_broken.html').read_text()
    assert '<h3 id="machine_report"' in (tmp_path / 'site' / 'api' / '03_machine.html').read_text()
