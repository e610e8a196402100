"""Policy implementations: ``hf`` (one device, CPU or GPU); ``aligner`` (NeMo-Aligner) later."""
