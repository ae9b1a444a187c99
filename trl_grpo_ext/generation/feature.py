"""The trainer wiring of fast generation: `FastGenerationFeature`, which the trainer enters around each of TRL's
generations (the `generation` point of `composition.STEP`, TRL's `_generate_single_turn` through `trl_contact`).

TRL 1.16 generates each batch in `_generate_single_turn`: it unwraps the policy (`unwrap_model_for_generation`) and
calls `unwrapped_model.generate(**inputs, generation_config=self.generation_config)`.

What the settings need is built at the first generation (`FastGeneration.setup`), from the model as it is then: on
its device (DDP, DeepSpeed ZeRO-1/2 and a model moved after `__init__` have put it there by then; at `__init__` a
DeepSpeed model is still on the CPU) and in its dtype: the compile settings of that device (CUDA graphs on CUDA), the
in-place merge's pinned host copy, the generation copy next to the weights it shares, and the copy's memory check.
What can be refused from the settings and the model's structure is refused at `__init__`
(`FastGenerationFeature.build`).

The first generation then runs the whole fast path once on a probe: TRL's generation of the first batch (the same
prompts, so the same shapes the run then compiles for) cut to `PROBE_TOKENS` new tokens, every random state put back
after it. Where the fast path fails, at setup, in the probe or in any later generation (a missing compiler or
Triton, a card too old for Triton, out of memory, a torch.compile error), and `generation_fallback` is on (the
default): one warning with the cause and the setting to change (`fallback`), TRL's generation settings put back as
they were before setup, the merge and the static caches dropped (the base weights were restored bit for bit as the
merge's block ended), the random state put back as it was before the failed attempt, and the batch generated again
by TRL's generation, as is every later one; `fast_generation/fell_back/<cause>` is logged for the run doctor. After
each generation through the fast path, torch's counts of recompile-limit hits and CUDA-graph skips are read: either
is logged (`fast_generation/recompile_limit_hits`, `fast_generation/cudagraph_skips`) and warned about once.

Around each generation, in order:

0. transformers' repeated `make_inputs_require_grads` hooks on the input embeddings are cut to one
   (`drop_repeated_input_grad_hooks` says why: stock training adds two per step).
1. `generation_compile`: the cache length is fitted to the batch's padded prompt length (`StaticCacheSizer.fit`),
   and TRL's `generate` call is handed the run's static cache for its batch size (`StaticCaches`: built once, reset in
   place), so the compiled decode step (a CUDA graph on CUDA) sees the same key/value tensors in every generation;
   the trainer's `generation_config` was switched to compilation once, at setup.
2. `generation_lora_merge="inplace"`: the adapters are merged into the base weights, TRL generates with PEFT's
   adapter layers disabled, and the base weights are restored bit for bit (`InplaceMerge.merged`), also on error.
   `"copy"`: the copy's merged weights are refreshed once per optimizer step (`GenerationCopy.refresh`), and TRL's
   call generates from the copy.

Both the cache and the copy reach TRL's call through the unwrapped policy's `generate`, replaced for the duration of
the call (an instance attribute). After the call the trainer checks that TRL did generate through it, so a TRL release
that generates another way fails loudly instead of silently generating from the unmerged model or without the cache.

Logged (train mode): `fast_generation/merge_time`, the seconds of the merge and restore (inplace) or of the refresh
(copy) in that generation, synchronized on CUDA.

TRL's own lever, continuous batching (`use_transformers_continuous_batching`), is checked here too: TRL casts the
policy to bf16/fp16 before each of its generations, which fails on bitsandbytes 4-bit weights (refused at init) and
silently turns fp32 LoRA adapters into bf16 ones for the rest of training (a warning at init).
"""

import copy
import gc
import importlib.util
import logging
import time
from contextlib import contextmanager

import torch
from accelerate.utils import DistributedType

from ..error_reports import COMPILE_TROUBLE
from ..feature_api import Feature
from ..trl_contact import compiles_in_one_graph, drop_repeated_input_grad_hooks, generate_cache_argument, metrics
from .checks import model_setting_problem
from .config import generation_levers
from .device_memory import check_copy_fits, generation_copy_bytes
from .fallback import CompileTrouble, RNGState, fallback_cause, fallback_warning, write_fallback_log
from .lora_merge import GenerationCopy, InplaceMerge, is_quantized_linear, lora_linears
from .static_cache import StaticCaches, StaticCacheSizer

