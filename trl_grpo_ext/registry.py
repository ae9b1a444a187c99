"""`Registry`: a name -> class map for the modes a config field picks by name (`entropy_reg`, `grad_reg`), as verl's
`register_policy_loss` (`verl/trainer/ppo/core_algos.py`) maps a loss name to its function.

The config's validation, its `--help` text and its docs read the registry, so adding a mode is one registered class
plus its config fields. A name is registered once (PEFT's `register_peft_method` refuses duplicates the same way).
"""

import textwrap
from collections.abc import Callable


class Registry(dict):
    """Mode name -> mode class, in registration order.

    Args:
        field: the config field whose values are names in this registry (for error messages).
    """

    def __init__(self, field: str):
        super().__init__()
        self.field = field

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator: register the class under `name` and set its `name` attribute.

        Raises:
            ValueError: `name` is already registered, or is not a lowercase identifier (it is written in YAML files
                and on the command line, comma-separated).
        """

        def add(cls: type) -> type:
            if not name.isidentifier() or name != name.lower():
                raise ValueError(f"{self.field} mode names are lowercase identifiers, got {name!r}")
            if name in self:
                raise ValueError(f"{self.field} mode {name!r} is already registered ({self[name].__qualname__})")
            cls.name = name
            self[name] = cls
            return cls

        return add

    def unregister(self, name: str) -> None:
        """Remove `name` (for a test that registered a mode of its own). Raises KeyError if it is not registered."""
        del self[name]

    def describe(self, indent: str = "", width: int = 119) -> str:
        """A list item per mode, `- name: summary`, wrapped at `width` columns after `indent`, for docstrings."""
        items = [f"- `{name}`: {cls.summary}." for name, cls in self.items()]
        return "\n".join(
            textwrap.fill(item, width, initial_indent=indent, subsequent_indent=indent + "  ") for item in items
        )

    def help(self) -> str:
        """The modes on one line, `name (summary); ...`, for `--help`."""
        return "; ".join(f"{name} ({cls.summary})" for name, cls in self.items())
