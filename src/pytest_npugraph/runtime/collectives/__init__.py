"""Collectives between the emulated devices of one test: rank threads, rendezvous, matching, and the
c10d collectives' math (an MC2 op's math lives with its spec, ``OpSpec.mc2_math`` in ops/mc2.py).

``npugraph.run_ranks(fn, *args)`` runs ``fn(rank, *args)`` in one thread per emulated device
(rank r drives ``npu:r``), as ``torchrun`` runs one process per card.  The emulated
``ProcessGroupHCCL`` (``shims/torch_npu/distributed``) and the MC2 ops hand every collective
call to a ``Job`` (one per ``run_ranks`` call), which:

1. records it: a ``Kernel`` on the calling rank's current stream, in the rank's program order,
   named ``hccl::<collective>`` (``hccl::all_reduce``, ``hccl::reduce_scatter``, ...) or after
   the MC2 op (``npu::npu_moe_distribute_dispatch``), with the bytes it reads and writes, its
   ``OpCores`` and ``collective=(communicator, seq)``: ``seq`` numbers the communicator's
   collectives on each rank, so the analyses pair the members of one collective across
   devices.  Cores come from the ``pytest_npugraph_op_profile`` hook (asked with the short
   name, e.g. ``"reduce_scatter"`` or ``"npu_moe_distribute_dispatch"``, on every call, so a
   per-test answer is honoured), else the op specs (MC2 ops: vector cores), else its
   communicator's HCCL expansion mode (``hccl_modes.py``): only an AIV-mode collective takes
   vector cores (every one, held while it waits for its peers).
2. asynchrony: as HCCL's launch, issuing returns at once; the collective is a task queued on
   the rank's stream (executor.py) that completes when every member issued the same op as
   that ``(communicator, seq)`` and each member's task heads its stream: then its math runs
   on the CPU payloads of every member (arguments that disagree raise ``CollectiveError``).
   Issue order across communicators and streams is free.
3. never waits on a hang: a host waits only in synchronize, host reads and blocking copies.
   When every rank is blocked there or has returned and nothing can run (a member that never
   issues a collective, one communicator's collectives in different orders on two ranks, a
   rank that raised), the ranks end with ``DeviceHang`` (on hardware: a hang until the HCCL
   timeout), which ``npugraph.expect("deadlock")`` absorbs with the ``deadlock`` hazard the
   trace shows; so does work still queued when every rank returned.  Only a rank stuck
   outside the device (in user code) is left to a timeout (``NPUGRAPH_COLLECTIVE_TIMEOUT``,
   default 30 s without any recorded activity).

Trace conventions (read by analysis/taskgraph.py, cores.py, deadlock.py): the runtime's
``DeviceCores`` per device; one
``GroupCreated`` when a communicator is created; each
rank's kernels in its program order on their streams; collectives keyed as above.  The
communicator name is also what ``get_hccl_comm_name`` returns, hence the MC2 ``group_ep``.

Modules: ``ranks`` (communicators, calls, ``Job``: matching, asynchrony, hangs), its two transports
``threads`` (``npugraph.run_ranks``: a thread per rank) and ``processes`` (a process per rank, matched
through the c10d store; ``launch``: ``npugraph.run_ranks(fn, processes=True)``), ``c10d_math`` (what each
collective computes), ``registration`` (the torch library kernels of the MC2 ops) and ``mc2`` (the MC2
ops' cross-rank glue: their communicator, their issue).
"""
from .errors import CollectiveAborted, CollectiveError
from .ranks import DEFAULT_TIMEOUT, Call, Communicator, Job, Pending, binding, claim_world, op_cores
from .c10d_math import MATH
from .threads import run_ranks
from .registration import install
from .mc2 import mc2_issue

__all__ = ["CollectiveAborted", "CollectiveError", "DEFAULT_TIMEOUT", "Call", "Communicator", "Job", "Pending",
           "MATH", "binding", "claim_world", "install", "mc2_issue", "op_cores", "run_ranks"]
