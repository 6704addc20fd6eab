"""Test suites shipped with the package, for plug-ins to pass (:mod:`.formats`)."""
