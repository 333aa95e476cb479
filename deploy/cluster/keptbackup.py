"""The controller's copy of the chief's backup (runs/<id>/backup/chief.tar.gz), renewed after
each of the chief's epochs from what changed on the chief since the last copy: the chief
lists its backup's files (size and mtime in ns each) and sends only those not as the copy
holds them; the rest is taken from the copy. The copy is one tar.gz, each member carrying
the mtime_ns its host saw (archive.pack_changed): what the next fetch sends as known, and
what a member may be taken from the copy by. It is replaced whole or not at all.

A host is untrusted: what it sends must add up with what it lists, and together stay
within the fetch limits, or the copy stays as it was.
"""
from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO, Mapping

from deploy.host.archive import (
    Limits, Refused, each_member, listed, mtime_ns, plain_name, size, survey
)


def known(kept: Path) -> dict[str, tuple[int, int]]:
    """What the copy holds, by name: (size, mtime_ns); nothing when there is no copy or it
    cannot be read (then every file travels)."""
    try:
        with kept.open("rb") as copy:
            files, _ = listed(copy)
    except (OSError, Refused):
        return {}
    return {name: sig for name, sig in files.items() if sig[1] is not None}


def renew(kept: Path, changed: BinaryIO | None, files: Mapping[str, tuple[int, int]],
          limits: Limits) -> None:
    """Make `kept` the backup as `files` lists it (name -> (size, mtime_ns)): the members of
    `changed` (tar.gz of the files that changed, None when none did), every other file
    from `kept` as it was. Refused, `kept` untouched, past `limits` or when they do not
    add up."""
    strange = next((name for name in files if not plain_name(name)), None)
    if strange is not None:
        raise Refused(f"it lists {strange!r}, not a plain relative name")
    total = sum(length for length, _ in files.values())
    if len(files) > limits.members or total > limits.bytes:
        raise Refused(f"the backup holds {len(files)} files of {size(total)}: more than the "
                      f"limit of {size(limits.bytes)} and {limits.members} files", True)
    sent, count = {}, 0
    if changed is not None:
        survey(changed, limits)
        changed.seek(0)
        sent, count = listed(changed)
        changed.seek(0)
    for name, sig in sent.items():
        if tuple(files.get(name, ())) != sig:
            raise Refused(f"it sent {name!r}, which its list does not name as sent")
    reused = [name for name in files if name not in sent]
    have = known(kept) if reused else {}
    missing = [name for name in reused if have.get(name) != tuple(files[name])]
    if missing:
        raise Refused(f"{len(missing)} file(s) it did not send are not in the copy here as "
                      f"listed (the first: {missing[0]!r})")
    # Its own name: a copy still coming in the background may be written beside it.
    with tempfile.NamedTemporaryFile(dir=kept.parent, prefix=kept.name + ".",
                                     delete=False) as out:
        try:
            if not reused and changed is not None and count == len(sent):
                shutil.copyfileobj(changed, out)        # every file came: the archive as is
            else:
                _merge(out, changed, kept if reused else None, files)
        except BaseException:
            Path(out.name).unlink()
            raise
    Path(out.name).replace(kept)


def _merge(out: BinaryIO, changed: BinaryIO | None, kept: Path | None,
           files: Mapping[str, tuple[int, int]]) -> None:
    """Each listed file once, from `changed` where it came, else from `kept`."""
    written: set[str] = set()
    # A local copy, read back at once: speed matters more than size here.
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1,
                      format=tarfile.PAX_FORMAT) as tar:
        for source in (changed, kept.open("rb") if kept is not None else None):
            if source is None:
                continue
            with source:
                for archive, member in each_member(source):
                    sig = (member.size, mtime_ns(member))
                    if member.isfile() and member.name not in written and \
                            tuple(files.get(member.name, ())) == sig:
                        tar.addfile(member, archive.extractfile(member))
                        written.add(member.name)
