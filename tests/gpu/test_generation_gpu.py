"""Fast generation on CUDA (skipped without it): the pinned host copy of the in-place merge, the bf16 generation copy,
training with a compiled decode step (CUDA graphs) that compiles once, and what the presets run (in-place and copy
merges with compilation, LoRA and 4-bit, bf16 and fp16) recording its CUDA graphs once over 50 generations.

`generation_probe` and `cudagraph_recordings` are also the re-record probe of `benchmarks/generation/gpu_checks.py`."""

import random
import time

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.generation.lora_merge import GenerationCopy, InplaceMerge, lora_linears

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GIB = 2**30


def cudagraph_recordings(device_index: int = 0) -> int:
    """CUDA graphs inductor's CUDA-graph trees have recorded on the device so far: the nodes of every tree (torch
    internals, read by the GPU checks only; 0 before any recording and off CUDA)."""
    if not torch.cuda.is_available():
        return 0
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(device_index, create_if_none_exists=False)
    if manager is None or manager.roots is None:
        return 0
    count, stack = 0, [node for nodes in manager.roots.values() for node in nodes]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(child for children in node.children.values() for child in children)
    return count


def probe_trainer(model_dir, output_dir, *, merge="inplace", quantized=False, dtype="bf16", device="cuda", **more):
    """A trainer on the tiny model with a preset's fast generation: LoRA on every linear layer, `generation_compile`
    and `generation_lora_merge=merge`, in `dtype` ("bf16", or "fp16": fp16 weights and the fp16 loss scaler, the T4
    preset's mix), 4-bit NF4 weights when `quantized`."""
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, PrinterCallback

    from tests.conftest import length_reward, small_grpo_kwargs
    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    weights = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    kwargs = small_grpo_kwargs(output_dir, use_cpu=device == "cpu", bf16=dtype == "bf16", fp16=dtype == "fp16",
                               model_init_kwargs={"dtype": weights}, **more)  # fmt: skip
    if merge is not None:
        kwargs.update(generation_compile=True, generation_lora_merge=merge, generation_max_prompt_length=64)
    quantization = None
    if quantized:
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=weights)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**kwargs),
        train_dataset=Dataset.from_list(
            [{"prompt": [{"role": "user", "content": f"What is {i}?" + " more" * (i % 7)}]} for i in range(32)]
        ),
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
        quantization_config=quantization,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def generation_probe(trainer, calls: int = 150, every: int = 10, seed: int = 0) -> tuple[list[dict], int]:
    """`calls` generations through the trainer's own generation path (TRL's `_generate_single_turn`, with fast
    generation around it), 8 prompts of 3-40 random tokens each (so several padded lengths). Returns a row every
    `every` calls (and after the first: call, seconds of that call, CUDA graphs recorded so far, GiB allocated and
    reserved on the device) and inductor's count of CUDA-graph skips over the calls."""
    from torch._dynamo.utils import counters

    rng = random.Random(seed)
    counters["inductor"].clear()
    rows = []
    for call in range(1, calls + 1):
        prompt_ids = [[rng.randint(5, 400) for _ in range(rng.randint(3, 40))] for _ in range(8)]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer._generate_single_turn(prompt_ids, None, {}, 4)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if call == 1 or call % every == 0:
            cuda = torch.cuda.is_available()
            rows.append({
                "call": call, "seconds": seconds, "recordings": cudagraph_recordings(),
                "allocated_gib": torch.cuda.memory_allocated() / GIB if cuda else 0.0,
                "reserved_gib": torch.cuda.memory_reserved() / GIB if cuda else 0.0,
            })  # fmt: skip
    return rows, int(counters["inductor"]["cudagraph_skips"])


def cuda_peft_model(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))


