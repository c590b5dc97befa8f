#!/usr/bin/env python3
"""Build the docs site from the notebooks, offline, and keep README.md in step with nbs/index.ipynb.

    python tools/docs.py build [--out site]    # every notebook under nbs/, executed → site/ (HTML, search, navigation)
    python tools/docs.py serve [--port 8000]   # build, then serve site/ at http://localhost:8000
    python tools/docs.py execute               # only execute the notebooks (cached): CI's notebook tests
    python tools/docs.py readme [--check]      # nbs/index.ipynb → README.md (--check: fail if README.md differs)

The build executes every notebook first: the stage notebooks through papermill with the CPU parameters of STAGE_PARAMS
(one working folder under _exec/, so 05 and 06 see the run 04 made), the others as nbdev-test runs them. Executions are
cached in _exec/ by the notebook's, the package's and the parameters' content: an unchanged rebuild runs nothing.

Where Quarto exists, `nbdev-docs` renders the same notebooks through nbs/_quarto.yml. Here: nbdev renders the API
reference (show_doc) into _proc/, this script turns each processed notebook into a plain one (title cell, show_doc
output as Markdown, no directives), and mkdocs-material + mkdocs-jupyter build the site. Every notebook under nbs/
is picked up: nbs/index.ipynb is the home page, nbs/NN_*.ipynb the stages, nbs/api/*.ipynb the API reference, any other
folder its own section.
"""
from __future__ import annotations
import argparse, json, os, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGING = ROOT / '_docs'                 # processed notebooks + mkdocs.yml (git-ignored)
QUARTO_ATTR = re.compile(r'\{target="_blank"\}|\{\.[\w-]+\}')  # Quarto-only link/span attributes in show_doc Markdown
DIRECTIVE = re.compile(r'^\s*#\|.*\n?', re.M)


def fail(msg: str):
    print(f'docs: {msg}', file=sys.stderr)
    sys.exit(1)


def notebooks(nbs: Path) -> list[Path]:
    "Every notebook nbdev would document: not in hidden/underscore folders, not starting with _ or ."
    return sorted(p for p in nbs.rglob('*.ipynb')
                  if not any(part.startswith(('_', '.')) for part in p.relative_to(nbs).parts))


def front_matter(text: str) -> dict:
    "title/description of the YAML front matter nbdev writes for a `# Title` + `> summary` cell."
    import yaml
    m = re.match(r'^---\n(.*?)\n---', text, re.S)
    return (yaml.safe_load(m.group(1)) or {}) if m else {}


def parameters_table(src: str) -> str:
    "A papermill parameters cell as a Markdown table: name, type, default and the comment that explains it."
    import ast, io, tokenize
    comments = {t.start[0]: t.string.lstrip('#').strip() for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT and not t.string.startswith('#|')}
    lines, rows = src.splitlines(), []
    for node in ast.parse(src).body:
        if isinstance(node, ast.AnnAssign): name, kind = node.target.id, ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, kind = node.targets[0].id, type(ast.literal_eval(node.value)).__name__
        else: continue
        said = [comments[i] for i in range(node.lineno, node.end_lineno + 1) if i in comments]
        nxt = node.end_lineno + 1   # comment-only lines below continue it
        while nxt in comments and not lines[nxt - 1].split('#')[0].strip():
            said.append(comments[nxt])
            nxt += 1
        cell = lambda t: t.replace('|', '\\|').replace('<', '&lt;')
        rows.append(f"| `{name}` | `{kind}` | `{cell(ast.unparse(node.value))}` | {cell(' '.join(said))} |")
    return '| parameter | type | default | meaning |\n| --- | --- | --- | --- |\n' + '\n'.join(rows) + '\n'


WIDGET = 'application/vnd.jupyter.widget-view+json'


def page_outputs(outputs: list) -> list:
    """Outputs as a static page shows them: a widget view (live only in a kernel) gives way to the HTML its output
    carries beside it; a widget with nothing but text beside it (a tqdm bar) is left out."""
    out = []
    for o in outputs:
        data = o.get('data', {})
        if WIDGET in data:
            if 'text/html' not in data: continue
            o = {**o, 'data': {k: v for k, v in data.items() if k != WIDGET}}
        out.append(o)
    return out


