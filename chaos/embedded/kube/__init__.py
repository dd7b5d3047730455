"""An emulated Kubernetes control plane: the API server the Kubernetes backend is tested against.

``serve()`` / ``ApiServer`` (server.py) speak the real REST, watch and WebSocket-exec
protocol over an in-memory store (store.py); pods' containers are run by a pluggable
``PodLifecycle`` (lifecycle.py).  What is and is not emulated: docs/kubernetes-emulator.md.
"""

from chaos.embedded.kube.eviction import DisruptionBudget
from chaos.embedded.kube.kubeconfig import write_kubeconfig
from chaos.embedded.kube.lifecycle import ExecProcess, NullRuntime, PodLifecycle
from chaos.embedded.kube.rbac import Rbac, Rule
from chaos.embedded.kube.server import ApiServer, serve

__all__ = ["ApiServer", "DisruptionBudget", "ExecProcess", "NullRuntime", "PodLifecycle", "Rbac", "Rule",
           "serve", "write_kubeconfig"]
