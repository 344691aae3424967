"""The supervisor, sans-IO: events in (refork.process.supervisor.events), actions out.

`core.Supervisor` holds every decision the monitor makes; `roster` is its bookkeeping of
children; refork.process.monitor is the loop that turns the OS into events and actions into
system calls. Import the modules directly (this package re-exports nothing, so importing one
part never drags in the rest).
"""