def plain_notebook(nb: dict, path: Path) -> dict:
    "A processed notebook as plain nbformat: front matter → title cell, show_doc → Markdown, no directives or metadata."
    cells = []
    for c in nb['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] == 'raw':
            fm = front_matter(src)
            if fm.get('title'):
                md = f"# {fm['title']}\n\n" + (f"> {fm['description']}\n" if fm.get('description') else '')
                cells.append(dict(cell_type='markdown', metadata={}, source=md))
            continue
        if c['cell_type'] == 'markdown':
            if src.startswith('<!-- WARNING: THIS FILE WAS AUTOGENERATED'): continue
            cells.append(dict(cell_type='markdown', metadata={}, source=QUARTO_ATTR.sub('', src)))
            continue
        if re.search(r'^#\|\s*echo:\s*false', src, re.M):  # show_doc and other output-only cells
            md = ''.join(''.join(o.get('data', {}).get('text/markdown', '')) for o in c.get('outputs', []))
            if md.strip(): cells.append(dict(cell_type='markdown', metadata={}, source=QUARTO_ATTR.sub('', md)))
            continue
        tags = c.get('metadata', {}).get('tags', [])
        if 'injected-parameters' in tags:   # what papermill ran this page with
            ran = ', '.join(ln.strip() for ln in src.splitlines() if ln.strip() and not ln.startswith('#'))
            cells.append(dict(cell_type='markdown', metadata={}, source=f'This page was run with `{ran}`.\n'))
            continue
        code = DIRECTIVE.sub('', src).strip('\n')
        if 'parameters' in tags:
            cells.append(dict(cell_type='markdown', metadata={}, source='## Parameters\n\n' + parameters_table(code)))
            continue
        outputs = page_outputs(c.get('outputs', []))
        if not code and not outputs: continue
        cells.append(dict(cell_type='code', metadata={}, execution_count=None, source=code, outputs=outputs))
    if not cells or not cells[0]['source'].startswith('# '):
        cells.insert(0, dict(cell_type='markdown', metadata={}, source=f'# {path.stem}\n'))
    for i, c in enumerate(cells): c['id'] = f'cell-{i}'
    return dict(nbformat=4, nbformat_minor=5, cells=cells,
                metadata=dict(kernelspec=dict(name='python3', display_name='Python 3', language='python'),
                              language_info=dict(name='python')))


HEADING = re.compile(r'<h([1-6]) id="([^"]*)"([^>]*)>(.*?)</h\1>', re.S)


def toc_ids(staged: Path) -> list[str]:
    "The anchors the page's table of contents links to, in order (as mkdocs-jupyter computes them)."
    import hashlib
    cache = EXEC / 'toc' / (hashlib.sha256(staged.read_bytes()).hexdigest()[:20] + '.json')
    if cache.exists(): return json.loads(cache.read_text())
    from mkdocs_jupyter.plugin import _get_nb_toc_tokens
    flat = lambda ts: [i for t in ts for i in [t['id'], *flat(t['children'])]]
    ids = flat(_get_nb_toc_tokens(str(staged), 6)[0])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(ids))
    return ids


def match_toc_ids(page: Path, staged: Path) -> None:
    """Give the page's headings the anchors its table of contents links to. mkdocs-jupyter builds the contents from a
    Markdown export that drops inline code from headings and numbers repeated ones (`x`, `x_1`); nbconvert, which
    writes the headings, does neither. Both list the notebook's Markdown headings in the same order."""
    html = page.read_text()
    heads = [m for m in HEADING.finditer(html) if 'class="anchor-link"' in m.group(4)]
    ids = toc_ids(staged)
    if len(heads) != len(ids) or all(m.group(2) == i for m, i in zip(heads, ids)): return
    out, at = [], 0
    for m, new in zip(heads, ids):
        inner = m.group(4).replace(f'href="#{m.group(2)}"', f'href="#{new}"')
        out += [html[at:m.start()], f'<h{m.group(1)} id="{new}"{m.group(3)}>{inner}</h{m.group(1)}>']
        at = m.end()
    page.write_text(''.join(out) + html[at:])


