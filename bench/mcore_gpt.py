"""megatron-core's GPTModel with nxpretrain GPT's config and weights: the competitor row of `bench_model.py --megatron`.

megatron-core is a benchmark competitor here, not a dependency of nxpretrain. Its GPTModel is built with the
TransformerEngine layer spec where TransformerEngine is installed (as NVIDIA trains it), else with its local spec.
It computes its own loss (`labels=`: its vocab-parallel cross-entropy). On a CPU, megatron-core's model runs too,
except for three CUDA-only calls in its attention (a scratch buffer, the default causal mask, the RNG fork around a
dropout of zero): `cpu_shims` points the first at the CPU and makes the last a no-op, and the bench passes the mask.
Its torch_dist checkpoint save needs `cpu_save_shims` (tests/test_megatron_checkpoint.py).
"""
import contextlib, math
import torch

def transformer_engine_available() -> bool:
    try:
        import transformer_engine.pytorch   # noqa: F401
        return True
    except ImportError:
        return False

def cpu_shims():
    "Let megatron-core's attention run on a CPU: its scratch buffer on the CPU, no CUDA RNG fork (dropout is 0)."
    from megatron.core import tensor_parallel, utils
    def get_tensor(self, shape, dtype, name, mem_alloc_context=None):
        n = math.prod(shape)
        if self.buffer.get((name, dtype)) is None or self.buffer[(name, dtype)].numel() < n:
            self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype)
        return self.buffer[(name, dtype)][:n].view(*shape)
    utils.GlobalMemoryBuffer.get_tensor = get_tensor
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()

def cpu_save_shims():
    """Let megatron-core's torch_dist save run on a CPU: no CUDA synchronisation, its failure flag on the CPU, and no
    per-writer memory log where psutil is missing. Its pipeline schedule's p2p needs the first two as well (0.16.1:
    receive buffers on `torch.cuda.current_device()`, pipeline_parallel/p2p_communication.py:313, 321;
    `torch.cuda.synchronize()` after `batch_isend_irecv`, :398; both "Torch not compiled with CUDA enabled")."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: 'cpu'
    if not filesystem_async.HAVE_PSUTIL: filesystem_async._process_memory = lambda: 0

def cuda_on_cpu():
    """A torch function mode under which megatron-core's DDP wrapper and optimizer run on a CPU (megatron-core 0.16.1):
    a tensor made on 'cuda' is made on the CPU, `.cuda()` is the identity, and a CPU tensor's `.type()` names its CUDA
    type. Without it these calls stop them: `_ParamAndGradBuffer.__init__` (distributed/param_and_grad_buffer.py:806,
    `torch.cuda.current_device()`), `FP32Optimizer.__init__` (optimizer/optimizer.py:907, `torch.tensor(...,
    device='cuda')`), both "AssertionError: Torch not compiled with CUDA enabled"; `clip_grad_by_total_norm_fp32`
    (optimizer/clip_grads.py:167, `assert param.grad.type() == 'torch.cuda.FloatTensor'`); the distributed optimizer's
    `_build_model_and_main_param_groups` (optimizer/distrib_optimizer.py:431, TypeError "Wrapped parameters must be
    one of torch.cuda.FloatTensor, …"). Use with `cpu_save_shims` (its `torch.cuda.current_device`)."""
    from torch.overrides import TorchFunctionMode
    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if 'cuda' in str(kwargs.get('device', '')): kwargs['device'] = 'cpu'
            if func is torch.Tensor.cuda: return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = torch._C.TensorBase.type(args[0])
                return name if '.cuda.' in name else name.replace('torch.', 'torch.cuda.', 1)
            return func(*args, **kwargs)
    return CudaOnCpu()

def init_megatron(device: str, tp: int = 1, pp: int = 1):
    "megatron-core's model-parallel state in the world the caller has started (TP = `tp`, PP = `pp`)."
    from megatron.core import parallel_state, tensor_parallel
    if not parallel_state.model_parallel_is_initialized(): parallel_state.initialize_model_parallel(tp, pp)
    if device == 'cuda': tensor_parallel.model_parallel_cuda_manual_seed(0)
    else: cpu_shims()

def megatron_gpt(cfg, vocab_size: int, device: str, tp: int = 1):
    """(megatron-core GPTModel of nxpretrain's GPT config `cfg`, the name of its layer spec), on `device`, dropout 0,
    this rank's shard at tensor-parallel `tp`."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    init_megatron(device, tp)
    te = device == 'cuda' and transformer_engine_available()
    cpu = device != 'cuda'
    # on a CPU its CUDA fusions are off; on a GPU megatron-core's defaults stand
    fusions = dict(bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
                   persist_layer_norm=False, gradient_accumulation_fusion=False) if cpu else {}
    config = TransformerConfig(num_layers=cfg.n_layers, hidden_size=cfg.hidden, num_attention_heads=cfg.n_heads,
                               ffn_hidden_size=cfg.ffn, layernorm_epsilon=cfg.norm_eps, init_method_std=cfg.init_std,
                               hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=cpu, **fusions)
    spec = specs.get_gpt_layer_with_transformer_engine_spec() if te else specs.get_gpt_layer_local_spec()
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
                     max_sequence_length=cfg.positions, position_embedding_type='learned_absolute',
                     share_embeddings_and_output_weights=cfg.tie_embeddings)
    return model.to(device), 'TransformerEngine' if te else 'local'

def megatron_state_dict(cfg, sd: dict, te: bool) -> dict:
    "nxpretrain GPT state dict `sd` in megatron-core's names (the table the Megatron-LM checkpoint reader uses)."
    from nxpretrain.engines.megatron import checkpoint as names
    return names.megatron_state_dict(cfg, sd, names.TE_NORMS if te else names.LOCAL_NORMS)

def load_weights(model, cfg, sd: dict, spec: str):
    "Load nxpretrain's weights `sd` into megatron-core's `model`; every tensor of either side must be used."
    theirs = megatron_state_dict(cfg, sd, spec == 'TransformerEngine')
    res = model.load_state_dict(theirs, strict=False)
    missing = [k for k in res.missing_keys if not k.endswith('_extra_state')]
    if missing or res.unexpected_keys:
        raise RuntimeError(f"megatron-core GPTModel ({spec} spec) weights: missing {missing}, unexpected "
                           f"{res.unexpected_keys}")
    return model

def megatron_loss(model, seq_len: int, device: str):
    "The mean per-token loss of megatron-core's `model` on (inputs, labels), computed by megatron-core itself."
    positions = torch.arange(seq_len, device=device)[None]
    causal = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device=device).triu(1)   # True: masked
    def loss(x, y): return model(x, positions.expand_as(x), causal, labels=y).float().mean()
    return loss
