"""The eviction callable: a read-only pass over a window of resident weights."""

from __future__ import annotations

import logging
import sys
import weakref  # only for the plugin's own EvictionHandle, never on a host tensor
from collections.abc import Callable
from functools import partial
from itertools import chain
from typing import Any, Literal

import torch

from ._credit import OUTPUT_ROWS, WORD
from ._errors import WeightsError
from ._log import say
from ._read_kernel import triton_reads
from ._text import described, shown
from ._weights import WeightChoice, WeightPiece

log = logging.getLogger("flare_l2evict.eviction")

Kernel = Literal["auto", "triton", "torch"]

# The C-level size and address: a storage subclass cannot make them say other than what is there.
_nbytes: Callable[[Any], int] = torch.UntypedStorage.nbytes
_address: Callable[[Any], int] = torch.UntypedStorage.data_ptr
_tensor_address: Callable[[Any], int] = torch.Tensor.data_ptr
# How many holders a storage's memory has (tensors, storages), counted in C++.
_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def _lone_refs(make: Callable[[], object]) -> int:
    """The Python count of a new object held by one list slot, as ``_unheld_slot`` reads it."""
    held = [make()]
    return sys.getrefcount(held[0])


# The bound method keeps its tensor alive: a storage whose memory a tensor holds counts one more.
_LONE_REFS = _lone_refs(torch.empty(1).untyped_storage)
_LONE_TENSOR_REFS = _lone_refs(lambda: torch.empty(1))


def triton_started() -> bool:
    """Whether this process already paid Triton's start (about 0.7 s, even with the kernel on
    disk): importing Triton is not enough, ``triton_key`` (hashing its sources) must have run."""
    for home in ("triton.runtime.cache", "triton.compiler.compiler"):  # 3.6, older
        info = getattr(getattr(sys.modules.get(home), "triton_key", None), "cache_info", None)
        if callable(info):
            try:
                return bool(info().currsize > 0)
            except Exception:
                return False
    return False


def _plain(tensor: torch.Tensor) -> bool:
    """Whether reading the tensor's address runs no host code (else only its storage is checked)."""
    found = getattr(type(tensor), "__torch_function__", None)
    default = torch.Tensor.__torch_function__.__func__  # type: ignore[attr-defined]
    return found is torch._C._disabled_torch_function_impl or (
        getattr(found, "__func__", None) is default
    )


