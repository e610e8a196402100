"""YAML configuration under ``conf/``, validated into typed dataclasses at start-up."""

from opefo_nemo.config.method import conf_dir, load_method, method_names

__all__ = ["conf_dir", "load_method", "method_names"]
