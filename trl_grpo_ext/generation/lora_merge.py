"""Generating from LoRA weights merged into the base weights, without drift.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) computes h = W₀x + ΔW·x with ΔW = (α/r)·B·A. Unmerged, every
adapted linear layer runs its base matmul plus A, B, a scale and an add: four more kernel launches per layer and
decoded token, which is what makes decoding launch-bound. Merged, W = W₀ + ΔW is one matmul.

PEFT's own `merge_adapter()` / `unmerge_adapter()` adds ΔW and subtracts it again in the weights' dtype. In bf16,
(W₀ + ΔW) − ΔW is not W₀ (each step rounds), so the frozen base drifts a little more with every cycle. Here it never
does:

* `InplaceMerge` writes W₀ + ΔW into the policy's own base weights for one generation and then copies W₀ back from
  a copy taken once in host memory: bit for bit, whatever the dtype. GPU memory: none; host memory: one copy of the
  adapted layers' base weights; time: one host-to-device copy of them per generation.
* `GenerationCopy` is a second model of the policy's architecture whose adapted linear layers hold W₀ + ΔW in the
  compute dtype and which shares every other tensor (embeddings, norms, biases, rotary buffers) with the policy. For
  4-bit (QLoRA) weights, W₀ is dequantized. The policy is never written. GPU memory: one compute-dtype copy of the
  adapted (and quantized) linear layers.

ΔW comes from PEFT's public `LoraLayer.get_delta_weight`; the sum W₀ + ΔW is taken in fp32 and rounded once.
Supported: PEFT LoRA on `nn.Linear` and bitsandbytes 4-bit linear layers, any number of active adapters. Refused
(`ValueError`, naming the layer): DoRA, `lora_bias`, LoRA on other layer types, `modules_to_save`.
"""

import copy
import logging
import weakref
from contextlib import contextmanager, suppress

import torch
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from peft.utils.integrations import dequantize_module_weight

logger = logging.getLogger(__name__)


def is_quantized_linear(module: torch.nn.Module) -> bool:
    """Whether `module` holds bitsandbytes-quantized weights (`Params4bit` / `Int8Params`)."""
    weight = getattr(module, "weight", None)
    return type(weight).__name__ in ("Params4bit", "Int8Params")


def lora_linears(model: torch.nn.Module) -> dict[str, LoraLayer]:
    """The LoRA linear layers of a PEFT model, by module name (relative to `model`).

    Raises:
        ValueError: no LoRA layer, or a layer this module cannot merge exactly (DoRA, `lora_bias`, a non-linear base
            layer, `modules_to_save`), naming it.
    """
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            raise ValueError(f"generation_lora_merge: {name} is a PEFT modules_to_save layer, which is not supported")
        if not isinstance(module, LoraLayer):
            continue
        base = module.get_base_layer()
        if not (isinstance(base, torch.nn.Linear) or is_quantized_linear(base)):
            raise ValueError(f"generation_lora_merge: {name} adapts a {type(base).__name__}; only linear layers merge")
        for adapter in module.active_adapters:
            if module.use_dora.get(adapter, False) or module.lora_bias.get(adapter, False):
                raise ValueError(f"generation_lora_merge: {name} uses DoRA or lora_bias, which do not merge exactly")
        layers[name] = module
    if not layers:
        raise ValueError(
            "generation_lora_merge needs a PEFT LoRA model (peft_config), but the model has no LoRA layer"
        )
    return layers


def lora_delta(layer: LoraLayer) -> torch.Tensor | None:
    """ΔW = Σ over the layer's active adapters of (α/r)·B·A, shape (d_out, d_in), in the adapters' dtype (PEFT's
    `get_delta_weight`, arXiv:2106.09685, eq. 3); None when no active adapter adapts this layer."""
    deltas = [layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A]
    return sum(deltas[1:], deltas[0]) if deltas else None


