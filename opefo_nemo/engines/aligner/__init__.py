"""The NeMo-Aligner actor: NeMo's ``MegatronGPTModel`` restored from a NeMo checkpoint, handed to
the Megatron engine (:mod:`opefo_nemo.engines.megatron`). The only package that imports NeMo.

:func:`build_actor` checks for NeMo without importing it, so this package imports anywhere.
"""

from opefo_nemo.engines.aligner.availability import AlignerUnavailableError, build_actor

__all__ = ["AlignerUnavailableError", "build_actor"]
