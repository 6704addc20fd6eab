"""Pure planners: no I/O, no torch. Where the decisions about *which rows go where* live."""
