"""How soon each stage notebook shows something: the time from Run All (the first code cell sent to a running kernel)
to its first output, and to its end, for every stage notebook with the CPU parameters the docs build uses.

The notebooks run in order in one temporary folder (05 and 06 look at the run 04 made), each in a fresh kernel, the
way JupyterLab runs them: the parameters cell, then an injected cell with the parameters, then the rest. The target
is a first output within 2 s, so that a person sees what the stage is doing while it imports and prepares.

    python bench/bench_first_output.py
"""
import json, os, queue, sys, tempfile, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import docs   # noqa: E402  (its STAGE_PARAMS: the parameters the docs build runs the stages with)
from jupyter_client.manager import start_new_kernel   # noqa: E402


def code_cells(nb_path: Path, params: dict) -> list[str]:
    "The notebook's code cells, with an assignment of `params` after the parameters cell (as papermill injects it)."
    cells = []
    for c in json.loads(nb_path.read_text())['cells']:
        if c['cell_type'] != 'code': continue
        cells.append(''.join(c['source']))
        if 'parameters' in c.get('metadata', {}).get('tags', []):
            cells.append('\n'.join(f"{k} = {v!r}" for k, v in params.items()))
    return cells


def run(nb_path: Path, params: dict, cwd: Path, env: dict) -> dict:
    "Seconds to the first output and to the end of `nb_path`, and what the first output said."
    km, kc = start_new_kernel(kernel_name='python3', cwd=str(cwd), env=env)
    first, said = None, ''
    try:
        t0 = time.perf_counter()
        for code in code_cells(nb_path, params):
            def hook(msg):
                nonlocal first, said
                if first is None and msg['msg_type'] in ('stream', 'display_data', 'execute_result', 'error'):
                    first = time.perf_counter() - t0
                    c = msg['content']
                    said = c.get('text') or ''.join(c.get('data', {}).get('text/plain', '')) or c.get('ename', '')
            reply = kc.execute_interactive(code, timeout=900, output_hook=hook)
            if reply['content']['status'] != 'ok':
                raise RuntimeError(f"{nb_path.name}: {reply['content'].get('evalue')}")
        return dict(first_s=first, total_s=time.perf_counter() - t0, said=' '.join(said.split())[:70])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main():
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', '')}
    env.pop('IN_TEST', None)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {os.cpu_count()} CPUs; first output target 2 s")
    print(f"{'stage':<18} {'first output':>12} {'whole':>8}  first thing shown")
    with tempfile.TemporaryDirectory() as tmp:
        for name, params in docs.STAGE_PARAMS.items():
            r = run(ROOT / 'nbs' / name, params, Path(tmp), env)
            first = f"{r['first_s']:.1f} s" if r['first_s'] is not None else 'none'
            print(f"{name:<18} {first:>12} {r['total_s']:>6.1f} s  {r['said']}", flush=True)


if __name__ == '__main__': main()
