"""The ``nccl`` weight sync: the trainer broadcasts its weights to every rollout engine over a
process group of their own (docs/concepts/index.md, "Synchronizer").

- **The group**: the trainer is rank 0, rollout engine ``i`` rank ``i + 1``. It meets over a
  ``TCPStore`` the trainer serves on its node's address, on a port the system picks. It is
  not torch's default group: a trainer with FSDP ranks already has one in its process, and a
  process has one at most. So the group is a ``ProcessGroupNCCL`` (GPUs) or
  ``ProcessGroupGloo`` (CPU) built directly over the store, under a prefix of its own: the
  same code on both. It is made at the first sync and kept for the next ones.
- **A sync**: the trainer publishes a ``TransferOffer`` through the synchronizer and waits
  for every engine to arrive (a key per rank in the store); the explorer asks each engine to
  load the version, and each joins. The weights go in buckets: flat byte buffers of at most
  ``BUCKET_BYTES`` (a larger tensor gets a bucket of its own), one buffer reused on each
  side, each tensor cast to the engines' dtype as it is packed. The layout (names, shapes,
  dtypes, offsets) goes into the store once per layout; a version names the layout it uses.
  Tied weights travel once.
- **Checksums**: the trainer's ``tensor_stats`` of each tensor as sent, stored after the
  last bucket; an engine compares its parameters with them after loading (``unheld``).
- **Every wait** (the engines' arrival, the trainer's store, the layout, the group, each
  bucket) is bounded by ``synchronizer.sync_timeout`` and fails naming the side that did not
  arrive.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import socket
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

from trinity.common.weights import Stats, SyncTimeoutError, TransferOffer, tensor_stats

# Bytes a bucket holds at most (a tensor larger than this travels in a bucket of its own).
BUCKET_BYTES = 128 * 2**20
# Where a tensor starts in its bucket: a multiple of this, so a view of any dtype is aligned.
ALIGN = 64
# How often the trainer looks for the engines that have arrived (seconds).
POLL_S = 0.02
# Versions whose keys stay in the store: an engine reads the checksums after the last bucket,
# possibly after the trainer moved on to the next version.
KEPT_VERSIONS = 2

Layout = Dict[str, Any]  # {"buckets": [{"bytes": n, "tensors": [[name, shape, dtype, offset]]}],
#                           "aliases": {name: the name it shares its values with}}


def plan_layout(
    tensors: Dict[str, torch.Tensor], dtype: Optional[torch.dtype], bucket_bytes: int
) -> Layout:
    """Buckets of ``tensors`` in their order, floating ones cast to ``dtype`` (None: each
    keeps its own), and the names that alias a tensor already placed (tied weights)."""
    buckets: List[Dict[str, Any]] = []
    aliases: Dict[str, str] = {}
    placed: Dict[tuple, str] = {}
    current: List[list] = []
    size = 0
    for name, tensor in tensors.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in placed:
            aliases[name] = placed[key]
            continue
        placed[key] = name
        wire = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        nbytes = tensor.numel() * wire.itemsize
        if current and size + nbytes > bucket_bytes:
            buckets.append({"bytes": size, "tensors": current})
            current, size = [], 0
        current.append([name, list(tensor.shape), str(wire).removeprefix("torch."), size])
        size += -(-nbytes // ALIGN) * ALIGN
    if current:
        buckets.append({"bytes": size, "tensors": current})
    return {"buckets": buckets, "aliases": aliases}


def _view(flat: torch.Tensor, entry: list) -> torch.Tensor:
    """The tensor ``entry`` (of a layout's bucket) over the bucket's bytes ``flat``."""
    _, shape, dtype_name, offset = entry
    dtype = getattr(torch, dtype_name)
    count = math.prod(shape)
    return flat[offset : offset + count * dtype.itemsize].view(dtype).view(shape)


def _device(backend: str) -> torch.device:
    """Where the buckets live: the current GPU for NCCL, the CPU for gloo."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )


def _buffers(held: List[torch.Tensor], layout: Layout, device: torch.device) -> List[torch.Tensor]:
    """Two byte buffers as large as the layout's largest bucket (``held`` when they are):
    one bucket travels in one while the other is packed or unpacked."""
    need = max((bucket["bytes"] for bucket in layout["buckets"]), default=0)
    if held and held[0].numel() >= need:
        return held
    return [torch.empty(need, dtype=torch.uint8, device=device) for _ in range(2)]


def make_group(store: Any, rank: int, world: int, backend: str, host: str, timeout: float) -> Any:
    """The sync's process group over ``store`` (``host``: the address gloo binds here)."""
    prefixed = dist.PrefixStore("group/", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(prefixed, rank, world, options)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timedelta(seconds=timeout)
    return dist.ProcessGroupGloo(prefixed, rank, world, options)


def broadcast(group: Any, flat: torch.Tensor, timeout: float) -> Any:
    """Start sending rank 0's ``flat`` into every rank's ``flat``; ``.wait()`` on the
    returned work waits for it (and raises if it failed)."""
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    options.timeout = timedelta(seconds=timeout)
    return group.broadcast([flat], options)


def engine_names(ranks: List[int]) -> str:
    """How ranks of the group read in an error: ``rollout engine 0, 2``."""
    return f"rollout engine{'s' if len(ranks) > 1 else ''} " + ", ".join(
        str(rank - 1) for rank in ranks
    )


def _listen(host: str) -> socket.socket:
    """A socket listening on ``host`` at a port the system picks (the store's server)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen()
    return listener


class WeightSender:
    """Rank 0, in the trainer: serves the group's store on ``host`` and sends each version.

    ``engines``: the rollout engines that receive (ranks 1..engines); ``dtype``: theirs
    (floating tensors are cast to it on the way); ``timeout``: every wait's bound.
    """

    def __init__(
        self,
        host: str,
        engines: int,
        backend: str,
        timeout: float,
        dtype: Optional[torch.dtype] = None,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        listener = _listen(host)
        port = listener.getsockname()[1]
        # The store serves on the socket bound above: this node's address only, not every
        # interface (TCPStore's own server would listen on all of them).
        self.store = dist.TCPStore(
            host,
            port,
            None,
            True,
            timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )
        self.offer = TransferOffer(host, port, backend, engines + 1, timeout)
        self.dtype, self.bucket_bytes = dtype, bucket_bytes
        self.group: Any = None
        self._flats: List[torch.Tensor] = []
        self._layouts: set = set()
        self._versions: List[int] = []

    def send(self, version: int, tensors: Dict[str, torch.Tensor]) -> None:
        """Send ``tensors`` as model ``version`` once every engine has arrived; raises
        ``SyncTimeoutError`` naming the engines that did not arrive in time."""
        layout = plan_layout(tensors, self.dtype, self.bucket_bytes)
        text = json.dumps(layout, sort_keys=True)
        layout_id = hashlib.sha256(text.encode()).hexdigest()[:16]
        if layout_id not in self._layouts:  # names, shapes and dtypes: once per layout
            self.store.set(f"layout/{layout_id}", text)
            self._layouts.add(layout_id)
        self.store.set(f"v{version}/layout", layout_id)
        self._await_engines(version)
        timeout = self.offer.timeout
        if self.group is None:
            self.group = make_group(
                self.store, 0, self.offer.world, self.offer.backend, self.offer.host, timeout
            )
        self._flats = _buffers(self._flats, layout, _device(self.offer.backend))
        sums = self._broadcast_buckets(version, layout, tensors)
        self.store.set(f"v{version}/sums", json.dumps(sums))
        self._forget_old(version)

    def _broadcast_buckets(
        self, version: int, layout: Layout, tensors: Dict[str, torch.Tensor]
    ) -> Dict[str, Stats]:
        """Each bucket packed while the one before is on its way, and checksummed while it
        is on its own; the checksums of every tensor as sent."""
        sums: Dict[str, Stats] = {}
        in_flight = None
        for index, bucket in enumerate(layout["buckets"]):
            flat = self._flats[index % 2][: bucket["bytes"]]  # its last bucket is delivered
            views = {entry[0]: _view(flat, entry) for entry in bucket["tensors"]}
            for name, view in views.items():
                view.copy_(tensors[name])
            in_flight = self._next(version, in_flight, flat)
            sums.update({name: tensor_stats(view) for name, view in views.items()})
        self._next(version, in_flight, None)
        return sums

    def _next(self, version: int, in_flight: Any, flat: Optional[torch.Tensor]) -> Any:
        """Wait for the bucket on its way (if any), then start sending ``flat`` (if any)."""
        try:
            if in_flight is not None:
                in_flight.wait()
            return None if flat is None else broadcast(self.group, flat, self.offer.timeout)
        except RuntimeError as exc:  # a peer timed out or went away
            raise SyncTimeoutError(
                f"the rollout engines stopped taking model version {version} during its "
                f"transfer ({exc}); see their logs"
            ) from exc

    def _await_engines(self, version: int) -> None:
        world, timeout = self.offer.world, self.offer.timeout
        keys = [f"v{version}/arrived/{rank}" for rank in range(1, world)]
        deadline = time.monotonic() + timeout
        while not self.store.check(keys):
            if time.monotonic() >= deadline:
                missing = [r for r, key in enumerate(keys, 1) if not self.store.check([key])]
                raise SyncTimeoutError(
                    f"{engine_names(missing)} did not join the transfer of model version "
                    f"{version} within synchronizer.sync_timeout={timeout:g}s (the explorer "
                    "asks the engines to load each version it needs: it is slow or stuck; "
                    "see its log)"
                )
            time.sleep(POLL_S)

    def _forget_old(self, version: int) -> None:
        """Drop the keys of versions older than the last ``KEPT_VERSIONS``."""
        self._versions.append(version)
        while len(self._versions) > KEPT_VERSIONS:
            old = self._versions.pop(0)
            for key in (f"v{old}/layout", f"v{old}/sums"):
                self.store.delete_key(key)
            for rank in range(1, self.offer.world):
                self.store.delete_key(f"v{old}/arrived/{rank}")


def _local_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


class WeightReceiver:
    """Rank ``offer.rank``, in a rollout engine: joins the trainer's store and group."""

    def __init__(self, offer: TransferOffer) -> None:
        self.offer = offer
        self.group: Any = None
        self._flats: List[torch.Tensor] = []
        self._layouts: Dict[str, Layout] = {}
        with self._from_trainer("answer (its weight store)", None):
            self.store = dist.TCPStore(
                offer.host, offer.port, None, False, timedelta(seconds=offer.timeout)
            )

    @contextlib.contextmanager
    def _from_trainer(self, what: str, version: Optional[int]) -> Iterator[None]:
        """A wait for the trainer: a timeout (or the trainer going away) says so."""
        try:
            yield
        except RuntimeError as exc:  # torch's store errors and gloo's timeouts
            of = "" if version is None else f" model version {version}"
            raise SyncTimeoutError(
                f"the trainer (rank 0 of the weight sync at {self.offer.host}:"
                f"{self.offer.port}) did not {what}{of} within synchronizer.sync_timeout="
                f"{self.offer.timeout:g}s ({exc}); see the trainer's log"
            ) from exc

    def receive(
        self, version: int, load: Callable[[Dict[str, torch.Tensor]], None]
    ) -> Dict[str, Stats]:
        """Take model ``version`` from the trainer: ``load`` gets each bucket's tensors by
        name (views of a buffer the next bucket overwrites: it copies them); returns the
        trainer's checksums of every name it sent."""
        offer = self.offer
        with self._from_trainer("describe", version):
            self.store.set(f"v{version}/arrived/{offer.rank}", "1")
            layout = self._layout(version)
        with self._from_trainer("open the group of", version):
            if self.group is None:
                here = _local_address(offer.host, offer.port)
                self.group = make_group(
                    self.store, offer.rank, offer.world, offer.backend, here, offer.timeout
                )
        self._flats = _buffers(self._flats, layout, _device(offer.backend))
        self._receive_buckets(version, layout, load)
        with self._from_trainer("send the checksums of", version):
            sums = json.loads(self.store.get(f"v{version}/sums"))
        sums.update({alias: sums[target] for alias, target in layout["aliases"].items()})
        return {name: (int(total), int(count)) for name, (total, count) in sums.items()}

    def _receive_buckets(
        self, version: int, layout: Layout, load: Callable[[Dict[str, torch.Tensor]], None]
    ) -> None:
        """Each bucket loaded while the next one is on its way."""
        buckets, aliases, timeout = layout["buckets"], layout["aliases"], self.offer.timeout
        flats = [self._flats[i % 2][: bucket["bytes"]] for i, bucket in enumerate(buckets)]
        with self._from_trainer("send", version):
            in_flight = broadcast(self.group, flats[0], timeout) if buckets else None
        for index, bucket in enumerate(buckets):
            with self._from_trainer("send", version):
                in_flight.wait()
                if index + 1 < len(buckets):  # into the other buffer, whose bucket is loaded
                    in_flight = broadcast(self.group, flats[index + 1], timeout)
            tensors = {entry[0]: _view(flats[index], entry) for entry in bucket["tensors"]}
            tensors.update({a: tensors[t] for a, t in aliases.items() if t in tensors})
            load(tensors)

    def _layout(self, version: int) -> Layout:
        layout_id = self.store.get(f"v{version}/layout").decode()
        if layout_id not in self._layouts:
            self._layouts[layout_id] = json.loads(self.store.get(f"layout/{layout_id}"))
        return self._layouts[layout_id]


def unheld(sums: Dict[str, Stats], held: Dict[str, torch.Tensor]) -> List[str]:
    """The names whose values ``held`` (an engine's state dict) are not the trainer's, per
    its checksums ``sums``."""
    return [
        name for name, want in sums.items() if name not in held or tensor_stats(held[name]) != want
    ]
