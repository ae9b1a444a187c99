"""Fitting a run on one consumer GPU, apart from the trainer core: nothing in the trainer or its features imports
this.

* `memory`: the peak-memory estimate of a config, term by term, without downloading the model.
* `presets`: the architectures the estimate knows without a download (`model_configs/`), the precision a card
  supports, and the warning a recipe gives when a config will not fit.
"""
