"""Task support for GSM8K (Cobbe et al., arXiv:2110.14168), apart from the trainer core: nothing in the trainer or
its features imports this.

* `data`: loading `openai/gsm8k` (or local JSONL files) into GRPO rows, synthetic problems for tests, difficulty bins.
* `rewards`: reward functions (answer accuracy with math-verify, strict accuracy, format).
* `bounded`: each answer's check within a time bound on any thread (math-verify's own timeout needs the main thread),
  off the main thread in a worker process (`bounded.worker_main`).
* `evaluation`: greedy and majority-vote accuracy of a model on GSM8K.
* `eval_generation`: the evaluation's generation: decoding set in full (nothing from the checkpoint's generation
  config), problems shared over processes, a progress line a batch.
"""
