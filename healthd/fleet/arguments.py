"""The command-line arguments of `healthd trigger` and `healthd status`.

Kept apart from the commands themselves, which are long enough.
"""

from __future__ import annotations

import argparse

from healthd.config import add_config_argument
from healthd.kube.arguments import add_kube_arguments
from healthd.util.output import add_output_argument


def _common(parser: argparse.ArgumentParser) -> None:
    add_output_argument(parser)
    add_config_argument(parser, help="healthd config YAML (key prefixes, agent pods, slack "
                                     "queues)")
    add_kube_arguments(parser)


def add_trigger_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Ask the agents of many nodes for on-demand checks (the healthd.io/run annotation), "
        "wait for their answers and summarise. Exit code: Nagios convention over all nodes "
        "(0 PASS, 1 WARN, 2 ERR/EVICT, 3 UNKNOWN, including nodes whose agent never "
        "answered); 64 for a bad request.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--selector", "-l", metavar="LABELSEL", help="nodes by label selector")
    where.add_argument("--nodes", metavar="N1,N2", help="nodes by name")
    where.add_argument("--job", metavar="[NAMESPACE/]APPWRAPPER",
                       help="the nodes an AppWrapper's pods run on")
    parser.add_argument("-n", "--namespace", metavar="NS",
                        help="the namespace of --job APPWRAPPER (default: \"default\")")
    parser.add_argument("--checks", required=True,
                        help="all | pciebw,remapped | dcgm:3 (as healthd.io/run takes it)")
    parser.add_argument("--batch", type=int, metavar="N",
                        help="at most N nodes asked and not yet answered (default: all)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for every answer (implied by --batch)")
    parser.add_argument("--timeout", metavar="D",
                        help="per node, from the request to the answer (default 5m; 2h for "
                             "exclusive checks)")
    parser.add_argument("--force-queue", action="store_true",
                        help="ask for exclusive checks even on nodes whose GPUs look busy "
                             "(the agent refuses them if pods still hold GPUs)")
    _common(parser)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", "-l", metavar="LABELSEL", help="only nodes matching")
    parser.add_argument("--verdict", metavar="V[,V]",
                        help="only nodes with these verdicts (PASS WARN ERR TESTING EVICT "
                             "UNKNOWN NONE)")
    parser.add_argument("--watch", "-w", action="store_true",
                        help="redraw on every change (piped: print a frame only on a change)")
    parser.add_argument("-n", "--namespace", metavar="NS",
                        help="where healthd runs: its agent pods and the controller's Lease "
                             "(default: the config's, healthd-system)")
    _common(parser)
