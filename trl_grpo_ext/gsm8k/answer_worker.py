"""The worker process of `bounded`: ``python -m trl_grpo_ext.gsm8k.answer_worker``.

Reads JSON lines ``[name, args]`` from stdin and answers each with the JSON line ``[rewards.<name>(*args)]`` on
stdout, after a first line saying it is ready. Anything else the libraries print goes to stderr, so that stdout
holds only replies. The parent kills it when a call runs out of time.
"""

import json
import os
import sys


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # a library's print must not corrupt the replies
    import logging

    from . import rewards

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # no timeout here: the parent's is the bound
    replies.write("ready\n")
    for line in sys.stdin:
        name, args = json.loads(line)
        replies.write(json.dumps([rewards.BOUNDED[name](*args)]) + "\n")


if __name__ == "__main__":
    main()
