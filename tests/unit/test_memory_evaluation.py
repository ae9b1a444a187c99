"""The memory estimate's end-of-run evaluation term (issue #58): HF generation of `eval_batch_size` prompts beside the
resident terms, by hand on the small config of tests/training/test_memory.py."""

import pytest

from tests.training.test_memory import SMALL, small_estimate
from trl_grpo_ext.consumer_gpu import memory
from trl_grpo_ext.consumer_gpu.memory import GIB


def test_evaluation_term_by_hand(tmp_path):
    """QLoRA r=4 on q/v, prompt 8 + completion 8 tokens; training generates 8 sequences (the generation phase 161152
    bytes, the training phase 154624: tests/training/test_memory.py's hand-computed estimate)."""
    stock = small_estimate(tmp_path, load_in_4bit=True)
    assert stock.evaluation == 0  # no eval_batch_size: left out, nothing else changes
    # 16 prompts, one greedy sequence each. KV cache 256 bytes a token (2 · 2 layers · 2 kv heads · 16 · 2). Decoding
    # end: 16 · 16 tokens · 256 = 65536 + one layer's concatenation copy 32768, logits 16 · 1000 · (2 + 12) = 224000:
    # 322304. Prefill: 16 · 8 · 256 = 32768 + 16 · 8 · 2 · max(7 · 64, 2 · 64 + 3 · 128 = 512) = 131072: 163840.
    est = small_estimate(tmp_path, load_in_4bit=True, eval_batch_size=16)
    assert est.evaluation * GIB == pytest.approx(322304)
    assert sum(memory.generation_bytes(SMALL, 16, 8, 8)) == 322304
    # It is the peak: resident + 322304, above the generation phase's 161152.
    assert est.total == pytest.approx(stock.persistent + 322304 / GIB)
    assert est.total - stock.total == pytest.approx((322304 - 161152) / GIB)
    assert "(resident + evaluation phase)" in est.as_table() and "evaluation" in dict(est.largest(8))
    # At 4 prompts (decode: 4 · 16 · 256 · 1.5 + 4 · 1000 · 14 = 80576) it is below both phases: the peak stays.
    small = small_estimate(tmp_path, load_in_4bit=True, eval_batch_size=4)
    assert small.evaluation * GIB == pytest.approx(80576) and small.total == stock.total


def test_with_compiled_generation_the_evaluation_has_a_cache_of_its_own(tmp_path):
    """Compiled generation keeps its static cache resident and has no KV cache in its generation phase (workspace
    112000 bytes); the evaluation generates with a dynamic cache of its own beside the static one: at training's 8
    sequences 32768 + 16384 + 112000 = 161152 (just below this LoRA run's training phase, 7168 + 116992 + 38144 =
    162304), at 16 prompts 322304, the peak."""
    compiled = small_estimate(tmp_path, {"generation_compile": True}, eval_batch_size=8)
    assert compiled.evaluation * GIB == pytest.approx(161152) and compiled.generation * GIB == pytest.approx(112000)
    assert compiled.training * GIB == pytest.approx(162304)
    assert compiled.total == pytest.approx(compiled.persistent + 162304 / GIB)
    larger = small_estimate(tmp_path, {"generation_compile": True}, eval_batch_size=16)
    assert larger.persistent == compiled.persistent  # the static cache stays as it was: training's 8 sequences
    assert larger.total == pytest.approx(compiled.persistent + 322304 / GIB)
