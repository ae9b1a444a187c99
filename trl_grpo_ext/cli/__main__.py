"""`python -m trl_grpo_ext.cli ...` (and `accelerate launch -m trl_grpo_ext.cli grpo ...`): the `trl-grpo-ext`
command."""

from .commands import main

raise SystemExit(main())