def test_inplace_merge_on_cuda_keeps_a_pinned_copy_and_restores_bf16_weights_exactly(tiny_model_dir):
    model = cuda_peft_model(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    merge = InplaceMerge(model)
    assert all(t.is_pinned() for t in merge.backup.values())
    for _ in range(20):
        with torch.no_grad():
            for p in (p for n, p in model.named_parameters() if "lora_" in n):
                p.add_(0.01 * torch.randn_like(p))
        with merge.merged():
            pass
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" not in n)


def test_inplace_merge_on_cuda_page_locks_exactly_the_bytes_of_the_adapted_base_weights(tiny_model_dir):
    model = cuda_peft_model(tiny_model_dir)
    weights = [layer.get_base_layer().weight for layer in lora_linears(model).values()]
    exact = sum(w.numel() * w.element_size() for w in weights)  # 147456 bytes for the tiny model in bf16
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    torch.cuda.synchronize()
    cached = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    merge = InplaceMerge(model)
    (buffer,) = merge.buffers
    assert merge.backup_bytes() == exact == buffer.untyped_storage().nbytes()
    assert buffer.is_pinned() and all(t.is_pinned() for t in merge.backup.values())
    # registered, not taken from torch's caching host allocator, which would round the block up to a power of two
    # (262144 bytes here): its pinned bytes did not grow
    assert torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) == cached
    with merge.merged():
        pass
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" not in n)
    merge.close()  # unregistered: pageable again, and the restore still exact
    assert not buffer.is_pinned()
    with merge.merged():
        pass
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" not in n)


def test_generation_copy_on_cuda_gives_the_policy_logits_within_bf16_rounding(tiny_model_dir):
    model = cuda_peft_model(tiny_model_dir)
    copy = GenerationCopy(model)
    ids = torch.randint(5, 400, (4, 12), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(copy.model(ids).logits, model(ids).logits, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_compiled_copy_training_on_cuda_compiles_the_decode_step_once(tiny_model_dir, tmp_path, quantized):
    from torch._dynamo.utils import counters

    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?" + " more" * (i % 5)}]} for i in range(16)]
    )
    kwargs = small_grpo_kwargs(tmp_path, use_cpu=False, bf16=True, max_steps=4, generation_compile=True,
                               generation_lora_merge="copy", model_init_kwargs={"dtype": torch.bfloat16})  # fmt: skip
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16) if quantized else None
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**kwargs),
        train_dataset=dataset,
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
        quantization_config=quantization,
    )
    assert trainer.generation_config.compile_config.mode == "reduce-overhead"  # CUDA graphs
    counters.clear()
    trainer.train()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    assert len(lengths) == 4 and all(0 < n <= 16 for n in lengths)


PRESET_PATHS = [  # (generation_lora_merge, 4-bit weights, precision)
    ("inplace", False, "bf16"), ("copy", False, "bf16"), ("copy", True, "bf16"), ("inplace", False, "fp16"),
]  # fmt: skip


@pytest.mark.parametrize(("merge", "quantized", "dtype"), PRESET_PATHS,
                         ids=["inplace-bf16", "copy-bf16", "copy-4bit-bf16", "inplace-fp16"])  # fmt: skip
def test_the_presets_generation_records_its_cuda_graphs_once(tiny_model_dir, tmp_path, merge, quantized, dtype):
    """What the presets run: 3 training steps match stock generation within bf16/fp16 tolerance (rewards and
    losses), the base weights are bit for bit what they were, and over 50 more generations of varying prompt
    lengths the CUDA graphs recorded do not grow, none is skipped, and one static cache serves them all."""
    stock = probe_trainer(tiny_model_dir, tmp_path / "stock", merge=None, quantized=quantized, dtype=dtype)
    stock.train()
    fast = probe_trainer(tiny_model_dir, tmp_path / "fast", merge=merge, quantized=quantized, dtype=dtype)
    base = {n: p.detach().clone() for n, p in fast.model.named_parameters() if "lora_" not in n}
    fast.train()
    for key in ("reward", "loss"):
        ours = [row[key] for row in fast.state.log_history if key in row]
        theirs = [row[key] for row in stock.state.log_history if key in row]
        assert len(ours) == len(theirs) == 3
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=0.05, atol=0.05)
    assert all(torch.equal(base[n], p) for n, p in fast.model.named_parameters() if n in base)
    rows, skips = generation_probe(fast, calls=50)
    after_warmup = [row["recordings"] for row in rows if row["call"] >= 10]
    assert rows[-1]["recordings"] >= 1 and len(set(after_warmup)) == 1, rows  # recorded, then only replayed
    assert skips == 0 and fast.fast_generation.caches.built == 1, (skips, fast.fast_generation.caches.caches.keys())
    assert all(torch.equal(base[n], p) for n, p in fast.model.named_parameters() if n in base)
