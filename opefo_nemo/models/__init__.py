"""Models and model formats, built and read locally (nothing is downloaded): :mod:`.tiny`,
:mod:`.shape`, :mod:`.megatron_weights`. Submodules are imported explicitly, so importing one does
not pull in torch or transformers for the others (``launch/`` reads :mod:`.shape` without torch).
"""
