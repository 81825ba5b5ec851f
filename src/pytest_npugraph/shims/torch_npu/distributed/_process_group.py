"""The emulated ``hccl`` process group: ``torch.distributed`` collectives on emulated NPUs.

The backend creator returns a ``torch.distributed.ProcessGroup`` subclass whose collectives
(the methods ``torch.distributed.all_reduce`` & co. call) hand each call to the job of
``runtime/collectives/``: recorded on the rank's current stream, matched across ranks by
(communicator, sequence number), computed on the CPU payloads.  It is a ProcessGroup rather
than a c10d Backend because a Backend cannot be implemented in Python, and because c10d's
own ops would reach the NPU tensors' Python dispatch with CPU payloads (torch's threaded
test process group takes the same route).  ``pg._get_backend(torch.device("npu"))`` returns
``ProcessGroupHCCL``, which answers ``get_hccl_comm_name(rank)`` for the MC2 ops.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from pytest_npugraph._context import CONTEXT
from pytest_npugraph.runtime import collectives as C
from pytest_npugraph.runtime import hccl_modes
from pytest_npugraph.runtime.collectives import processes
from pytest_npugraph.runtime.errors import ErrCode, dist_error
from pytest_npugraph.runtime.ops.layout import storage_format
from pytest_npugraph.runtime.runtime import current

# collective -> the name its kernel records ("hccl::<kind>") and the profile hook receives
KINDS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "all_to_all", "all_gather_into_tensor_uneven": "all_gather",   # AllGatherV
         "reduce_scatter_tensor_uneven": "reduce_scatter", "all_to_all_vc": "all_to_all"}     # ReduceScatterV, AlltoAllVC


class ProcessGroupHCCL:
    """The HCCL backend of one process group on one rank (``torch_npu``'s ProcessGroupHCCL)."""

    supports_splitting = False
    supports_coalescing = False
    supports_tensor_alloc = False

    class Options:
        """``ProcessGroupHCCL.Options``: what ``init_process_group(pg_options=...)`` passes."""

        def __init__(self, is_high_priority_stream: bool = False):
            self.is_high_priority_stream = is_high_priority_stream
            self.hccl_config: dict = {}
            self._timeout = timedelta(minutes=30)
            self.global_ranks_in_group: list = []
            self.group_id = ""

    def __init__(self, pg: "HcclProcessGroup", options: "ProcessGroupHCCL.Options"):
        self._pg = pg
        self.options = options

    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def name(self) -> str:
        return "hccl"

    def get_hccl_comm_name(self, rankid: int, init_comm: bool = True) -> str:
        """The communicator's name: what MC2 ops take as ``group_ep`` / ``group_tp``."""
        if not 0 <= rankid < self._pg._job.size:
            raise RuntimeError(f"get_hccl_comm_name: invalid rank {rankid}")
        return self._pg._comm.name

    def _get_sequence_number_for_group(self) -> int:
        return self._pg._job.seqs.get((self._pg._comm.name, self._pg._thread), 0)

    def _set_sequence_number_for_group(self) -> None:
        pass

    # -- torch_npu's own collectives (``torch_npu.distributed.*``), not in torch's ProcessGroup API
    def reduce_scatter_tensor_uneven(self, output, input, input_split_sizes=(), opts=None):
        """ReduceScatterV: rank r's ``output`` = the reduction over ranks of rows
        [sum(sizes[:r]), +sizes[r]) of their inputs (equal rows when ``input_split_sizes`` is empty)."""
        _check_same_dtype(output, input)
        _check_tensors((output, input))
        sizes = _filled_split_sizes(input_split_sizes, input, self.size())
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        return self._pg._run("reduce_scatter_tensor_uneven", [input], [output], reduce=op, input_split_sizes=sizes)

    def all_gather_into_tensor_uneven(self, output, input, output_split_sizes=(), opts=None):
        """AllGatherV: rows [sum(sizes[:r]), +sizes[r]) of every rank's ``output`` = rank r's input."""
        _check_same_dtype(output, input)
        _check_tensors((output, input))
        sizes = _filled_split_sizes(output_split_sizes, output, self.size())
        return self._pg._run("all_gather_into_tensor_uneven", [input], [output], output_split_sizes=sizes)

    def alltoallvc(self, output, input, send_count_matrix, opts=None):
        """AlltoAllVC: ``send_count_matrix`` (flat, row-major, the same on every rank) [i][j] elements go
        from rank i to rank j, laid out per target rank in the input and per source rank in the output."""
        _check_tensors((output, input))
        return self._pg._run("all_to_all_vc", [input], [output], send_count_matrix=[int(v) for v in send_count_matrix])

    def __repr__(self) -> str:
        return f"ProcessGroupHCCL(comm={self._pg._comm.name!r}, rank={self.rank()}, size={self.size()})"


def _done(result) -> object:
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _reduce_op(op) -> str:
    """``ReduceOp.SUM`` / ``RedOpType.SUM`` -> "sum"."""
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1].lower()


