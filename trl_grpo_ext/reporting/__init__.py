"""What a run shows a person: a table of the metrics while it trains and plots of them when it ends. The library core
imports nothing from here (the run doctor reads the metrics log `callbacks` writes, by its name `HISTORY_NAME`).

* `callbacks`: `MetricsTableCallback`, a per-step table on stdout and, at the end, the metrics log and the plots.
* `progress`: `StepProgress`, lines that say what a slow step is doing (generating, scoring, the update) while it runs.
* `plots`: the reward, completion-length and entropy curves with a panel per feature that acted, and the policy
  groups' weights and rewards, with the training stages shaded.
"""