def dead_links(site: Path, base: str = '/') -> list[str]:
    "Every internal link of the site whose page or anchor does not exist, as 'page: href'."
    import html as htmllib
    from urllib.parse import urlsplit, unquote
    anchors: dict[Path, set] = {}
    def ids(p: Path) -> set:
        if p not in anchors: anchors[p] = set(re.findall(r'\s(?:id|name)="([^"]+)"', p.read_text(errors='replace')))
        return anchors[p]
    dead = []
    for page in sorted(site.rglob('*.html')):
        for href in re.findall(r'<a\s[^>]*?href="([^"]*)"', page.read_text(errors='replace')):
            u = urlsplit(htmllib.unescape(href))
            if u.scheme or u.netloc: continue
            path = unquote(u.path)
            if path.startswith('/'): target = site / path[len(base):] if path.startswith(base) else site / '__outside__'
            else: target = (page.parent / path) if path else page
            if target.is_dir(): target = target / 'index.html'
            if not target.exists() or (
                u.fragment and target.suffix == '.html' and unquote(u.fragment) not in ids(target)
            ):
                dead.append(f'{page.relative_to(site)}: {href}')
    return dead


def title_of(nb: dict, path: Path) -> str:
    first = nb['cells'][0]['source'] if nb['cells'] else ''
    return first.splitlines()[0][2:].strip() if first.startswith('# ') else path.stem


def site_config(pages: dict[str, list[tuple[str, str]]], cfg: dict) -> dict:
    "mkdocs.yml for the staged notebooks: material theme with no web fonts, search, notebooks as pages."
    nav = [{'Home': 'index.ipynb'}] if 'Home' in pages else []
    nav += [{section: [{t: f} for t, f in items]} for section, items in pages.items() if section != 'Home']
    return {
        'site_name': cfg.get('title', 'docs'),
        'site_url': site_url(cfg),
        'site_description': cfg.get('description', ''),
        'repo_url': cfg.get('git_url', ''),
        'docs_dir': 'src',
        'use_directory_urls': False,
        'theme': {'name': 'material', 'font': False, 'features': ['navigation.sections', 'search.highlight']},
        'plugins': [
            'search',
            {
                'mkdocs-jupyter': {
                    'include_source': True,
                    'execute': False,
                    'include': ['*.ipynb'],
                    'include_requirejs': False,
                    'no_prompt': True,
                    'cache': True,
                    'cache_dir': str(EXEC / 'mkdocs-jupyter'),
                }
            },
        ],
        'markdown_extensions': ['tables', 'admonition', 'pymdownx.superfences'],
        'nav': nav,
    }


def site_url(cfg: dict) -> str:
    "Where the site is published (pyproject's doc_host + doc_baseurl), ending in a slash."
    return cfg.get('doc_host', 'http://localhost').rstrip('/') + '/' + cfg.get('doc_baseurl', '').strip('/') + '/'


def section_of(rel: Path) -> str:
    if rel == Path('index.ipynb'): return 'Home'
    if len(rel.parts) == 1: return 'Stages'
    return {'api': 'API reference'}.get(rel.parts[0], rel.parts[0].replace('_', ' ').capitalize())


def nbdev_config() -> dict:
    import tomllib
    return tomllib.loads((ROOT / 'pyproject.toml').read_text()).get('tool', {}).get('nbdev', {})