def _flatten(lists) -> list:
    return [t for ts in lists for t in ts]


_BASE_FORMATS = (0, 1, 2, 30)     # NCHW, NHWC, ND, NCDHW: FormatHelper::IsBaseFormatType


def _check_split_sizes(sizes, tensor, group_size: int) -> None:
    """ProcessGroupHCCL's check_split_sizes: on the calling rank, before the launch (a rank whose
    sizes are wrong raises; its peers, which issued theirs, wait for it)."""
    if not sizes:
        if tensor.size(0) % group_size:
            raise RuntimeError("Tensor's dim 0 does not divide equally across group size" + dist_error(ErrCode.PARAM))
    elif len(sizes) != group_size:
        raise RuntimeError("Number of tensor splits not equal to group size" + dist_error(ErrCode.TYPE))
    elif sum(sizes) != tensor.size(0):
        raise RuntimeError("Split sizes doesn't match total dim 0 size" + dist_error(ErrCode.TYPE))


def _filled_split_sizes(sizes, tensor, group_size: int) -> list:
    """ProcessGroupHCCL's fill_equal_split_sizes_when_empty, then check_split_sizes."""
    if not sizes:
        if tensor.size(0) % group_size:
            raise RuntimeError("Tensor's dim 0 does not divide equally across group size" + dist_error(ErrCode.PARAM))
        return [tensor.size(0) // group_size] * group_size
    _check_split_sizes(sizes, tensor, group_size)
    return [int(s) for s in sizes]


def _check_same_dtype(output, input) -> None:
    if output.dtype != input.dtype:
        raise RuntimeError("output tensor must have the same type as input tensor" + dist_error(ErrCode.PARAM))


def _check_tensors(tensors) -> None:
    """ProcessGroupHCCL's checks of every tensor a collective or send/recv takes (check_npu_single_tensor
    and its list forms): HCCL addresses an internal-format tensor by its whole storage, so a view into
    one at an offset is refused before anything is launched."""
    for t in tensors:
        payload = getattr(t, "_payload", None)
        if payload is None or not t.storage_offset():
            continue
        if storage_format(payload) not in _BASE_FORMATS:
            raise RuntimeError("For a tensor of internal format, it's storage_offset must be 0"
                               + dist_error(ErrCode.NOT_SUPPORT))


class HcclProcessGroup(dist.ProcessGroup):
    """A process group of the emulated HCCL backend on one rank thread."""

    def __init__(self, job, thread: int, comm, rank: int, size: int, options):
        super().__init__(rank, size)
        self._job, self._thread, self._comm = job, thread, comm
        self._owner = C.binding()        # (job, rank) of the creating rank thread; None: the test's thread
        self._backend = ProcessGroupHCCL(self, options)
        self._name = comm.torch_name
        self._desc = "undefined"

    # -- identity
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    @property
    def _device_types(self) -> list:
        return [torch.device("npu")]

    def _get_backend(self, device):
        device = torch.device(device) if not isinstance(device, torch.device) else device
        if device.type != "npu":
            raise RuntimeError(f"Could not retrieve or create the backend for device type {device.type}: "
                               f"this process group has the hccl backend, for npu")
        return self._backend

    def getBackendName(self) -> str:
        return "hccl"

    def _get_backend_name(self) -> str:
        return "hccl"

    def name(self) -> str:
        return "hccl"

    def shutdown(self) -> None:
        pass

    # -- coalescing (torch.distributed's _coalescing_manager): the collectives inside the block are
    # collected by torch and issued at its end as one coalesced call (allreduce_coalesced, ...)
    def _start_coalescing(self, device) -> None:
        pass

    def _end_coalescing(self, device):
        return _done([])

    def abort(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"ProcessGroupHCCL(group={self._name!r}, rank={self.rank()}, size={self.size()})"

    # -- collectives
    def _run(self, op: str, inputs=(), outputs=(), **params):
        if C.binding() != self._owner:
            raise RuntimeError(f"{op}: process group {self._name!r} belongs to rank {self._thread}'s thread; a "
                               f"rank uses the groups it created")
        _check_tensors(tuple(inputs) + tuple(outputs))
        call = C.Call(op, f"hccl::{KINDS.get(op, op)}", tuple(inputs), tuple(outputs), params)
        self._job.issue(self._comm, self._thread, call)
        return _done(list(outputs))

    def allreduce(self, tensors, opts=None):
        return self._run("all_reduce", tensors, tensors, reduce=_reduce_op(opts.reduceOp))

    allreduce_coalesced = allreduce

    def reduce(self, tensors, opts):
        return self._run("reduce", tensors, tensors, reduce=_reduce_op(opts.reduceOp), root=opts.rootRank)

    def broadcast(self, tensors, opts):
        return self._run("broadcast", tensors, tensors, root=opts.rootRank)

    def allgather(self, output_lists, inputs, opts=None):
        return self._run("all_gather", inputs, _flatten(output_lists), output_lists=output_lists)

    allgather_coalesced = allgather

    def all_gather_single(self, output, input, opts=None):
        return self._run("all_gather_into_tensor", [input], [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i) for o, i in zip(outputs, inputs)]
        return works[-1] if works else _done([])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts):
        return self._run("reduce_scatter", _flatten(input_lists), outputs, reduce=_reduce_op(opts.reduceOp),
                         input_lists=input_lists)

    def reduce_scatter_single(self, output, input, opts):
        return self._run("reduce_scatter_tensor", [input], [output], reduce=_reduce_op(opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else _done([])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _check_tensors((output, input))
        if not output_split_sizes and not input_split_sizes:
            if output.numel() != input.numel() or output.dtype != input.dtype:
                raise RuntimeError("Tensors are not equal in size or data type" + dist_error(ErrCode.PARAM))
            if input.dim() < 1 or output.dim() < 1:
                raise RuntimeError(
                    f"Scalar tensors (0-dim tensors) are not supported in alltoall. inputTensor.dim()={input.dim()}, "
                    f"outputTensor.dim()={output.dim()}. Please reshape tensors to at least 1-D before calling "
                    f"alltoall." + dist_error(ErrCode.NOT_SUPPORT))
            _check_split_sizes((), output, self.size())
        else:
            _check_split_sizes(input_split_sizes, input, self.size())
            _check_split_sizes(output_split_sizes, output, self.size())
        return self._run("all_to_all_single", [input], [output], output_split_sizes=list(output_split_sizes),
                         input_split_sizes=list(input_split_sizes))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        return self._run("all_to_all", inputs, outputs)

    def gather(self, output_lists, inputs, opts):
        return self._run("gather", inputs, _flatten(output_lists), root=opts.rootRank)

    def scatter(self, outputs, input_lists, opts):
        return self._run("scatter", _flatten(input_lists), outputs, root=opts.rootRank)

    def barrier(self, opts=None):
        return self._run("barrier")

    # -- point-to-point (collectives.Job.point_to_point: HCCL's pairing, per direction, in issue order)
    def _p2p(self, kind: str, tensors, peer: int):
        if C.binding() != self._owner:
            raise RuntimeError(f"{kind}: process group {self._name!r} belongs to rank {self._thread}'s thread; a "
                               f"rank uses the groups it created")
        if len(tensors) != 1:
            raise RuntimeError(f"{kind}: the hccl backend takes one tensor per call, got {len(tensors)}")
        _check_tensors(tensors)
        self._job.point_to_point(self._comm, self._thread, kind, tensors[0], peer)
        return _done(list(tensors))

    def send(self, tensors, dstRank, tag=0):
        return self._p2p("send", tensors, dstRank)

    def recv(self, tensors, srcRank, tag=0):
        return self._p2p("recv", tensors, srcRank)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("ProcessGroupHCCL does not support recv from any source (recv_anysource): HCCL pairs "
                           "each receive with a send of a named rank; pass src")


# ------------------------------------------------------------------------------ creator
def create(dist_backend_opts, backend_options):
    """``Backend.register_backend("hccl", create, extended_api=True, devices=["npu"])``."""
    size, rank = dist_backend_opts.group_size, dist_backend_opts.group_rank
    ranks = list(dist_backend_opts.global_ranks_in_group)
    bound = C.binding()
    world = not ranks and (bound is None or isinstance(bound[0], processes.ProcessJob))
    timeout = dist_backend_opts.timeout
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(C.DEFAULT_TIMEOUT)
    if world and size > 1 and CONTEXT.child:      # this process is one rank of a world of processes
        job = processes.world_job(current(), size, rank, dist_backend_opts.store,
                                      min(seconds, C.DEFAULT_TIMEOUT))
        thread = rank
    elif bound is None or world:
        job, thread = _main_thread_job(size), 0
    else:
        job, thread = bound
        if not ranks:
            _check_world(job, thread, rank, size)
    members = tuple(ranks) if ranks else tuple(range(size))
    options = backend_options if isinstance(backend_options, ProcessGroupHCCL.Options) else ProcessGroupHCCL.Options()
    mode = hccl_modes.communicator_mode(job.runtime.devices[0].profile.name, options.hccl_config)
    comm = job.communicator(thread, str(dist_backend_opts.group_id), members, seconds, mode)
    options._timeout = timeout
    options.global_ranks_in_group = ranks
    options.group_id = dist_backend_opts.group_id
    return HcclProcessGroup(job, thread, comm, rank, size, options)


def _check_world(job, thread: int, rank: int, size: int) -> None:
    if size > job.size:
        raise RuntimeError(f"init_process_group(world_size={size}): the test emulates {job.size} NPU(s); mark it "
                           f"@pytest.mark.npu_devices({size})")
    if rank != thread:
        raise RuntimeError(f"rank {thread} of npugraph.run_ranks called init_process_group with rank={rank}: "
                           f"each rank must pass the rank run_ranks gives its function (rank r drives npu:r)")


def _main_thread_job(size: int):
    """Outside run_ranks only a one-rank world exists (the test's own thread)."""
    if size != 1:
        raise RuntimeError(f"init_process_group(backend='hccl', world_size={size}) outside npugraph.run_ranks: "
                           f"run the per-rank function with npugraph.run_ranks(fn), which starts one rank per "
                           f"emulated NPU")
    rt = current()
    job = rt.extensions.get("collectives.main")
    if job is None:
        job = rt.extensions["collectives.main"] = C.Job(rt, 1, "@main", bound_devices=False)
    return job
