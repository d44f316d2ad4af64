import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
# Lets the tests choose the amx kernel ISA on CPUs without AMX tiles: its
# kernels then run on the library's tile emulator (never the default ISA).
# Set before the library is loaded, which reads it once.
os.environ.setdefault("HUBRT_AMX_EMULATE", "1")