class WeightEviction:
    """Displace L2 by reading the chosen pieces of resident storages; write nothing to them.

    Invariants a caller relies on:

    * a call allocates nothing and never synchronises, so it can sit before every
      timed sample and be captured in a CUDA graph; it writes only its own small
      float32 output, so calls from several race jobs may interleave;
    * what it keeps is made outside inference mode (races outside it work);
    * it reads ``window_bytes`` (whole float32 words) of distinct bytes, from the end of
      each region, with :mod:`._read_kernel`'s Triton read (asked for, or ``"auto"`` where
      Triton already runs; compiled and run once here) or else torch's reduction:
      :attr:`kernel` says which, :attr:`kernel_note` why;
    * it holds the storages it reads (each owns its memory) until :meth:`release`, and
      host tensors strongly, never by weak reference (``torch.utils.swap_tensors``
      refuses a tensor that has one);
    * before every read it checks, in a few C calls per piece, that each storage keeps its
      address and bytes, each host tensor still starts where it did, and something besides
      this object holds each storage (:meth:`unheld`); otherwise (or after :meth:`release`)
      this and every later call run ``fallback``, stock's own eviction, with one WARNING
      line (:attr:`fell_back_reason` says why). A free between the check and the read is
      outside the host contract (weights stay allocated until ``until``).
    """

    def __init__(
        self,
        choice: WeightChoice,
        *,
        fallback: Callable[[], Callable[[], None] | None] | None = None,
        kernel: Kernel = "auto",
        until: str = "startup_complete",
    ) -> None:
        self.until = until
        self.window_bytes = choice.window_bytes
        self.device = choice.device
        self.source_name = choice.name
        self._fallback_factory = fallback
        self._fallback: Callable[[], None] | None = None
        self._views: list[torch.Tensor] = []  # 1-d float32, one per piece, as read
        # The reads, each a functools.partial over tensors that view the weights: torch's
        # reduction (input, and out=), or Triton's (kernel, grid, chunk, out, n).
        self._launches: list[Callable[[], Any]] = []
        # Each storage read, once: this list is the object's only reference to it, so
        # unheld() can tell a holder of the host's from its own (see _unheld_slot).
        self._storages: list[torch.UntypedStorage] = []
        self._holds: list[tuple[int, int]] = []  # per storage: (_cdata, holders that are ours)
        # Per piece: (storage index, its address, bytes needed, region name).
        self._needed: list[tuple[int, int, int, str]] = []
        # Host tensors a piece was chosen through, each once, held strongly (no weakref: see
        # the class docstring), and (index in _hosts, its address, region name) per piece.
        self._hosts: list[torch.Tensor] = []
        self._owners: list[tuple[int, int, str]] = []
        self.fell_back_reason: str | None = None
        """Why the reads stopped before :meth:`release` (``None``: they never did)."""
        slots: dict[int, int] = {}  # id(storage) -> its index in _storages
        with torch.inference_mode(False):
            self._partial = torch.zeros(OUTPUT_ROWS, dtype=torch.float32, device=self.device)
            self._out = torch.zeros((), dtype=torch.float32, device=self.device)
            for region in choice.regions:
                for piece in region.pieces:
                    self._add(region.name, piece, slots)
        self.read_bytes = sum(v.numel() for v in self._views) * WORD
        self.kernel: Literal["triton", "torch"] = "torch"
        self.kernel_note = ""
        self._choose_kernel(kernel)
        self._holds = self._own_holds()

    def _add(self, name: str, piece: WeightPiece, slots: dict[int, int]) -> None:
        """One piece's view, its reads, and what :meth:`_broken` checks of it."""
        # set_ past a storage's end would grow it: reallocate the weights.
        if piece.offset + piece.nbytes > _nbytes(piece.storage):
            raise WeightsError(
                f"storage of {shown(repr(name), 120)} holds "
                f"{_nbytes(piece.storage):,} bytes, fewer than the "
                f"{piece.offset + piece.nbytes:,} the choice reads; nothing installed"
            )
        slot = slots.get(id(piece.storage))
        if slot is None:
            slot = slots[id(piece.storage)] = len(self._storages)
            self._storages.append(piece.storage)
        count = piece.nbytes // WORD
        view = torch.empty(0, dtype=torch.float32, device=self.device)
        view.set_(piece.storage, piece.offset // WORD, (count,), (1,))
        self._views.append(view)
        main = count - count % OUTPUT_ROWS
        if main:
            self._launches.append(
                partial(torch.sum, view[:main].view(OUTPUT_ROWS, -1), dim=-1, out=self._partial)
            )
        if count - main:
            self._launches.append(partial(torch.sum, view[main:], dim=-1, out=self._out))
        self._needed.append((slot, _address(piece.storage), piece.offset + piece.nbytes, name))
        if piece.tensor is not None and _plain(piece.tensor):
            try:
                address = _tensor_address(piece.tensor)
            except Exception:  # a subclass of the host's that has no address
                return
            index = next((i for i, t in enumerate(self._hosts) if t is piece.tensor), None)
            if index is None:
                index = len(self._hosts)
                self._hosts.append(piece.tensor)
            self._owners.append((index, address, name))

    def _choose_kernel(self, kernel: Kernel) -> None:
        """Triton's read where asked (or ``auto`` and Triton already runs) and it loads."""
        self.kernel_note = {
            "torch": "asked for torch's reduction",
            "auto": "this process runs no Triton yet; torch's reduction spares the hook "
            "Triton's start (about 0.5 s)",
            "triton": "",
        }[kernel]
        wanted = kernel == "triton" or (kernel == "auto" and triton_started())
        if wanted and self._views:
            with torch.inference_mode(False):
                launches, why = triton_reads(self._views, self._partial)
            if launches is None:
                self.kernel_note = why
                log.debug("flare_l2evict: %s; the eviction reads with torch's reduction", why)
            else:
                self._launches, self.kernel, self.kernel_note = launches, "triton", ""

    def views(self) -> tuple[torch.Tensor, ...]:
        """The 1-d float32 views read, one per piece (empty once released)."""
        return tuple(self._views)

    @property
    def released(self) -> bool:
        return not self._views

    def _broken(self) -> str | None:
        """What changed since the hook, in words (``None``: nothing)."""
        storages = self._storages
        for slot, address, needed, name in self._needed:
            try:
                now, size = _address(storages[slot]), _nbytes(storages[slot])
            except Exception:
                return f"the storage of {shown(repr(name), 120)} can no longer be read"
            if now != address or size < needed:
                return (
                    f"the storage of {shown(repr(name), 120)} was freed, resized or moved "
                    f"after the hook (address {address:#x} -> {now:#x}, {size:,} bytes; "
                    "resize_, share_memory_)"
                )
        hosts = self._hosts
        for index, address, region in self._owners:
            try:
                moved = _tensor_address(hosts[index]) != address
            except Exception:  # a host tensor whose address now raises: not the one chosen
                moved = True
            if moved:
                return (
                    f"a tensor of {shown(repr(region), 120)} no longer views the memory read "
                    "(set_, param.data = ..., or offloaded) after the hook"
                )
        try:
            unheld = self.unheld()
        except Exception as error:  # whatever broke the count, the weights cannot be vouched for
            return f"counting the holders of the storages read raised {described(error, 200)}"
        return None if unheld is None else f"{unheld} after the hook"

    def _own_holds(self) -> list[tuple[int, int]]:
        """Per storage read, its ``_cdata`` and how many of this object's tensors hold its memory.

        Counted from the tensors themselves, never as a difference of counts taken
        while the hook runs: a holder the host makes meanwhile stays the host's.
        """
        if _use_count is None:
            return []
        cdatas = [storage._cdata for storage in self._storages]
        slot_of = {cdata: slot for slot, cdata in enumerate(cdatas)}
        ours = [0] * len(cdatas)
        launched = (a for launch in self._launches for a in getattr(launch, "args", ()))
        with torch._C.DisableTorchFunction():  # a host's function mode answers nothing here
            for tensor in chain(self._views, launched):
                if isinstance(tensor, torch.Tensor):
                    slot = slot_of.get(tensor.untyped_storage()._cdata)
                    if slot is not None:
                        ours[slot] += 1
        return list(zip(cdatas, ours, strict=True))

    def _unheld_slot(self) -> int | None:
        """The first storage read that nothing but this object holds (``None``: none)."""
        if _use_count is None or not self._holds:
            return None
        lone = self._lone_hosts()
        # _cdata is the storage's C++ address, fixed while this object holds the storage.
        for slot, (cdata, ours) in enumerate(self._holds):
            if _use_count(cdata) > ours + 1 + (lone.count(cdata) if lone else 0):
                continue  # another tensor of the host's (+1: the storage object)
            if sys.getrefcount(self._storages[slot]) > _LONE_REFS:
                continue  # the host holds the storage object (a fused base it keeps)
            return slot
        return None

    def _lone_hosts(self) -> list[int]:
        """The ``_cdata`` of host tensors only this object holds (usually none: no storage made)."""
        lone: list[int] = []
        for tensor in self._hosts:
            if sys.getrefcount(tensor) <= _LONE_TENSOR_REFS + 1:  # +1: the loop's own name
                with torch._C.DisableTorchFunction():
                    lone.append(tensor.untyped_storage()._cdata)
        return lone

    def unheld(self) -> str | None:
        """Why a storage read is held by nothing but this object (``None``: every one is held);
        call once the hook holds no host mapping."""
        slot = self._unheld_slot()
        if slot is None:
            return None
        name = next(needed[3] for needed in self._needed if needed[0] == slot)
        return (
            f"nothing but the plugin holds the storage of {shown(repr(name), 120)} "
            f"({_nbytes(self._storages[slot]):,} bytes): a copy was passed, or its holder "
            "dropped those weights"
        )

    def __call__(self) -> None:
        fallback = self._fallback
        if fallback is None:
            why = self._broken() if self._views else None
            if why is None and self._views:
                for launch in self._launches:
                    launch()
                return
            fallback = self._fall_back(why)
        fallback()

    def _fall_back(self, why: str | None) -> Callable[[], None]:
        """Stock's eviction from now on, with one WARNING line (``why`` ``None``: released)."""
        self.fell_back_reason = why
        name, until = shown(repr(self.source_name), 120), self.until
        line = (
            f"flare_l2evict: eviction over {name} on {self.device} stops reading weights: "
            f"{why or 'released'}; until {until}, each race falls back to stock b12x's own "
            f"buffer ({until} reports the shortfall); fix: keep the weights in place until {until}"
        )
        say(log, logging.WARNING, "%s", line)
        made = self._fallback_factory() if self._fallback_factory else None
        self._fallback = made if made is not None else _no_eviction
        self.release()
        return self._fallback

    def release(self) -> None:
        """Drop every reference to the weights (the launches hold views of them too). Idempotent."""
        self._views, self._launches, self._storages = [], [], []
        self._needed, self._owners, self._hosts, self._holds = [], [], [], []

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.read_bytes:,} bytes"
        name = shown(repr(self.source_name), 120)
        return f"WeightEviction({name} on {self.device}, {state}, {self.kernel})"


class EvictionHandle:
    """What the seam hands one b12x race job: the shared eviction, counted while alive (the
    audit holds ``race_jobs`` to the most handles alive at once)."""

    __slots__ = ("__weakref__", "eviction")

    def __init__(self, eviction: WeightEviction, on_drop: Callable[[], None]) -> None:
        self.eviction = eviction
        weakref.finalize(self, on_drop)

    def __call__(self) -> None:
        self.eviction()

    def __repr__(self) -> str:
        return f"EvictionHandle({self.eviction!r})"


def _no_eviction() -> None:
    """Used only when no stock eviction can be made (no CUDA device)."""
