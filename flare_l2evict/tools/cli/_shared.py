"""What every command shares: its declaration, the parser, arguments, errors, exit codes, the log.

A command is one module of this package that declares one :class:`Command`: its name,
its arguments, its handler, its example and what its exit codes mean, and the model
its ``--json`` prints. The registry (:data:`flare_l2evict.tools.cli.COMMANDS`) lists
them; the parser, ``--help``'s examples, the dispatch and the generated command
reference are all made from it. Torch- and pydantic-free: a usage error is answered before
either is imported, and so is ``--device cuda:N`` on a machine with no GPU driver.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol

from ..._errors import CheckpointError, ConfigError, L2EvictError
from ..._text import _cut, shown
from .._profiles import (
    DEFAULT_KV_BYTES_PER_TOKEN,
    DEFAULT_PROFILE,
    PROFILES,
    DeviceProfile,
    GiB,
    MiB,
)
from .._wrapping import WIDTH, wrap
from ._runner import EXIT_INTERRUPTED, EXIT_USAGE

if TYPE_CHECKING:  # the CLI parses its arguments before importing torch or any tool
    import torch
    from pydantic import BaseModel

PROG = "flare-l2evict"
LOGGER = "flare_l2evict"
"""The one logger the CLI routes to stderr: its own and the plugin's lines, no library's."""
log = logging.getLogger(f"{LOGGER}.tools.cli")

# -- exit codes -----------------------------------------------------------------------------

# One meaning per exit code, for every command (each command's ``--help`` says its own).
EXIT_INSTALLS: Final = 0
EXIT_FALLS_BACK: Final = 1
USAGE_ERROR = "a usage or input error (one line on stderr: the cause and the fix)"
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM): one line on stderr"


@dataclass(frozen=True)
class Exits:
    """What exit 0, 1 and 2 mean for one command (130 means the same for all)."""

    installs: str
    falls_back: str = "(not used)"
    usage: str = USAGE_ERROR

    def lines(self) -> list[tuple[int, str]]:
        return [
            (EXIT_INSTALLS, self.installs),
            (EXIT_FALLS_BACK, self.falls_back),
            (EXIT_USAGE, self.usage),
            (EXIT_INTERRUPTED, INTERRUPTED),
        ]


# -- a command ------------------------------------------------------------------------------

VERBOSE_DECISIONS = "log debug lines too: how the plugin decided, step by step (stderr)"


@dataclass(frozen=True)
class Command:
    """One command of ``flare-l2evict``: everything the parser, the dispatch and the docs need.

    ``arguments`` adds the command's own flags (the registry is passed for a command that
    names the others, as ``schema`` does); ``run`` is its handler, returning its exit
    code; ``output`` gives the pydantic model its ``--json`` prints (``None``: no
    ``--json``), imported only when asked for; ``temporary`` whether an interrupted run
    removed temporary files it had written. A declaration is its own registry entry
    (:class:`Listed`), as a test's stand-in command is.
    """

    name: str
    help: str
    example: str
    exits: Exits
    arguments: Callable[[Parser, Sequence[Listed]], None]
    run: Callable[[argparse.Namespace], int]
    output: Callable[[], type[BaseModel]] | None = None
    verbose: str = VERBOSE_DECISIONS
    temporary: Callable[[argparse.Namespace], bool] = lambda _args: False

    @property
    def json(self) -> bool:
        return self.output is not None

    def load(self) -> Command:
        return self

    def epilog(self) -> str:
        """``--help``'s tail: one example, and what each exit code means."""
        lines = ["example:", f"  {PROG} {self.example}", "", "exit codes:"]
        for code, meaning in self.exits.lines():
            lines += wrap(meaning, 78, first=f"  {code:<3}  ", rest="       ")
        return "\n".join(lines)


class Listed(Protocol):
    """One entry of the registry: what the parser needs of every command, and the command's
    declaration on demand (:class:`flare_l2evict.tools.cli.CommandInfo`, or a
    :class:`Command` itself)."""

    @property
    def name(self) -> str: ...
    @property
    def help(self) -> str: ...
    @property
    def json(self) -> bool: ...
    def load(self) -> Command: ...


