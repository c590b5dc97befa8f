"""Print NxD Training's example configs as flat {dotted key: value} literals, for nxpretrain.launch.nxdt_contract.

Usage: python tools/nxdt_examples.py GIT_DIR_OF_NXDT [COMMIT]
"""
import pprint, subprocess, sys
from omegaconf import OmegaConf

NAMES = ['hf_llama3_70B_config', 'hf_llama3.1_70B_config', 'hf_llama3_70B_CP_config', 'hf_llama3_8B_config',
         'megatron_gpt_config']

def flat(d, prefix=''):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v: out.update(flat(v, f"{prefix}{k}."))
        else: out[prefix + k] = v
    return out

def main(git_dir, commit='HEAD'):
    for name in NAMES:
        text = subprocess.run(['git', '--git-dir', git_dir, 'show', f"{commit}:examples/conf/{name}.yaml"],
                              capture_output=True, text=True, check=True).stdout
        # OmegaConf reads 1e-06 as a float, as Hydra does
        cfg = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
        print(f"    {name!r}: " + pprint.pformat(flat(cfg), width=118, sort_dicts=False).replace('\n', '\n    ') + ',')

if __name__ == '__main__': main(*sys.argv[1:])
