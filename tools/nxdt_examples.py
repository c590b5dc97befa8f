"""Write NxD Training's example configs as data files of nxpretrain's NxDT contract: one YAML file per example that
`nxpretrain/engines/nxdt/contract.yaml` names (`example_for`), with its flat dotted keys as Hydra reads them, the line
of each key, and the repository, commit and path it was read from.

Usage: python tools/nxdt_examples.py GIT_DIR_OF_NXDT [COMMIT]   (COMMIT defaults to the contract's `commit`)

`fetch github:aws-neuron/neuronx-distributed-training` gives a GIT_DIR. Facts only: values, not NxDT's code.
"""
import subprocess, sys
from pathlib import Path
import yaml
from omegaconf import OmegaConf

CONTRACTS = Path(__file__).resolve().parents[1] / 'nxpretrain' / 'engines' / 'nxdt'
HEADER = ("# NxD Training's example config, flattened to dotted keys as Hydra reads it (`${...}` kept as text),\n"
          "# with the line of each key in its file (`path` at `commit` of `repo`). Written by tools/nxdt_examples.py\n"
          "# from a checkout: regenerate it, do not edit it.\n")


def flat(d: dict, prefix: str = '') -> dict:
    "`{dotted key: leaf}` of nested dict `d` (an empty dict is a leaf), as nxpretrain.engines.nxdt.contract.flat."
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v: out.update(flat(v, f"{prefix}{k}."))
        else: out[prefix + k] = v
    return out


def key_lines(node, prefix: str = '') -> dict:
    "`{dotted key: 1-based line}` of every key of a composed YAML mapping `node`."
    out = {}
    for key, value in node.value:
        name = prefix + key.value
        if isinstance(value, yaml.MappingNode) and value.value: out.update(key_lines(value, name + '.'))
        else: out[name] = key.start_mark.line + 1
    return out


def example_file(git_dir: str, commit: str, name: str, repo: str) -> str:
    "The data file of NxDT's example `name` at `commit`."
    path = f"examples/conf/{name}.yaml"
    text = subprocess.run(['git', '--git-dir', git_dir, 'show', f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    keys = flat(OmegaConf.to_container(OmegaConf.create(text), resolve=False))   # 1e-06 is a float, as in Hydra
    lines = key_lines(yaml.compose(text))
    assert list(keys) == list(lines), f"{name}: OmegaConf and the YAML parser see different keys"
    data = {'example': name, 'repo': repo, 'commit': commit, 'path': path, 'keys': keys, 'lines': lines}
    return HEADER + yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True)


def main(git_dir: str, commit: str = ''):
    contract = yaml.safe_load((CONTRACTS / 'contract.yaml').read_text())
    commit = commit or contract['commit']
    full = subprocess.run(['git', '--git-dir', git_dir, 'rev-parse', commit], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = CONTRACTS / 'examples'
    out.mkdir(exist_ok=True)
    for name in sorted(set(contract['example_for'].values())):
        (out / f"{name}.yaml").write_text(example_file(git_dir, full, name, contract['repo']))
        print(f"wrote {out / name}.yaml")


if __name__ == '__main__': main(*sys.argv[1:])
