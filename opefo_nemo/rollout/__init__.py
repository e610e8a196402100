"""The rollout service: vLLM server processes behind a small, versioned socket protocol.

Never imports megatron or NeMo (it may run in vLLM's own environment). See docs/rollout.md.
"""

from opefo_nemo.rollout.client import VLLMRolloutEngine
from opefo_nemo.rollout.process import RolloutServerError
from opefo_nemo.rollout.protocol import PROTOCOL_VERSION
from opefo_nemo.rollout.types import Completion, SamplingConfig

__all__ = [
    "PROTOCOL_VERSION",
    "Completion",
    "RolloutServerError",
    "SamplingConfig",
    "VLLMRolloutEngine",
]
