"""The few parts of the official `kubernetes` client healthd uses, imported narrowly.

`import kubernetes.aio.client` first runs `kubernetes/__init__.py`, which imports the
whole synchronous client, then `kubernetes/aio/__init__.py` and the async client's
`__init__`: every generated API class and about 800 pydantic model modules, twice.
healthd talks plain JSON through the async `ApiClient` (auth, TLS, pooling), its
`Configuration`, the REST layer and the kubeconfig / in-cluster loaders. Loading the
rest costs every agent about 20 MiB for nothing.

So, before anything else of `kubernetes` is imported, the packages on the way are
registered as deferred packages: their submodules import as usual, and a package's
own `__init__` runs the first time code asks it for a name it does not hold yet, so
code that wants the whole client (`from kubernetes.aio.client import CoreV1Api`, the
pvc check, tests) still gets it, at that moment. When something imported the client
in full before this module, nothing is deferred and the same names are used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

# Outermost first: a package's deferred module must exist before its children's.
_DEFERRED = ("kubernetes", "kubernetes.aio", "kubernetes.aio.client",
             "kubernetes.aio.client.models", "kubernetes.aio.utils")


class _DeferredPackage(types.ModuleType):
    """A package whose `__init__` has not run yet: it runs on the first look-up of a
    name the package does not hold (a submodule of that name is imported instead)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # import machinery probing
            raise AttributeError(name)
        try:
            return importlib.import_module(f"{self.__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{self.__name__}.{name}":
                raise
        if vars(self).get("_healthd_loaded"):  # complete already: the name is not there
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        vars(self)["_healthd_loaded"] = True
        assert self.__spec__ is not None and self.__spec__.loader is not None
        self.__spec__.loader.exec_module(self)
        return getattr(self, name)


def _defer(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package")
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


for _name in _DEFERRED:
    _defer(_name)

# Only submodules from here on; the order matters where one imports another by
# `from package import name` (rest before api_client).
from kubernetes.aio.client.configuration import Configuration  # noqa: E402
from kubernetes.aio.client.exceptions import ApiException  # noqa: E402
from kubernetes.aio.client.rest import RESTResponse  # noqa: E402

_client = sys.modules["kubernetes.aio.client"]
vars(_client)["Configuration"] = Configuration  # the config loaders import it from there

from kubernetes.aio.client.api_client import ApiClient  # noqa: E402

vars(_client)["ApiClient"] = ApiClient

from kubernetes.aio.config.config_exception import ConfigException  # noqa: E402
from kubernetes.aio.config.incluster_config import load_incluster_config  # noqa: E402
from kubernetes.aio.config.kube_config import load_kube_config  # noqa: E402

__all__ = ["ApiClient", "ApiException", "ConfigException", "Configuration", "RESTResponse",
           "load_incluster_config", "load_kube_config"]
