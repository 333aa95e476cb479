"""Which Pythons the payload's TensorFlow runs on, and what to tell a host whose Python does not
fit. Pure: no network (TensorFlow's releases are a table here, not a question to an index).

What the payload needs comes from its requirements.txt where that pins TensorFlow
(`tensorflow>=2.16`), else from the TensorFlow installed beside the controller (its own
Requires-Python), which is what a payload without a pin gets on a host set up like this one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from deploy.commandline import command
from deploy.host.probe import PACKAGES, normalized

# Each TensorFlow minor release and the oldest and newest Python it has wheels for (its
# Requires-Python and classifiers on PyPI). A release newer than the table needs at least
# what the newest here needs, and says nothing of a newest Python.
TENSORFLOW_PYTHONS: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {
    (2, 2): ((3, 5), (3, 8)), (2, 3): ((3, 5), (3, 8)), (2, 4): ((3, 6), (3, 8)),
    (2, 5): ((3, 6), (3, 9)), (2, 6): ((3, 6), (3, 9)), (2, 7): ((3, 7), (3, 9)),
    (2, 8): ((3, 7), (3, 10)), (2, 9): ((3, 7), (3, 10)), (2, 10): ((3, 7), (3, 10)),
    (2, 11): ((3, 7), (3, 10)), (2, 12): ((3, 8), (3, 11)), (2, 13): ((3, 8), (3, 11)),
    (2, 14): ((3, 9), (3, 11)), (2, 15): ((3, 9), (3, 11)), (2, 16): ((3, 9), (3, 12)),
    (2, 17): ((3, 9), (3, 12)), (2, 18): ((3, 9), (3, 12)), (2, 19): ((3, 9), (3, 12)),
    (2, 20): ((3, 9), (3, 13)), (2, 21): ((3, 10), (3, 13)),
}
# Releases a pin may admit beyond the table: every later minor of 2, and a 3.0.
_LATER = [(2, m) for m in range(max(TENSORFLOW_PYTHONS)[1] + 1, 60)] + [(3, 0)]
TENSORFLOW_NAMES = {normalized(name) for name in PACKAGES["tensorflow"]}


@dataclass(frozen=True)
class PythonNeed:
    """The Pythons a payload's TensorFlow runs on: `oldest` and `newest` (None: not known)."""
    what: str                      # `tensorflow>=2.16`, or `tensorflow 2.21.0 (the controller's)`
    oldest: tuple[int, int]
    newest: tuple[int, int] | None = None
    pinned: bool = True            # from the payload's requirements.txt

    @property
    def supports(self) -> str:
        oldest = "%d.%d" % self.oldest
        return f"{oldest}+" if self.newest is None else f"{oldest} to {'%d.%d' % self.newest}"


def tensorflow_pin(requirements: str) -> str | None:
    """The TensorFlow requirement of a requirements.txt, as written (`tensorflow>=2.16`), when
    it names a version; lines pip reads otherwise (options, includes, URLs) are not pins."""
    for line in requirements.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if normalized(requirement.name) in TENSORFLOW_NAMES and requirement.specifier:
            return f"{requirement.name}{requirement.specifier}"
    return None


def pin_need(pin: str) -> PythonNeed | None:
    """The Pythons that the releases `pin` admits run on, together; None when it admits none
    that the table knows (a TensorFlow 1)."""
    specifier = Requirement(pin).specifier
    admitted = [r for r in [*TENSORFLOW_PYTHONS, *_LATER] if _admits(specifier, r)]
    known = [TENSORFLOW_PYTHONS[r] for r in admitted if r in TENSORFLOW_PYTHONS]
    if not admitted:
        return None
    later = len(known) < len(admitted)
    oldest = min([o for o, _ in known] + ([TENSORFLOW_PYTHONS[max(TENSORFLOW_PYTHONS)][0]]
                                           if later else []))
    newest = None if later else max(n for _, n in known)
    return PythonNeed(pin, oldest, newest)


def _admits(specifier: SpecifierSet, release: tuple[int, int]) -> bool:
    """Whether `specifier` admits some version of the minor `release` (2.16.0 to 2.16.x, its
    release candidates included)."""
    major, minor = release
    candidates = [f"{major}.{minor}.{patch}" for patch in range(0, 12)]
    candidates += [f"{major}.{minor}.0rc{n}" for n in range(0, 4)]
    return any(specifier.contains(v, prereleases=True) for v in candidates)


def requires_python_need(what: str, requires_python: str) -> PythonNeed | None:
    """A PythonNeed from a distribution's Requires-Python (`>=3.10`); None when it names no
    lower bound among Python 3's minors."""
    specifier = SpecifierSet(requires_python)
    admitted = [(3, m) for m in range(0, 40) if specifier.contains(f"3.{m}.0")]
    if not admitted:
        return None
    newest = None if admitted[-1] == (3, 39) else admitted[-1]
    return PythonNeed(what, admitted[0], newest, pinned=False)


def controller_need() -> PythonNeed | None:
    """What the TensorFlow beside the controller needs (its Requires-Python), or None."""
    from importlib import metadata    # only here: importing it costs a twentieth of a second
    for name in PACKAGES["tensorflow"]:
        try:
            meta = metadata.metadata(name)
        except metadata.PackageNotFoundError:
            continue
        requires = meta.get("Requires-Python")
        if requires:
            try:
                return requires_python_need(f"tensorflow {meta['Version']} (as on this "
                                            f"machine)", requires)
            except ValueError:
                return None
    return None


def payload_need(payload: Path) -> PythonNeed | None:
    """What the payload's TensorFlow needs: its requirements.txt's pin, else the controller's."""
    path = payload / "requirements.txt"
    pin = tensorflow_pin(path.read_text(errors="replace")) if path.is_file() else None
    need = pin_need(pin) if pin else None
    return need or controller_need()


def python_version(text: str) -> tuple[int, int] | None:
    """(3, 8) of `3.8.18`, `3.13.0rc1`; None when it is not a version."""
    try:
        release = Version(text).release
    except InvalidVersion:
        match = re.match(r"(\d+)\.(\d+)", text)
        return (int(match[1]), int(match[2])) if match else None
    return (release + (0,))[:2]


def python_problem(python: str, need: PythonNeed | None,
                   has_tensorflow: bool = False) -> str | None:
    """`Python 3.8.18 is too old for tensorflow>=2.16 (needs 3.9+): ...`, or None when it
    fits (or nothing is known). A host that has TensorFlow installed already is not judged by
    the controller's TensorFlow: only a pin in the payload speaks for the host."""
    version = python_version(python)
    if need is None or version is None or (has_tensorflow and not need.pinned):
        return None
    if version < need.oldest:
        return (f"Python {python} is too old for {need.what} (needs "
                f"{need.supports}): set python: to a newer interpreter, or {command('setup')} with "
                f"one")
    if need.newest is not None and version > need.newest:
        return (f"Python {python} is too new for {need.what} (supports "
                f"{need.supports}): set python: to an older interpreter, or {command('setup')} "
                f"with one")
    return None


def install_hint(packages: list[str], externally_managed: bool) -> str:
    """How to install missing packages for the host's python: pip, except where the Python is
    externally managed (PEP 668: a distribution's own, where pip install is refused)."""
    if externally_managed:
        return (f"an externally managed Python, where pip install is refused: {command('setup')} "
                f"builds an environment from the payload's requirements.txt")
    return "pip install " + " ".join(PACKAGES.get(p, (p,))[0] for p in packages)
