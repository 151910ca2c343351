"""Importers: turn what users already have (a Megatron-LM command line, a Hugging Face config) into a
moeplan config dictionary, reporting whatever they cannot map."""