# -- the parser -----------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one bounded line naming cause and fix, and exit 2.

    ``--help`` is argparse's own. argparse echoes a bad value whole, so the cause is cut
    before the fix is added: the fix always survives. A misspelled flag or choice gets the
    nearest known one.
    """

    commands: Mapping[str, argparse.ArgumentParser]
    """Each command's parser by name (on the top-level parser): its errors name its --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: `--race-job 3` taken as `--race-jobs 3` today is a silent break
        # tomorrow, when a flag that shares the prefix is added. Subparsers are made by this
        # class too, so every command gets the same rules.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if "required: command" in message:
            names = ", ".join(getattr(self, "commands", {}))
            fix = f"name a command: {names} ({PROG} --help says what each does)"
        else:
            fix = f"see {self.prog} --help"
            nearest = self._nearest(message)
            if nearest is not None:
                fix = f"did you mean {nearest}? ({fix})"
        self.exit(
            EXIT_USAGE, one_line(f"error: {self.prog}: {shown(message, 600)}; fix: {fix}") + "\n"
        )

    def _nearest(self, message: str) -> str | None:
        """The known flag or choice nearest a misspelled one, from argparse's message."""
        if message.startswith("unrecognized arguments: "):
            flags = [o for action in self._actions for o in action.option_strings]
            given = message.removeprefix("unrecognized arguments: ").split()
            typed = next((word for word in given if word.startswith("-")), None)
            known = flags
        elif found := re.search(r"invalid choice: '(.{1,100}?)' \(choose from (.*)\)", message):
            typed, known = found.group(1), re.findall(r"'?([\w-]+)'?", found.group(2))
        elif found := re.search(r"argument --device: '(.{1,40}?)' is not a device", message):
            return _nearest_device(found.group(1))
        else:
            return None
        if typed is None:
            return None
        # Compared without their dashes: "--" alone makes "--bogus" look like "--verbose".
        bare = {name.lstrip("-"): name for name in known}
        wanted = typed.partition("=")[0].lstrip("-")
        close = difflib.get_close_matches(wanted, list(bare), n=1, cutoff=0.75)
        return bare[close[0]] if close else None


def _nearest_device(typed: str) -> str | None:
    """The device nearest a misspelled ``--device`` (``cudaa`` -> ``cuda``, ``cuda1`` ->
    ``cuda:1``): its type's nearest name, with its index where it had one."""
    kind, colon, index = typed.partition(":")
    if not colon and (number := re.fullmatch(r"(.*?)([0-9]+)", typed, re.ASCII)):
        kind, index = number.groups()
    close = difflib.get_close_matches(kind.lower(), ["cpu", "cuda"], n=1, cutoff=0.75)
    if not close:
        return None
    numbered = close[0] == "cuda" and index.isascii() and index.isdigit() and len(index) <= 3
    nearest = f"cuda:{int(index)}" if numbered else close[0]
    return nearest if nearest != typed else None


def parser(
    commands: Sequence[Listed],
    version: str | Callable[[], str],
    load: Collection[str] | None = None,
) -> Parser:
    """The top-level parser: one subcommand per entry of ``commands``, in their order.

    Only the commands named in ``load`` (default: all) are loaded and given their flags:
    the one that runs. ``version`` may be a function, asked only by ``--version``.
    """
    top = Parser(
        prog=PROG,
        description="b12x start-up races evict L2 by reading resident weights; "
        "the KV cache gets the eviction buffers.",
    )
    shows = top.add_argument("--version", action=_Version, help=f"print {PROG}'s version and exit")
    assert isinstance(shows, _Version)
    shows.version = version
    subparsers = top.add_subparsers(dest="command", required=True)
    top.commands = subparsers.choices
    for entry in commands:
        sub = subparsers.add_parser(entry.name, help=entry.help)
        if load is None or entry.name in load:
            command = entry.load()
            command.arguments(sub, commands)
            _add_verbosity(sub, command.verbose)
            sub.epilog = command.epilog()
    top.epilog = (
        f"example:\n  {PROG} startup --plugin l2evict\n\n"
        "exit codes (each command's --help says its own):\n"
        "  0    the plugin installs and credits, or is disabled by config\n"
        "  1    it falls back, on this device or on any rank\n"
        "  2    a usage or input error\n"
        f"  130  {INTERRUPTED}"
    )
    return top


