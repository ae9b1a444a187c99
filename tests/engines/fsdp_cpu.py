"""FSDP2 on CPU processes, for the tests only: accelerate 1.16 takes its FSDP branch (`AcceleratorState.__init__`)
only for GPU-like distributed types, so a launch with `recipes/accelerate/fsdp2.yaml` and `use_cpu=True` silently runs
plain DDP over gloo. `apply()` makes an `AcceleratorState` that was given an FSDP plugin on `MULTI_CPU` take it, as it
would on GPUs: the distributed type becomes FSDP and the plugin is kept, so `Accelerator.prepare` calls torch's
`fully_shard` (torch 2.13's FSDP2 runs on gloo; parameters become `DTensor` shards). GPU launches need none of this.
The tests assert the engine from the prepared model (`tests.two_process.engine_facts`), since every fallback is
silent."""

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType


def apply() -> None:
    """Patch `AcceleratorState.__init__` in this process (idempotent)."""
    init = AcceleratorState.__init__
    if getattr(init, "fsdp_on_cpu", False):
        return

    def patched(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    patched.fsdp_on_cpu = True
    AcceleratorState.__init__ = patched
