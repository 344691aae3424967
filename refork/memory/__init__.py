"""Where memory is measured and shared: heap preparation before fork, /proc accounting, allocators.

Import the submodules themselves (`refork.memory.heap`, `.accounting`, `.allocator`, `.profiling`):
this package imports none of them, so none of them imports a package that imports it back.
"""