logger = logging.getLogger(__name__)
GIB = 2**30
PROBE_TOKENS = 4  # new tokens of the probe generation: the prefill, then the decode step compiled, warmed up, recorded


class FastGeneration:
    """What the fast-generation settings hold between generations: the merge (`InplaceMerge` or `GenerationCopy`, or
    None), the static-cache sizer and the run's static caches (or None without `generation_compile`).

    Built by `setup`, at the first generation."""

    def __init__(self, merge: InplaceMerge | GenerationCopy | None, sizer: StaticCacheSizer | None, device):
        self.merge = merge
        self.sizer = sizer
        self.caches = StaticCaches() if sizer is not None else None
        self.device = device  # where the model was at the first generation
        self.refreshed_step = None  # the optimizer step whose adapters the generation copy holds
        self.generate_error: Exception | None = None  # the last error raised inside a routed `generate` call

    @classmethod
    def setup(cls, trainer, policy: torch.nn.Module, longest_prompt: int) -> "FastGeneration":
        """Build what `trainer.args`' settings need for `policy` (the unwrapped model TRL generates with), where it
        is now, for a first batch of `longest_prompt` prompt tokens (padded).

        Raises:
            ValueError: the generation copy does not fit in the GPU's free memory next to what training will still
                allocate (`check_copy_fits`).
        """
        args = trainer.args
        device = next(policy.parameters()).device
        sizer = None
        if args.generation_compile:
            sizer = StaticCacheSizer(trainer.generation_config, device.type, args.generation_max_prompt_length)
        merge = None
        if args.generation_lora_merge == "inplace":
            merge = InplaceMerge(policy)
            logger.info("generation_lora_merge='inplace': %.2f GiB of base weights kept in host memory",
                        merge.backup_bytes() / GIB)  # fmt: skip
        elif args.generation_lora_merge == "copy":
            check_copy_fits(trainer, policy, device, 0 if sizer is None else sizer.fit(longest_prompt))
            merge = GenerationCopy(policy)
            logger.info("generation_lora_merge='copy': %.2f GiB generation copy", generation_copy_bytes(policy) / GIB)
        return cls(merge, sizer, device)

    @contextmanager
    def generating(self, policy: torch.nn.Module, step: int, cache_length: int | None):
        """The block is one TRL generation with `policy` (the unwrapped model TRL generates with) at optimizer step
        `step`, with a static cache of `cache_length` tokens a sequence (None without `generation_compile`). Yields a
        one-entry dict whose `merge_time` is set (seconds) once the block is done.

        Raises:
            RuntimeError: with a generation copy or a static cache, TRL did not call `policy.generate` inside the
                block.
        """
        timing = {"merge_time": 0.0}
        if isinstance(self.merge, InplaceMerge):
            start = _now()
            with self.merge.merged():
                timing["merge_time"] = _now() - start
                with self._routed(policy, policy, cache_length):
                    yield timing
                start = _now()
            timing["merge_time"] += _now() - start  # the restore
        elif isinstance(self.merge, GenerationCopy):
            if step != self.refreshed_step:
                start = _now()
                self.merge.refresh()
                self.refreshed_step = step
                timing["merge_time"] = _now() - start
            with self._routed(policy, self.merge.model, cache_length):
                yield timing
        else:
            with self._routed(policy, policy, cache_length):
                yield timing

    @contextmanager
    def _routed(self, policy: torch.nn.Module, generator: torch.nn.Module, cache_length: int | None):
        """Within the block, `policy.generate` is `generator.generate` (the policy's own, or the copy's) with the
        static cache for the call's batch size added (with `generation_compile`). An error raised inside that call
        is kept in `generate_error`."""
        from peft import PeftModel

        target = generator.generate  # bound before the instance attribute below shadows the class's method
        cache_model = generator.get_base_model() if isinstance(generator, PeftModel) else generator
        keyword = generate_cache_argument(cache_model) if self.caches is not None else None
        calls = []

        def generate(*args, **kwargs):
            calls.append(1)
            if keyword is not None:
                config = kwargs.get("generation_config") or cache_model.generation_config
                per_prompt = max(config.num_beams or 1, config.num_return_sequences or 1)  # None: transformers' 1
                sequences = kwargs["input_ids"].shape[0] * per_prompt
                kwargs[keyword] = self.caches.for_generation(cache_model, sequences, cache_length)
            try:
                return target(*args, **kwargs)
            except Exception as error:
                self.generate_error = error
                raise

        before = vars(policy).get("generate")  # a generate the user set on the instance, put back afterwards
        policy.generate = generate  # an instance attribute: it shadows PeftModel.generate until deleted
        try:
            yield
        finally:
            if before is None:
                del policy.generate
            else:
                policy.generate = before
        if not calls:
            raise TRLGenerationChanged(
                "fast generation: TRL's _generate_single_turn no longer generates through unwrapped_model.generate, "
                "so the merged weights, the generation copy and the static cache were not used. This TRL version is "
                "not supported with generation_lora_merge or generation_compile=True."
            )


