"""`--kubeconfig` and `--context`, as every command that talks to the API spells them
(without importing the client: building a command line stays cheap)."""

from __future__ import annotations

import argparse


def add_kube_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="default: $KUBECONFIG, else in-cluster, else ~/.kube/config")
    parser.add_argument("--context", metavar="NAME",
                        help="the kubeconfig context to use (default: its current-context)")
