"""Placing a file into a test's model folder. A hard link where the file
system allows it (no copy of a large file), a copy otherwise: never a
symlink, which hubrt refuses when it leads out of the folder."""
import os
import shutil


def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)
