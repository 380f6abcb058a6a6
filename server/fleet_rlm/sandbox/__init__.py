"""Code execution: the sandbox protocol (:mod:`fleet_rlm.sandbox.base`) and its backends.

``local`` (:mod:`fleet_rlm.sandbox.local`) runs a persistent Python worker isolated with
bubblewrap; :mod:`fleet_rlm.sandbox.interpreter` adapts any backend's REPL to dspy's
``CodeInterpreter``. Import backends from their modules: this package stays light.
"""
