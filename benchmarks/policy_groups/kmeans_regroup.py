"""Time of a k-means regroup over 10,000 prompts (issue #4 sets < 5 s on this machine's 2 cores).

    python benchmarks/policy_groups/kmeans_regroup.py [--prompts 10000] [--groups 4] [--repeats 3]

Prompts are GSM8K's training questions (`train.jsonl` of `--dataset_path`, a GSM8K-format folder, by default the
project's shared one beside the repository; repeated up to `--prompts`), as chat prompts. The script times what the
trainer does: TF-IDF features (`policy_groups.assignment.tfidf_features`) plus k-means (`kmeans_groups`). It prints
the median of `--repeats` runs and the group sizes.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from datasets import Dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from trl_grpo_ext.gsm8k.data import load_gsm8k  # noqa: E402
from trl_grpo_ext.policy_groups.assignment import kmeans_groups, prompt_texts, tfidf_features  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dataset_path", default=str(REPO_ROOT.parent / "shared" / "data" / "gsm8k"))
    args = parser.parse_args()
    rows = load_gsm8k("train", args.dataset_path).to_list()
    dataset = Dataset.from_list([rows[i % len(rows)] for i in range(args.prompts)])
    timings = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        features = tfidf_features(prompt_texts(dataset))
        names, assignment = kmeans_groups(features, args.groups, seed=0)
        timings.append(time.perf_counter() - start)
    sizes = dict(zip(names, np.bincount(assignment).tolist(), strict=True))
    median = statistics.median(timings)
    print(f"{args.prompts} prompts, {args.groups} groups: TF-IDF + k-means median {median:.2f} s over "
          f"{args.repeats} runs ({'within' if median < 5 else 'OVER'} the 5 s limit); sizes {sizes}")  # fmt: skip


if __name__ == "__main__":
    main()