class TRLGenerationChanged(RuntimeError):
    """TRL no longer generates through the unwrapped model's `generate`: the fast path cannot act. Never a reason to
    fall back: this TRL is not supported with fast generation."""


def _now() -> float:
    """Wall-clock seconds after the GPU's queued work is done."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def padded_prompt_length(prompt_ids: list[list[int]], pad_to_multiple_of: int | None) -> int:
    """The prompt length TRL pads a batch to: the longest prompt, rounded up to `pad_to_multiple_of` if set."""
    longest = max((len(ids) for ids in prompt_ids), default=1)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    return longest


class FastGenerationFeature(Feature):
    """Fast generation in the trainer: a feature when `generation_compile` or `generation_lora_merge` is set.

    Attributes:
        fast: the `FastGeneration`, None until the first generation builds it, and again once fallen back.
        fell_back: None while the fast path is in use; after it failed (with `generation_fallback`), the key of
            `error_reports.CAUSES` that says why, and every generation from then on is TRL's.
    """

    name = "fast_generation"
    exposes = "fast_generation"
    writes = ("trainer.generation_config", "policy.generate")

    def __init__(self, trainer, fell_back: str | None = None):
        super().__init__(trainer)
        self.fast: FastGeneration | None = None
        self.fell_back = fell_back
        self._trl_generation_config = None  # TRL's generation settings before `setup`, put back on a fall back
        self._reported: set[str] = set()  # the kinds of `error_reports.COMPILE_TROUBLE` warned about so far
        self._fallback_logged = fell_back is None  # a fall back decided at init is logged at the first generation
        self._release = False  # fell back, and the fast path's memory not yet freed

    def exposed(self) -> "FastGeneration | None":
        """`trainer.fast_generation`: the `FastGeneration` (merge and static-cache sizer), None before the first
        generation and once fallen back."""
        return self.fast

    @classmethod
    def build(cls, trainer) -> "FastGenerationFeature | None":
        """Check the generation settings against the loaded model; the feature, or None while they are all off.

        Raises:
            ValueError: a lever that cannot apply, naming the setting and why: what `checks.model_setting_problem`
                refuses (a merge without LoRA, `inplace` into quantized weights, compilation of a bitsandbytes model
                without `copy`); `inplace` on a weight tied to the embeddings; LoRA layers that do not merge exactly;
                compilation of a model that takes no cache; any lever under FSDP or DeepSpeed ZeRO-3 (sharded
                weights); continuous batching with bitsandbytes weights; with `generation_fallback=False`, compilation
                on CUDA without Triton (with it, a warning, and the run generates as TRL does).
        """
        args = trainer.args
        policy = trainer.accelerator.unwrap_model(trainer.model)
        quantized = any(is_quantized_linear(m) for m in policy.modules())
        if args.use_transformers_continuous_batching:
            _check_continuous_batching(args, policy, quantized)
        levers = generation_levers(args)
        if not levers:
            return None
        accelerator = trainer.accelerator
        sharded = accelerator.distributed_type == DistributedType.FSDP or (
            accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin
            and accelerator.state.deepspeed_plugin.zero_stage == 3
        )  # fmt: skip
        if sharded:
            engine = accelerator.distributed_type.value
            raise ValueError(
                f"{', '.join(levers)}: the weights are sharded over processes ({engine}), so no process holds a "
                "whole layer to merge or compile; use DDP or ZeRO-1/2"
            )
        from peft import PeftModel

        mode = args.generation_lora_merge
        problem = model_setting_problem(args, lora=isinstance(policy, PeftModel), quantized=quantized)
        if problem is not None:
            raise ValueError(problem)
        if mode == "inplace":
            InplaceMerge.check(policy)
        elif mode == "copy":
            lora_linears(policy.get_base_model())
        if args.generation_compile:
            _check_compile(trainer, policy)
            if trainer.accelerator.device.type == "cuda" and importlib.util.find_spec("triton") is None:
                error = ModuleNotFoundError("No module named 'triton': torch.compile needs Triton on CUDA")
                if not args.generation_fallback:
                    raise ValueError(
                        "generation_compile=True needs Triton for torch.compile on CUDA, which is not installed: "
                        "pip install triton (on Windows: pip install triton-windows)"
                    )
                logger.warning(fallback_warning(error, "no_triton", "at the start of training"))
                return cls(trainer, fell_back="no_triton")
        return cls(trainer)

    @contextmanager
    def generation(self, prompt_ids: list[list[int]], generate):
        trainer = self.trainer
        if self.fell_back is None and self.fast is None:
            self._start(prompt_ids, generate)  # falls back (or raises) when the fast path fails there
        if self.fell_back is not None:  # TRL's generation
            if not self._fallback_logged:
                self._fallback_logged = True
                metrics(trainer, "train")[f"fast_generation/fell_back/{self.fell_back}"].append(1.0)
            if self._release:  # the first of TRL's generations: the failed fast path's memory freed before it
                self._release = False
                gc.collect()  # what is left of the error's frames
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()  # the generation copy and the static caches back to the driver
            yield
            return
        fast, rng, before = self.fast, RNGState(), CompileTrouble.now()
        policy = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        longest = padded_prompt_length(prompt_ids, trainer.args.pad_to_multiple_of)
        cache_length = None if fast.sizer is None else fast.sizer.fit(longest)
        drop_repeated_input_grad_hooks(policy)
        inside = False  # whether the block (TRL's call) has started: its own errors are TRL's, not the fast path's
        try:
            with fast.generating(policy, trainer.state.global_step, cache_length) as timing:
                inside = True
                yield
        except TRLGenerationChanged:
            raise
        except Exception as error:
            if inside and error is not fast.generate_error:  # raised by TRL around the call, not by the fast path
                raise
            self._fall_back(error, f"in the generation at step {trainer.state.global_step + 1}")
            rng.restore()
            return  # the error stops here: the trainer generates this batch again, with TRL's generation
        self._report_compile_trouble(CompileTrouble.now().since(before))
        if fast.merge is not None and trainer.model.training:
            metrics(trainer, "train")["fast_generation/merge_time"].append(timing["merge_time"])

    def _start(self, prompt_ids: list[list[int]], generate) -> None:
        """Build the fast path where the model now is (`FastGeneration.setup`) and run it once on `generate`, TRL's
        generation of the first batch, cut to `PROBE_TOKENS` new tokens (the same prompts: the decode step compiles
        for the shapes the run then uses, and with `generation_compile` the static cache is allocated in full), every
        random state put back afterwards. On failure, `_fall_back`."""
        trainer = self.trainer
        rng = RNGState()
        self._trl_generation_config = copy.deepcopy(trainer.generation_config)
        policy = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        longest = padded_prompt_length(prompt_ids, trainer.args.pad_to_multiple_of)
        where = "while setting up, at the first generation"
        try:
            self.fast = FastGeneration.setup(trainer, policy, longest)
            where = "in the probe generation at the start of training"
            cache_length = None if self.fast.sizer is None else self.fast.sizer.fit(longest)
            drop_repeated_input_grad_hooks(policy)
            config = trainer.generation_config
            kept = config.max_new_tokens, config.min_new_tokens
            config.max_new_tokens = config.min_new_tokens = min(PROBE_TOKENS, config.max_new_tokens)
            try:
                with self.fast.generating(policy, trainer.state.global_step, cache_length):
                    generate()
            finally:
                config.max_new_tokens, config.min_new_tokens = kept
        except TRLGenerationChanged:
            raise
        except Exception as error:
            self._fall_back(error, where)
        finally:
            rng.restore()

    def _fall_back(self, error: Exception, where: str) -> None:
        """Give up the fast path after `error` (raised `where`): TRL's generation settings put back as they were
        before `setup`, the merge (its host copy unregistered) and the static caches dropped (the base weights were
        restored as the merge's block ended), one warning with the cause and the fix (`fallback.fallback_warning`),
        the error's traceback in `<output_dir>/fast_generation_fallback.log` (`fallback.write_fallback_log`), the
        cause logged (`fast_generation/fell_back/<cause>`, read by the run doctor). The memory of the fast path is
        freed at the next generation, TRL's, before it runs. Re-raises `error` with `generation_fallback=False`."""
        trainer = self.trainer
        if not trainer.args.generation_fallback:
            raise error
        cause = fallback_cause(error)
        if self._trl_generation_config is not None:
            trainer.generation_config = self._trl_generation_config
        if self.fast is not None:
            self.fast.generate_error = None  # the error's frames hold the fast path: no cycle keeps it alive
            if isinstance(self.fast.merge, InplaceMerge):
                self.fast.merge.close()  # its host copy unregistered now, not when the error's traceback lets it go
        self.fast, self.fell_back, self._fallback_logged, self._release = None, cause, True, True
        log = write_fallback_log(trainer.args.output_dir, trainer.accelerator.process_index, error, where)
        logger.warning(fallback_warning(error, cause, where, log))
        metrics(trainer, "train")[f"fast_generation/fell_back/{cause}"].append(1.0)

    def _report_compile_trouble(self, new: CompileTrouble) -> None:
        """Log what a generation added to torch's counts of `error_reports.COMPILE_TROUBLE` (`fast_generation/<kind>`,
        read by the run doctor), and warn the first time each kind is seen."""
        for kind, (what, fix) in COMPILE_TROUBLE.items():
            count = getattr(new, kind)
            if count <= 0:
                continue
            metrics(self.trainer, "train")[f"fast_generation/{kind}"].append(float(count))
            if kind not in self._reported:
                self._reported.add(kind)
                logger.warning("Fast generation: %s (step %d). To change: %s.", what,
                               self.trainer.state.global_step + 1, fix)  # fmt: skip


def _check_compile(trainer, policy: torch.nn.Module) -> None:
    """The init-time checks and warnings of `generation_compile` for `policy`.

    Raises:
        ValueError: a model whose `forward` takes no cache.
    """
    from peft import PeftModel

    dropout = [m.lora_dropout for m in policy.modules() if hasattr(m, "lora_dropout")]
    if any(not isinstance(d, torch.nn.Identity) for mods in dropout for d in mods.values()):
        logger.warning(
            "generation_compile=True with lora_dropout > 0: TRL generates in train mode, so PEFT applies LoRA "
            "dropout while decoding, and the compiled decode step draws its dropout masks from another "
            "random stream than eager code: the completions differ from stock TRL's."
        )
    base = policy.get_base_model() if isinstance(policy, PeftModel) else policy
    generate_cache_argument(base)  # refuses a model that takes no cache, before it costs a run
    generator = type(base)
    if not compiles_in_one_graph(generator):
        logger.warning(
            "generation_compile=True: transformers does not mark %s as compiling in one graph "
            "(_can_compile_fullgraph is False), so its decode step may break into several graphs and gain "
            "less from compilation.",
            generator.__name__,
        )


def _check_continuous_batching(args, policy: torch.nn.Module, quantized: bool) -> None:
    """TRL's continuous batching casts the policy to the bf16/fp16 of `args` before every generation.

    Raises:
        ValueError: bitsandbytes-quantized weights, which that cast breaks.
    """
    if quantized:
        raise ValueError(
            "use_transformers_continuous_batching=True: TRL casts the model to bf16/fp16 before each generation, "
            "which bitsandbytes-quantized (QLoRA) weights do not survive; turn it off (for QLoRA, "
            "generation_lora_merge='copy' with generation_compile=True is the fast path)"
        )
    if args.bf16 or args.fp16:
        fp32 = [name for name, p in policy.named_parameters() if p.requires_grad and p.dtype == torch.float32]
        if fp32:
            logger.warning(
                "use_transformers_continuous_batching=True: TRL casts the model to %s before each generation, which "
                "turns %d fp32 trainable parameters (e.g. %s; PEFT keeps LoRA adapters in fp32) into %s ones for the "
                "rest of training.",
                "bf16" if args.bf16 else "fp16",
                len(fp32),
                fp32[0],
                "bf16" if args.bf16 else "fp16",
            )
