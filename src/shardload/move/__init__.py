"""Moving stores: URLs and their cache, node-local staging, SquashFS images, serving over HTTP.

Imports no store internals: the read side uses it to reach files, never the other way round."""
