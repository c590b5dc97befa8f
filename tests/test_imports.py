"""The package's import structure: no import circle (counting imports inside functions), every module importable on its
own in a fresh interpreter, the error module a leaf, and no private name imported from another module."""
import ast, subprocess, sys
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1] / 'nxpretrain'



def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob('*.py')) if p.name != '_modidx.py'}


def imports_of(name: str) -> list[tuple[str, list[str]]]:
    "(module, names) of every import in module `name` of the package, at any depth (functions included)."
    path, out = MODULES[name], []
    package = name.split('.') if path.name == '__init__.py' else name.split('.')[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = '.'.join(base + ([node.module] if node.module else []))
            out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import): out += [(a.name, []) for a in node.names]
    return out


def graph() -> dict[str, set[str]]:
    "Module → package modules it imports (a `from pkg import mod` counts as importing `pkg.mod`)."
    g = {}
    for name in MODULES:
        deps = set()
        for target, names in imports_of(name):
            deps |= {t for t in [target, *(f"{target}.{n}" for n in names)] if t in MODULES}
        g[name] = deps - {name, 'nxpretrain'}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    "The strongly connected components of more than one module (Tarjan)."
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(g):
        if v not in index: visit(v)
    return out


def test_cycle_finder_finds_a_circle():
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert cycles({'a': {'b'}, 'b': set()}) == []


def test_no_import_circle():
    g = graph()
    assert 'nxpretrain.recipes' in g and 'nxpretrain.errors' in g['nxpretrain.recipes']
    assert cycles(g) == []


def test_errors_is_a_leaf():
    assert graph()['nxpretrain.errors'] == set()


def test_no_private_names_across_modules():
    found = set()
    for name in MODULES:
        for target, names in imports_of(name):
            if target.startswith('nxpretrain') and target != name:
                found |= {(name, target, n) for n in names if n.startswith('_')}
    assert not found, sorted(found)   # give the name a public one in its module, or move it where it is used


def test_every_module_imports_first():
    "Each module imported first in a fresh package state: an import that only works after another module fails here."
    code = (f"import sys, importlib, traceback\nnames = {sorted(MODULES)!r}\nbad = []\nfor n in names:\n    for m in "
            "[m for m in sys.modules if m == 'nxpretrain' or m.startswith('nxpretrain.')]: del sys.modules[m]\n    "
            "try: importlib.import_module(n)\n    except Exception: bad.append(n + ': ' + "
            "traceback.format_exc(limit=-1).strip().splitlines()[-1])\nprint('\\n'.join(bad)); sys.exit(1 if bad "
            "else 0)\n")
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600, cwd=PKG.parent)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