class _Version(argparse.Action):
    """``--version``: argparse's, with the version found only when asked (its distribution
    record is a scan of the installed packages)."""

    version: str | Callable[[], str] = "(unknown)"

    def __init__(self, option_strings: Sequence[str], **kwargs: Any) -> None:
        kwargs.update(dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0)
        super().__init__(option_strings, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> NoReturn:
        version = self.version if isinstance(self.version, str) else self.version()
        print(f"{PROG} {version}")  # on stdout, as argparse's own
        parser.exit()


def own_version() -> str:
    """This package's installed version (its distribution record), torch-free."""
    from ..._b12x.provider import installed_version

    return installed_version("flare-l2evict") or "(not installed)"


def _add_verbosity(parser: argparse.ArgumentParser, verbose: str) -> None:
    """``-q`` and ``-v`` on a command: the log's level (stdout never changes)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="log warnings and errors only (stderr): no INFO lines, no progress",
    )
    group.add_argument("-v", "--verbose", action="store_true", help=verbose)


def log_level(args: argparse.Namespace) -> int:
    if getattr(args, "quiet", False):
        return logging.WARNING
    return logging.DEBUG if getattr(args, "verbose", False) else logging.INFO


# -- arguments ------------------------------------------------------------------------------


def whole_number_in(low: int, limit: int) -> Any:
    """An argparse ``type`` for a whole number in ``low..limit`` (the bench uses it too)."""

    def parse(text: str) -> int:
        # 30 characters hold any number in range; int() of a longer one only costs time.
        # ASCII digits only, as in a window's size: int() would read "９" too.
        try:
            value = int(text) if len(text) <= 30 and text.isascii() else None
        except ValueError:
            value = None
        if value is None and not _WHOLE.match(text):
            raise argparse.ArgumentTypeError(f"'{shown(text, 40)}' is not a whole number")
        if value is None or not low <= value <= limit:
            raise argparse.ArgumentTypeError(
                f"'{shown(text, 40)}' must be between {low} and {limit:,}"
            )
        return value

    return parse


_WHOLE = re.compile(r"^\s*[+-]?[0-9]+\s*$")
# ASCII digits, no leading zero, whole text: torch.device refuses "cuda:007", "cuda:٣" and a
# trailing newline ("$" would match before one), which a loose pattern let through to a traceback.
_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]{0,2}))?", re.ASCII)


def device_text(text: str) -> str:
    """An argparse ``type`` for ``--device``: ``cpu``, ``cuda`` or ``cuda:N``, checked whole."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"'{shown(text, 40)}' is not a device; use cpu, cuda or cuda:N"
        )
    return text


def usable_device(text: str) -> torch.device:
    """The device named by ``--device``, checked against this machine by torch.

    A command refuses ``cuda:N`` on a machine with no GPU driver before it imports torch
    (:func:`refuse_cuda_without_driver`), among its other input checks.
    """
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as error:  # the pattern's check is first; torch has the word
        raise L2EvictError(
            f"--device {shown(text, 40)}: not a device torch knows ({shown(str(error), 200)}); "
            "fix: use cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise L2EvictError(f"--device {text}: CUDA is not available here; fix: --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise L2EvictError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA devices; "
                f"fix: --device cuda:0..{torch.cuda.device_count() - 1}"
            )
    return device


def refuse_cuda_without_driver(text: str) -> None:
    """Refuse ``cuda:N`` on a machine with no GPU driver, torch-free, in milliseconds."""
    if text.startswith("cuda") and (missing := missing_driver()) is not None:
        raise L2EvictError(
            f"--device {text}: CUDA is not available here ({missing}); fix: --device cpu"
        )


DRIVER_LIBRARY = "libcuda.so.1"
"""The driver library CUDA's runtime loads, by this name, to reach any device."""