# ---- executed notebooks, cached by content ---------------------------------------------------------------------------
EXEC = ROOT / '_exec'   # executed notebooks, keyed by the notebook's and the package's content (git-ignored)
# The stage notebooks run through papermill, in this order, in one working folder (so 05 and 06 find 04's run),
# with these parameters: CPU recipes, a short run.
STAGE_PARAMS = {
    '00_setup.ipynb': {'recipes': 'all'},
    '01_data.ipynb': {'corpus': 'demo'},
    '02_plan.ipynb': {'model': 'gpt3_23b'},
    '03_compile.ipynb': {'model': 'gpt3_tiny'},
    '04_train.ipynb': {
        'model': 'gpt3_tiny',
        'max_steps': 30,
        'overrides': 'trainer.log_every=5 trainer.eval_every=15 trainer.save_every=30',
    },
    '05_monitor.ipynb': {'model': 'gpt3_tiny'},
    '06_evaluate.ipynb': {'model': 'gpt3_tiny', 'export_hf': 'runs/hf/gpt3_tiny'},
}

# A second run of a stage, shown at the end of its page: {notebook: (heading, what it shows, parameters)}.
STAGE_EXTRA = {'04_train.ipynb': ('The same stage for a cluster recipe',
                                  'With `-p model gpt3_23b` and no cluster, the stage plans the job, writes it and '
                                  'stops: the exact job it would submit (here an NxD Training job for 4 trn1 nodes).',
                                  {'model': 'gpt3_23b'})}


def package_key() -> str:
    "A hash of the package's content: every executed notebook depends on it."
    import hashlib
    h = hashlib.sha256()
    for f in sorted((ROOT / 'nxpretrain').rglob('*.py')):
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def content_key(*parts) -> str:
    import hashlib
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True).encode())
        h.update(b'\0')
    return h.hexdigest()[:20]


def _execute_api(job) -> str | None:
    "Run one API notebook as nbdev-test does (in its folder, IN_TEST=1, flagged cells skipped); write it with outputs."
    src, dst, skip_flags = job
    from execnb.shell import CaptureShell
    from fastcore.nbio import write_nb
    from fastcore.xtras import working_directory
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell
    os.environ['IN_TEST'] = '1'
    nb = NBProcessor(src, rm_directives=False, process=True).nb
    k = CaptureShell(src)
    import tempfile
    with tempfile.TemporaryFile() as said:   # what subprocesses print past the shell: shown only if the notebook fails
        saved = os.dup(1), os.dup(2)
        os.dup2(said.fileno(), 1)
        os.dup2(said.fileno(), 2)
        try:
            with working_directory(src.parent):
                k.run_all(nb, exc_stop=True, preproc=_skip_cell(nb, skip_flags), cell_timeout=600)
            error = None
        except Exception:
            import traceback
            error = k.prettytb(fname=src) or traceback.format_exc()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved: os.close(fd)
        if error:
            said.seek(0)
            return error + '\n' + said.read().decode(errors='replace')[-3000:]
    for c in nb.cells: c.get('metadata', {}).pop('execution', None)
    tmp = dst.with_suffix('.tmp')
    write_nb(nb, tmp)
    tmp.replace(dst)
    return None


def execute_api(sources: list[Path], nbs: Path, workers: int, log=print, force_flags=()) -> dict[Path, Path]:
    """Each notebook executed as nbdev-test runs it (cached under _exec/api by the notebook's and the package's content,
    and the flags). Returns {source: executed copy}; fails naming the notebooks whose cells raised."""
    from concurrent.futures import ProcessPoolExecutor
    flags = sorted(set(str(nbdev_config().get('tst_flags', '')).split()) - set(force_flags))
    pkg, done, todo = package_key(), {}, []
    for src in sources:
        dst = EXEC / 'api' / f"{src.relative_to(nbs).with_suffix('')}-{content_key(src.read_bytes(), pkg, flags)}.ipynb"
        done[src] = dst
        if not dst.exists(): todo.append((src, dst, flags))
    for src, dst in done.items():   # forget stale executions of these notebooks
        for old in dst.parent.glob(f"{src.stem}-*.ipynb"):
            if old != dst and re.fullmatch(rf'{re.escape(src.stem)}-[0-9a-f]{{20}}\.ipynb', old.name): old.unlink()
    if todo:
        log(f'docs: executing {len(todo)} of {len(sources)} notebooks as nbdev-test does ({workers} workers)')
        for _, dst, _ in todo: dst.parent.mkdir(parents=True, exist_ok=True)
        import multiprocessing   # forked like nbdev-test's workers, before any kernel or thread starts here
        with ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context('fork')) as pool:
            run = sys.modules[__name__]._execute_api if __name__ != '__main__' else __import__('docs')._execute_api
            errors = {j[0]: e for j, e in zip(todo, pool.map(run, todo)) if e}
        if errors:
            for src, err in errors.items(): print(f'docs: {src.relative_to(ROOT)} failed:\n{err}\n', file=sys.stderr)
            fail(f'{len(errors)} notebook(s) failed to execute: {", ".join(str(p.relative_to(ROOT)) for p in errors)}')
    return done


