"""Copying a file's data without its holes: what a host-side copy of a file a sandbox
made may cost is what the file holds, never its apparent size (``truncate -s 50G``
makes a 50G file of nothing).

``SEEK_DATA``/``SEEK_HOLE`` name the data extents (tmpfs, ext4, xfs, btrfs report them;
a filesystem that does not reports the whole file as data, which is then copied as
before); each is sent to the same offset of the copy, and the copy's size is set at the
end, so a hole stays a hole, trailing ones included.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

CHUNK = 8 << 20


def copy_data(src: int, dst: int, charge: Callable[[int], None] | None = None, passes: int = 1) -> int:
    """The data of ``src`` into ``dst`` (empty, both regular files) at the same offsets;
    returns the bytes copied. ``charge`` is told each piece written (a budget may raise
    there). ``passes``: how many times the source's size is read again to take what
    was appended meanwhile (a file a running sandbox may still be writing)."""
    done = pos = end = 0
    for _ in range(passes):
        end = os.fstat(src).st_size
        if pos >= end:
            break
        while pos < end:
            try:
                start = os.lseek(src, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: nothing but a hole after pos
                    raise
                break
            if start >= end:
                break
            stop = min(os.lseek(src, start, os.SEEK_HOLE), end)
            while start < stop:
                os.lseek(dst, start, os.SEEK_SET)
                n = os.sendfile(dst, src, start, min(stop - start, CHUNK))
                if n == 0:  # the file shrank meanwhile
                    stop = end = start
                    break
                if charge is not None:
                    charge(n)
                start += n
                done += n
            pos = max(stop, pos + 1)
        pos = end
    os.ftruncate(dst, end)
    return done