@torch.no_grad()
def merged_weight(layer: LoraLayer, dtype: torch.dtype) -> torch.Tensor:
    """W₀ + ΔW for one LoRA layer, shape (d_out, d_in): summed in fp32, rounded once to `dtype`. W₀ is dequantized when
    it is 4-bit or 8-bit; without an active adapter the result is W₀."""
    base = dequantize_module_weight(layer.get_base_layer())
    delta = lora_delta(layer)
    return base.to(dtype) if delta is None else (base.float() + delta.float()).to(dtype)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model computes in: bitsandbytes' compute dtype for quantized linear layers, else that of the input
    embeddings."""
    for module in model.modules():
        if is_quantized_linear(module) and getattr(module, "compute_dtype", None) is not None:
            return module.compute_dtype
    return model.get_input_embeddings().weight.dtype


class InplaceMerge:
    """Merge the LoRA adapters into the policy's own base weights for a generation; restore them exactly after.

    The copy of the base weights W₀ lives in host memory as one flat buffer per dtype (`buffers`; the weights of a
    model usually share one dtype) of exactly the bytes of the adapted layers' base weights, each layer's copy
    (`backup[name]`, shape (d_out, d_in)) a view into it. With the weights on CUDA the buffers are page-locked, so the
    restore is a DMA, by registering ordinary host memory with CUDA (`cudaHostRegister`, as torch's own
    `torch.cuda._pin_memory_utils` does for checkpoint staging), not by `pin_memory=True`: torch's caching host
    allocator (`ATen/core/CachingHostAllocator.h`) rounds every pinned block up to a power of two (up to
    `pinned_max_round_threshold`, unbounded by default), almost twice the bytes asked for at worst. Registered memory
    holds the bytes stated (`backup_bytes`), is not counted by `torch.cuda.host_memory_stats`, and is unregistered
    when the merge is dropped (`close`). If CUDA refuses the registration, the buffers stay pageable (a warning): the
    restore is then a synchronous copy, still exact.

    Args:
        model: a PEFT model (`PeftModel`) with LoRA on unquantized linear layers.

    Raises:
        ValueError: quantized base weights (a merge into 4-bit weights would requantize them, which is lossy; use
            `GenerationCopy`), a base weight tied to the embeddings, or a layer `lora_linears` refuses.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers = self.check(model)
        weights = {name: layer.get_base_layer().weight.detach() for name, layer in self.layers.items()}
        numel = {}  # dtype -> elements of its flat buffer
        for weight in weights.values():
            numel[weight.dtype] = numel.get(weight.dtype, 0) + weight.numel()
        self.buffers = [torch.empty(n, dtype=dtype, device="cpu") for dtype, n in numel.items()]  # (n,) each
        flat = dict(zip(numel, self.buffers, strict=True))
        offsets = dict.fromkeys(numel, 0)
        self.backup = {}
        for name, weight in weights.items():
            start, offsets[weight.dtype] = offsets[weight.dtype], offsets[weight.dtype] + weight.numel()
            self.backup[name] = flat[weight.dtype][start : offsets[weight.dtype]].view(weight.shape)  # (d_out, d_in)
            self.backup[name].copy_(weight)
        on_cuda = torch.cuda.is_available() and any(w.is_cuda for w in weights.values())
        self.close = weakref.finalize(self, _unregister, _register(self.buffers) if on_cuda else [])
        self.close.atexit = False  # at exit the process's memory goes, registered or not

    @staticmethod
    def check(model: torch.nn.Module) -> dict[str, LoraLayer]:
        """The LoRA layers an in-place merge would change (`lora_linears`), once checked that it can.

        Raises:
            ValueError: as the class says (quantized or tied base weights, a layer `lora_linears` refuses).
        """
        layers = lora_linears(model)
        quantized = [name for name, layer in layers.items() if is_quantized_linear(layer.get_base_layer())]
        if quantized:
            raise ValueError(
                f"generation_lora_merge='inplace' cannot merge into quantized weights ({quantized[0]} is "
                "bitsandbytes-quantized; a requantized merge is lossy): use generation_lora_merge='copy'"
            )
        embeddings = model.get_input_embeddings().weight
        tied = [name for name, layer in layers.items() if layer.get_base_layer().weight is embeddings]
        if tied:
            raise ValueError(
                f"generation_lora_merge='inplace': {tied[0]} shares its weight with the embeddings (tied), which a "
                "merge would change for every use of them: use generation_lora_merge='copy'"
            )
        return layers

    def backup_bytes(self) -> int:
        """Host memory the copy of the base weights takes, in bytes: the flat buffers as allocated (and registered)."""
        return sum(buffer.untyped_storage().nbytes() for buffer in self.buffers)

    @contextmanager
    def merged(self):
        """Within the block the base weights hold W₀ + ΔW and PEFT's adapter layers are disabled (the forward is the
        base layer alone); on exit, also by an exception, every base weight is W₀ again, bit for bit."""
        try:
            with torch.no_grad():
                for layer in self.layers.values():
                    if lora_delta(layer) is not None:  # a layer no active adapter adapts keeps W0
                        weight = layer.get_base_layer().weight
                        weight.copy_(merged_weight(layer, weight.dtype))
            with self.model.disable_adapter():
                yield
        finally:
            self.restore()

    @torch.no_grad()
    def restore(self) -> None:
        """Copy every base weight back from the host copy."""
        for name, layer in self.layers.items():
            layer.get_base_layer().weight.copy_(self.backup[name], non_blocking=True)