def _ipc_kernel_manager():
    "A kernel manager whose kernel talks over local sockets (IPC), not TCP: nothing to warn about."
    from jupyter_client.manager import KernelManager
    class IPCKernelManager(KernelManager):
        def __init__(self, **kw):   # a loaded machine may need more than the default 5 s to shut a kernel down
            super().__init__(**{**kw, 'transport': 'ipc', 'shutdown_wait_time': 60})
    return IPCKernelManager


def execute_stages(sources: list[Path], log=print) -> dict[Path, Path]:
    """The stage notebooks run through papermill with STAGE_PARAMS, one after another in one working folder
    (cached under _exec/stages-<key> by the notebooks', the package's and the parameters' content)."""
    stages = [s for s in sources if is_stage(s)]
    stages.sort(key=lambda s: list(STAGE_PARAMS).index(s.name))
    key = content_key(package_key(), STAGE_PARAMS, repr(STAGE_EXTRA), *[s.read_bytes() for s in stages])
    dest = EXEC / f'stages-{key}'
    if not (dest / 'done').exists():
        import papermill as pm
        IPCKernelManager = _ipc_kernel_manager()
        for old in EXEC.glob('stages-*'): shutil.rmtree(old, ignore_errors=True)
        work = dest / 'work'
        work.mkdir(parents=True, exist_ok=True)
        # the work folder is the stages' project: their runs/ go there, not into the clone's (nxpretrain.runs)
        env = dict(os.environ, NXPRETRAIN_HOME=str(work / 'home'), NXPRETRAIN_DATA=str(work / 'runs' / 'data'),
                   NXPRETRAIN_PROJECT=str(work))
        env.pop('IN_TEST', None)
        def run(src: Path, out: Path, params: dict):
            t, saved = time.perf_counter(), dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            try:
                pm.execute_notebook(str(src), str(out), parameters=params, cwd=str(work), kernel_name='python3',
                                    progress_bar=False, log_output=False, kernel_manager_class=IPCKernelManager)
            except Exception as e:
                fail(f'{src.relative_to(ROOT)} failed under papermill with {params} (its output: '
                     f'{out}):\n{str(e)[-3000:]}')
            finally:
                os.environ.clear()
                os.environ.update(saved)
            log(f'docs: executed {src.relative_to(ROOT)} with {params} in {time.perf_counter() - t:.1f} s')
        for src in stages:
            run(src, dest / src.name, STAGE_PARAMS[src.name])
            if src.name in STAGE_EXTRA:
                title, said, params = STAGE_EXTRA[src.name]
                run(src, dest / f'{src.stem}-extra.ipynb', params)
                append_run(dest / src.name, dest / f'{src.stem}-extra.ipynb', title, said)
        (dest / 'done').write_text('')
    return {s: dest / s.name for s in stages}


def append_run(page: Path, extra: Path, title: str, said: str) -> None:
    """Append to executed notebook `page` the cells of `extra` (the same notebook run with other parameters) that show
    something."""
    nb, more = json.loads(page.read_text()), json.loads(extra.read_text())
    tags = lambda c: c.get('metadata', {}).get('tags', [])
    start = next((i for i, c in enumerate(more['cells']) if 'injected-parameters' in tags(c)), 0)
    cells = [{**c, 'metadata': {}} for c in more['cells'][start + 1:] if c['cell_type'] == 'code' and c.get('outputs')]
    head = {'cell_type': 'markdown', 'metadata': {}, 'source': f'## {title}\n\n{said}\n'}
    for i, c in enumerate([head, *cells]): c['id'] = f'extra-{i}'
    nb['cells'] += [head, *cells]
    page.write_text(json.dumps(nb, indent=1))


