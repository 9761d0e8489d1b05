"""Simulated GPU and network hardware for lab nodes (see docs/lab-hardware.md).

Generators per tool (:mod:`.nvsmi`, :mod:`.ib`, :mod:`.perf`, :mod:`.dcgm`, :mod:`.kernel`,
:mod:`.fabric`) take a hardware profile, the node's faults and its name, and return the text the
real tool prints. :mod:`.standin` is the entry point behind the commands installed in a node.
Everything here but :mod:`.profiles` and :mod:`.bmc` uses only the standard library and relative
imports, so the lab can copy the package into a node that has nothing but python3. :mod:`.bmc`,
the simulated Redfish BMCs, runs on the lab host and is not copied.
"""
