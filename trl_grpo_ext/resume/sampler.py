"""`EpochSeededSampler`: the prompt order of epoch e depends on e alone, so that a run resumed after its first epoch
draws the prompts the uninterrupted run draws (TRL's `RepeatSampler` draws a new permutation from one stateful
generator each epoch, so a fresh sampler after a resume in epoch e > 0 replays epoch 0's order)."""

import torch
from torch.utils.data import Sampler

from ..trl_contact import repeat_sampler_fields


class EpochSeededSampler(Sampler):
    """Wrap TRL's `RepeatSampler` so that epoch `e`'s prompt order depends on `e` alone, not on how many epochs this
    sampler object has iterated.

    `RepeatSampler` seeds one `torch.Generator` with `seed` at construction and draws a permutation per `__iter__`,
    so in an uninterrupted run epoch `e` gets the `(e+1)`-th draw, and a fresh sampler after a resume replays epoch
    0's order. Here each `__iter__` reseeds the generator and discards `epoch` draws first, then counts the epoch: an
    uninterrupted run gets TRL's orders bit for bit, and a resumed one gets them too once `epoch` is set to the epoch
    it resumes in (`set_epoch`, which transformers calls where the data loader forwards it, or by the trainer).
    """

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator, seed, num_samples, shuffle = repeat_sampler_fields(self.sampler)
        if shuffle and seed is not None:
            generator.manual_seed(seed)
            for _ in range(self.epoch):
                torch.randperm(num_samples, generator=generator)
        self.epoch += 1
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)