def is_stage(src: Path) -> bool: return src.parent == ROOT / 'nbs' and src.name in STAGE_PARAMS


def execute(nbs: Path, workers: int, log=print, force_flags=()) -> dict[Path, Path]:
    """Every notebook executed, or taken from the cache: the stage notebooks through papermill (STAGE_PARAMS), the
    others as nbdev-test runs them. {source: executed notebook}."""
    sources = notebooks(nbs)
    ran = execute_api([s for s in sources if not is_stage(s)], nbs, workers, log, force_flags)
    ran.update(execute_stages(sources, log))
    return ran


def executed_tree(nbs: Path, workers: int, log=print) -> Path:
    """_exec/nbs: every notebook of the site, executed. A file is rewritten only when its execution changed, so nbdev
    renders only those again."""
    sources = notebooks(nbs)
    ran = execute(nbs, workers, log)
    tree = EXEC / 'nbs'
    for src in sources:
        dst = tree / src.relative_to(nbs)
        dst.parent.mkdir(parents=True, exist_ok=True)
        new = ran.get(src, src)
        if not dst.exists() or dst.read_bytes() != new.read_bytes(): shutil.copyfile(new, dst)
    keep = {tree / s.relative_to(nbs) for s in sources}
    for old in tree.rglob('*.ipynb'):
        if old not in keep: old.unlink()
    return tree


def class_renderer(base):
    """nbdev's show_doc renderer `base`, showing a class as a class: `class Name(…)` with its constructor's arguments,
    its docstring, then each public method (signature and docstring) and property defined in its body."""
    import inspect

    class ClassRenderer(base):
        def _repr_markdown_(self):
            md = super()._repr_markdown_()
            cls = self.sym
            if not inspect.isclass(cls): return md
            name = cls.__name__
            md = md.replace(f'def {name}(', f'class {name}(', 1).replace(')->None:\n```', '):\n```', 1)
            for attr, member in vars(cls).items():
                if attr.startswith('_'): continue
                if isinstance(member, property):
                    doc = inspect.getdoc(member) or ''
                    md += f"\n\n{'#' * (self.title_level + 1)} {name}.{attr}\n\n*property*" + (
                        f" – *{doc}*" if doc else ''
                    )
                    continue
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if not inspect.isfunction(fn): continue
                sub = base(fn, name=f'{name}.{attr}', title_level=self.title_level + 1)._repr_markdown_()
                md += '\n\n' + sub.removeprefix('---\n\n')
            return md
    return ClassRenderer


def render_notebook(job):
    "nbdev's show_doc rendering of one notebook (`nbdev.serve_drv.main`), classes rendered by `class_renderer`."
    import nbdev.showdoc, nbdev.serve_drv
    if not getattr(nbdev.showdoc, '_nxp_classes', False):
        nbdev.showdoc.BasicMarkdownRenderer = class_renderer(nbdev.showdoc.BasicMarkdownRenderer)
        nbdev.showdoc._nxp_classes = True
    return nbdev.serve_drv.main(job)