_GPU_PATHS = (
    "/dev/nvidiactl",  # the NVIDIA driver's device files (nvidia-smi opens these)
    "/dev/nvidia0",
    "/proc/driver/nvidia",  # the NVIDIA kernel module, loaded
    "/sys/module/nvidia",
    "/dev/dxg",  # WSL 2: CUDA through the Windows driver
    "/dev/kfd",  # ROCm: torch's cuda device on an AMD GPU
)


def missing_driver() -> str | None:
    """Why no CUDA device can exist here, in words; ``None``: torch must decide.

    Asking ``torch.cuda`` costs torch's import (2 to 7 s); a machine with no driver at
    all is told in milliseconds, the way ``nvidia-smi`` finds one. It answers "no driver"
    only when CUDA cannot work (CUDA's runtime reaches the driver through
    ``libcuda.so.1`` alone), so it never refuses a GPU machine: anything that hints at a
    GPU (an NVIDIA device file or kernel module, WSL's ``/dev/dxg``, ROCm's ``/dev/kfd``),
    a driver with no device, a torch without CUDA and other systems than Linux are left
    to torch.
    """
    if not sys.platform.startswith("linux"):
        return None
    if any(os.path.exists(path) for path in _GPU_PATHS):
        return None
    try:
        import ctypes

        # Loading maps the library without starting the driver; torch loads it all the same.
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return f"no NVIDIA driver: {DRIVER_LIBRARY} does not load and there is no /dev/nvidiactl"
    except Exception:  # a Python without ctypes: not a proof of anything
        return None
    return None


LIMITS = {
    "--l2-mib": 4096,
    "--race-jobs": 1024,
    "--memory-gib": 4096,
    "--kv-bytes-per-token": 1 << 24,
}
"""Upper bounds that refuse a typo before it costs minutes or terabytes."""


def add_profile_flags(parser: Parser, *, memory: bool = False, kv: bool = False) -> None:
    """The device profile's flags; ``memory`` and ``kv`` only where the command uses them."""
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        metavar="|".join(sorted(PROFILES)),
        help=f"device to stand in for on a CPU (default {DEFAULT_PROFILE}, the seed's machine)",
    )
    parser.add_argument(
        "--l2-mib",
        type=whole_number_in(1, LIMITS["--l2-mib"]),
        metavar="M",
        help="override the profile's L2",
    )
    parser.add_argument(
        "--race-jobs",
        type=whole_number_in(0, LIMITS["--race-jobs"]),
        metavar="J",
        help="override the profile's race jobs, 0..1,024 as the host contract takes them",
    )
    if memory:
        parser.add_argument(
            "--memory-gib",
            type=whole_number_in(1, LIMITS["--memory-gib"]),
            metavar="G",
            help="override the profile's memory",
        )
    if kv:
        parser.add_argument(
            "--kv-bytes-per-token",
            type=whole_number_in(1, LIMITS["--kv-bytes-per-token"]),
            metavar="B",
            default=DEFAULT_KV_BYTES_PER_TOKEN,
            help=f"KV cache bytes per token (default {DEFAULT_KV_BYTES_PER_TOKEN}, the seed's "
            "ratio)",
        )


def profile_of(args: argparse.Namespace) -> DeviceProfile:
    """The profile the flags name, with their overrides."""
    profile = PROFILES[args.profile]
    if args.l2_mib:
        profile = replace(profile, l2_cache_bytes=args.l2_mib * MiB)
    if args.race_jobs is not None:  # 0 is a value: a host that races nothing
        profile = replace(profile, race_jobs=args.race_jobs)
    if getattr(args, "memory_gib", None):
        profile = replace(profile, memory_bytes=args.memory_gib * GiB)
    return profile


CONFIG_HELP = "deployment config (.toml, .yaml, .json)"


def add_config_flag(parser: Parser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)


# -- what a command prints ------------------------------------------------------------------


def wrapped(text: str, indent: str = "", more: str = "  ", whole: Sequence[str] = ()) -> str:
    """``text`` within :data:`WIDTH` columns, every line after the first indented ``more``;
    broken at blanks only, and never inside any of ``whole``."""
    return "\n".join(
        wrap(text, WIDTH, first=indent, rest=indent + (more if indent else ""), whole=whole)
    )


