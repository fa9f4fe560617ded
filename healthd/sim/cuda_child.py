"""The simulated machine's bandwidth probe child: the stand-in for checks.cuda_child.

The parent (healthd.sim.cuda.SimBandwidthProbe) works out what the spec says a GPU
measures and hands it over as an answer line; this child holds a host buffer of the
copy's size for as long as it runs (the real child holds its pinned buffer), then
prints that answer with its own pid, in the real child's format. Started the same way
as the real child (checks.cuda_child.command), it imports no more than it does.

    ... healthd.sim.cuda_child SIZE_BYTES ANSWER_LINE
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from checks.cuda_child import decode, encode


def main(args: Sequence[str]) -> int:
    try:
        size, answer = int(args[0]), decode(args[1])
    except (IndexError, ValueError) as exc:
        print(f"usage: SIZE_BYTES ANSWER_LINE ({exc})", file=sys.stderr)
        return 64
    buffer = bytearray(b"\x01") * size  # every page touched: resident, like pinned memory
    print(encode(replace(answer, pid=os.getpid())), flush=True)
    del buffer
    return 0
