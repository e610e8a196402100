"""opefo-nemo: On-Policy Entropy Flow Optimization on the NeMo / Megatron stack."""

__version__ = "0.1.0"
