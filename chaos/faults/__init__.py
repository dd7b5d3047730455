"""Injectable faults, one module per family."""

from chaos.faults.base import Fault, FaultContext, Target
from chaos.faults.cuda import CudaFault
from chaos.faults.partition import Partition
from chaos.faults.raylet import RayletKill
from chaos.faults.reboot import NodeReboot
from chaos.faults.worker import TrainWorkerKill

FAULTS = {f.kind: f for f in (RayletKill, TrainWorkerKill, NodeReboot, Partition, CudaFault)}


def make(kind: str, **kwargs) -> Fault:
    """Build a fault by its kind name; an unknown kind names the known ones."""
    try:
        cls = FAULTS[kind]
    except KeyError:
        raise ValueError(f"unknown fault {kind!r}; known faults: {', '.join(sorted(FAULTS))}") from None
    return cls(**kwargs)


__all__ = ["FAULTS", "Fault", "FaultContext", "Target", "make"]