def size_text(value: int) -> str:
    """Bytes as the tables print them: MiB below 16 GiB where whole, else GiB."""
    if value % MiB == 0 and value < 16 * GiB:
        return f"{value // MiB:,} MiB"
    if value < GiB:
        return f"{value / MiB:,.1f} MiB"
    return f"{value / GiB:.2f} GiB"


def plural(count: int, word: str) -> str:
    """``1 tensor``, ``2 tensors``."""
    return f"{count:,} {word}{'s' * (count != 1)}"


def step(command: str, what: str) -> None:
    """One INFO line on stderr as a step that can take seconds begins (``-q`` silences it)."""
    log.info("%s %s: %s", PROG, command, what)


def log_steps(what: str, seconds: Mapping[str, float]) -> None:
    """One DEBUG line: the wall time of each of ``what``'s steps, in order."""
    if log.isEnabledFor(logging.DEBUG):
        steps = ", ".join(f"{name} {value:.3f} s" for name, value in seconds.items())
        log.debug("flare_l2evict: %s took %s", what, steps or "no steps")


# -- errors ---------------------------------------------------------------------------------

LINE_BYTES = 1024
"""UTF-8 bytes of one error line, its newline included."""


def one_line(message: str, max_bytes: int = LINE_BYTES) -> str:
    """``message`` as one printable line of at most ``max_bytes`` UTF-8 bytes, newline included.

    The last guard: whatever an error carries, stderr gets one bounded line.
    """
    line = _cut(message, max_bytes)
    encoded = line.encode("utf-8")
    if len(encoded) < max_bytes:
        return line
    marker = "...[cut]"
    return encoded[: max_bytes - 1 - len(marker)].decode("utf-8", "ignore") + marker


_FIX = "; fix: "


def error_line(prog: str, cause: str, fix: str | None = None) -> str:
    """``error: PROG: <cause>; fix: <fix>``: every error, one line of <= 1 KB.

    A cause that carries its own ``; fix: ...`` keeps it; else ``fix`` is used (by default,
    ``PROG --help``). The cause is cut before the fix is added, so the fix always survives.
    """
    cause, found, own_fix = cause.partition(_FIX)
    fix = own_fix if found else (fix or f"see {prog} --help")
    return one_line(f"error: {prog}: {shown(cause, 600)}{_FIX}{shown(fix, 300)}")


_RAISED = "and on_error = 'raise': "
"""What start-up's error says when ``on_error = "raise"`` turned a fallback into an abort."""
RAISED_FIX = (
    'set on_error = "fallback" in the config\'s [plugins.l2evict] section (start-up then '
    "keeps stock b12x and credits 0 instead of aborting)"
)
"""The fix of an abort under ``on_error = "raise"`` whose cause names no fix of its own."""
_DEFAULT_FIX: tuple[tuple[type[Exception], str], ...] = (
    (ConfigError, "correct the config file at the line or key named"),
    (CheckpointError, "pass .safetensors files or a model.safetensors.index.json"),
)


def fix_for(error: Exception) -> str | None:
    """The fix an error's cause implies where it names none of its own."""
    if _RAISED in str(error):  # the cause's own fix, if it has one, still comes first
        return RAISED_FIX
    return next((fix for kind, fix in _DEFAULT_FIX if isinstance(error, kind)), None)


def route_log(level: int) -> Callable[[], None]:
    """:data:`LOGGER`'s lines at ``level`` and above to stderr; returns the undo.

    Only this package's logger, not the root: a library's own INFO lines (torch's
    ``FakeTensor cache stats`` at exit) are not the operator's. It does not propagate
    meanwhile, so a library that configured the root logger cannot print each line twice.
    The undo leaves the logger as it was, for a program that calls ``main`` in-process.
    """
    logger = logging.getLogger(LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    was = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

    def unroute() -> None:
        logger.removeHandler(handler)
        logger.setLevel(was[0])
        logger.propagate = was[1]

    return unroute