def process(nbs: Path, workers: int, cache: Path) -> tuple[Path, dict]:
    """nbdev's show_doc rendering of every notebook into _proc/ (like nbdev-proc-nbs, which would try to install
    Quarto). Returns the folder and {notebook: error} for those nbdev could not render."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing
    from nbdev.serve import _proc_file
    # Render this checkout's package, not another one an editable install points to (the workers inherit the variable).
    os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    sys.path.insert(0, str(ROOT))
    # skips notebooks rendered since their last edit
    jobs = [j for src in notebooks(nbs) if (j := _proc_file(src, cache, nbs))]
    render = sys.modules[__name__].render_notebook if __name__ != '__main__' else __import__('docs').render_notebook
    errors = {}
    with ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context('spawn')) as pool:
        for job, fut in [(j, pool.submit(render, j)) for j in jobs]:
            try: fut.result()
            except Exception as e: errors[job[0]] = f'{type(e).__name__}: {e}'[:3000]
    for src in errors: (cache / src.relative_to(nbs)).unlink(missing_ok=True)  # never keep a stale rendering
    return cache, errors


def source_notebook(nb: dict) -> dict:
    "A notebook nbdev could not render, shown as it is: hidden cells dropped, no show_doc."
    keep = [c for c in nb['cells'] if not re.search(r'^#\|\s*hide\b', ''.join(c['source']), re.M)]
    return {**nb, 'cells': keep}


def build(out: Path, workers: int = 2, execute: bool = True) -> Path:
    t0 = time.perf_counter()
    nbs = ROOT / nbdev_config().get('nbs_path', 'nbs')
    sources = notebooks(nbs)
    if not sources: fail(f'no notebooks under {nbs}')
    os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    tree = executed_tree(nbs, workers) if execute else nbs
    proc, errors = process(tree, workers, EXEC / 'proc' if execute else ROOT / '_proc')
    errors = {nbs / p.relative_to(tree): e for p, e in errors.items()}
    shutil.rmtree(STAGING, ignore_errors=True)
    pages: dict[str, list] = {}
    for src in sources:
        rel = src.relative_to(nbs)
        done = proc / rel if src not in errors else None
        if done is not None and not done.exists():
            errors[src] = f'nbdev left no rendering in {done}'
            done = None
        try:
            nb = plain_notebook(json.loads(done.read_text()) if done else source_notebook(json.loads(src.read_text())),
                                src)
        except (ValueError, KeyError) as e: fail(f'{src.relative_to(ROOT)}: cannot read the notebook ({e})')
        dest = STAGING / 'src' / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(nb, indent=1))
        pages.setdefault(section_of(rel), []).append((title_of(nb, src), str(rel)))
    import yaml
    (STAGING / 'mkdocs.yml').write_text(yaml.safe_dump(site_config(pages, nbdev_config()), sort_keys=False))
    out = out if out.is_absolute() else ROOT / out
    r = subprocess.run(
        [sys.executable, '-m', 'mkdocs', 'build', '--clean', '-f', str(STAGING / 'mkdocs.yml'), '-d', str(out)],
        cwd=STAGING,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_MKDOCS_2_WARNING='1'),
    )  # the theme's end-of-life notice, not about this site
    if r.returncode: fail(f'mkdocs build failed:\n{r.stderr or r.stdout}')
    said = [ln for ln in (r.stderr + r.stdout).splitlines() if not re.match(r'INFO\s', ln) and ln.strip()]
    if said: fail('mkdocs warned (fix the notebook it names):\n' + '\n'.join(said))
    missing = [str(rel) for _, items in pages.items() for _,
               rel in items if not (out / Path(rel).with_suffix('.html')).exists()]
    if missing: fail(f'pages missing from {out}: {", ".join(missing)}')
    for _, items in pages.items():
        for _, rel in items: match_toc_ids(out / Path(rel).with_suffix('.html'), STAGING / 'src' / rel)
    from urllib.parse import urlsplit
    if dead := dead_links(out, urlsplit(site_url(nbdev_config())).path):
        fail(f'{len(dead)} dead internal link(s):\n' + '\n'.join(dead[:50]))
    if errors:
        for src, err in errors.items():
            print(f'docs: {src.relative_to(ROOT)}: nbdev could not render its API reference; the page shows the '
                  f'notebook without it.\n{err}\n', file=sys.stderr)
        fail(f'{len(errors)} notebook(s) failed to render: {", ".join(str(p.relative_to(ROOT)) for p in errors)}. '
             'nbdev runs their import, export and show_doc cells while rendering (not the others): a cell that mixes '
             'imports with other code runs without the cells before it – put imports in a cell of their own.')
    print(f'docs: {sum(map(len, pages.values()))} pages from {len(sources)} notebooks → '
          f'{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} in {time.perf_counter() - t0:.1f} s')
    return out


def readme_text(index: Path) -> str:
    """README.md from nbs/index.ipynb: Markdown cells as they are, code cells as fenced Python, text outputs as plain
    blocks."""
    nb, parts = json.loads(index.read_text()), []
    for c in nb['cells']:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown': parts.append(src)
        elif c['cell_type'] == 'code':
            if re.search(r'^#\|\s*(hide|include:\s*false)', src, re.M): continue
            code = DIRECTIVE.sub('', src).strip('\n')
            if code: parts.append(f'```python\n{code}\n```')
            text = ''.join(
                ''.join(o.get('text', '') or o.get('data', {}).get('text/plain', ''))
                for o in c.get('outputs', [])
                if o.get('output_type') in ('stream', 'execute_result')
            )
            if text.strip(): parts.append(f'```\n{text.rstrip()}\n```')
    return '<!-- Generated from nbs/index.ipynb by tools/docs.py readme: edit the notebook, not this file. -->\n\n' + \
        '\n\n'.join(parts) + '\n'


def readme(check: bool) -> None:
    index, dest = ROOT / 'nbs' / 'index.ipynb', ROOT / 'README.md'
    if not index.exists(): fail(f'{index.relative_to(ROOT)} is missing: it is the source of README.md')
    text = readme_text(index)
    if check:
        have = dest.read_text().splitlines() if dest.exists() else []
        if have != text.splitlines():
            line = next((i for i, (a, b) in enumerate(zip(have, text.splitlines())) if a != b), len(have))
            fail(f'README.md differs from nbs/index.ipynb from line {line + 1}: run `python tools/docs.py readme` and '
                 'commit both')
        return print('docs: README.md matches nbs/index.ipynb')
    dest.write_text(text)
    print(f'docs: wrote README.md from {index.relative_to(ROOT)}')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    b = sub.add_parser('build', help='build the site from every notebook')
    b.add_argument('--out', default='site', help='output folder (default: site/)')
    b.add_argument('--workers', type=int, default=min(2, os.cpu_count() or 1))
    b.add_argument('--no-execute', dest='execute', action='store_false',
                   help='render the notebooks as stored, without running them (no outputs)')
    e = sub.add_parser('execute', help='execute every notebook (cached), as the build does: the notebook tests of CI')
    e.add_argument('--workers', type=int, default=min(2, os.cpu_count() or 1))
    e.add_argument('--flags', default='', help='space-separated flags of cells to run too (e.g. slow)')
    s = sub.add_parser('serve', help='build the site, then serve it locally')
    s.add_argument('--out', default='site', help='output folder (default: site/)')
    s.add_argument('--port', type=int, default=8000)
    s.add_argument('--workers', type=int, default=min(2, os.cpu_count() or 1))
    r = sub.add_parser('readme', help='write README.md from nbs/index.ipynb')
    r.add_argument('--check', action='store_true', help='only check that README.md is up to date')
    a = ap.parse_args(argv)
    if a.cmd == 'build': build(Path(a.out), a.workers, a.execute)
    elif a.cmd == 'serve':
        import functools, http.server
        site = build(Path(a.out), a.workers)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
        with http.server.ThreadingHTTPServer(('127.0.0.1', a.port), handler) as httpd:
            print(f'docs: serving {site} at http://localhost:{a.port}/ (Ctrl-C stops)')
            try: httpd.serve_forever()
            except KeyboardInterrupt: pass
    elif a.cmd == 'execute':
        t0 = time.perf_counter()
        os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
        ran = execute(ROOT / nbdev_config().get('nbs_path', 'nbs'), a.workers, force_flags=a.flags.split())
        print(f'docs: {len(ran)} notebooks executed or cached in {time.perf_counter() - t0:.1f} s')
    else: readme(a.check)


if __name__ == '__main__':
    main()