def _register(buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """Page-lock host `buffers` for CUDA (`cudaHostRegister`, flag 1: cudaHostRegisterPortable, as torch's
    `torch.cuda._pin_memory_utils.pin_memory`), exactly their bytes; the ones registered (all, or none and a warning
    when CUDA refuses, e.g. a locked-memory limit)."""
    cudart = torch.cuda.cudart()
    registered = []
    for buffer in buffers:
        error = int(cudart.cudaHostRegister(buffer.data_ptr(), buffer.untyped_storage().nbytes(), 1))
        if error != 0:
            # torch's binding returns the error but leaves it as the runtime's last error, which the next kernel
            # launch's check (`cudaGetLastError`) would raise as its own: a launch here reads and clears it.
            with suppress(RuntimeError):
                torch.zeros(1, device="cuda")
            _unregister(registered)
            logger.warning(
                "generation_lora_merge='inplace': CUDA could not page-lock the %.2f GiB host copy of the base "
                "weights (cudaHostRegister error %d); it stays pageable, and each restore is a synchronous copy",
                sum(b.untyped_storage().nbytes() for b in buffers) / 2**30,
                error,
            )
            return []
        registered.append(buffer)
    return registered


def _unregister(buffers: list[torch.Tensor]) -> None:
    """Undo `_register` once no copy from `buffers` is queued; they are freed when the last reference goes."""
    if buffers:
        torch.cuda.synchronize()
    for buffer in buffers:
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())


class GenerationCopy:
    """A second model of the policy's architecture that generates from merged weights.

    Its adapted linear layers own a weight W₀ + ΔW in the compute dtype (`compute_dtype`: for QLoRA, bitsandbytes'
    compute dtype; else the dtype of the input embeddings), and so do the quantized linear layers without an adapter
    (dequantized once); everything else is the policy's own tensor, shared. `refresh()` rewrites the merged weights
    from the current adapters.

    Args:
        model: a PEFT model (`PeftModel`) with LoRA.

    Raises:
        ValueError: a layer `lora_linears` refuses.
    """

    def __init__(self, model: torch.nn.Module):
        base = model.get_base_model()
        self.layers = lora_linears(base)
        self.dtype = compute_dtype(base)
        config = copy.deepcopy(base.config)
        config.__dict__.pop("quantization_config", None)  # the copy is a plain model in the compute dtype
        with torch.device("meta"):  # no memory, no random initialization
            skeleton = type(base)(config).to(self.dtype)  # the policy's own class: a subclass's forward too
        owned = {}
        # Each parameter and buffer is set by `setattr`, not `load_state_dict(assign=True)`: that one would also set
        # requires_grad of the policy's shared parameters (embeddings) to the skeleton's True, and train them.
        tensors = [(key, True) for key, _ in skeleton.named_parameters(remove_duplicate=False)]
        tensors += [(key, False) for key, _ in skeleton.named_buffers(remove_duplicate=False)]
        for key, is_parameter in tensors:
            path, _, leaf = key.rpartition(".")
            source, target = base.get_submodule(path), skeleton.get_submodule(path)
            if path in self.layers and leaf == "weight":
                shape, device = tuple(getattr(target, leaf).shape), source.get_base_layer().weight.device
                owned[path] = value = torch.empty(shape, dtype=self.dtype, device=device)
            elif is_quantized_linear(source) and leaf == "weight":
                value = dequantize_module_weight(source).to(self.dtype)  # the copy's own, dequantized once
            else:  # the policy's own tensor (of the base layer when the module is adapted)
                value = getattr(source.get_base_layer() if path in self.layers else source, leaf)
            if is_parameter and not isinstance(value, torch.nn.Parameter):
                value = torch.nn.Parameter(value, requires_grad=False)
            setattr(target, leaf, value)
        left = [key for key, t in [*skeleton.named_parameters(), *skeleton.named_buffers()] if t.is_meta]
        if left:
            raise RuntimeError(f"generation copy: {left[0]} has no counterpart in the policy")
        skeleton.generation_config = copy.deepcopy(base.generation_config)
        self.model = skeleton.eval()
        self.owned = owned  # module name -> merged weight (d_out, d_in)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Rewrite every merged weight as W₀ + ΔW from the policy's current adapters."""
        for name, layer in self.layers.items():
            self.owned[name].copy_(merged_weight(layer, self.dtype))
