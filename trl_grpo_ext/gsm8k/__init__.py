"""Task support for GSM8K (Cobbe et al., arXiv:2110.14168), apart from the trainer core: nothing in the trainer or
its features imports this.

* `data`: loading `openai/gsm8k` (or local JSONL files) into GRPO rows, synthetic problems for tests, difficulty bins.
* `rewards`: reward functions (answer accuracy with math-verify, strict accuracy, format).
* `evaluation`: greedy and majority-vote accuracy of a model on GSM8K.
"""
