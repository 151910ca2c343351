"""Everything that turns user input into a `Config`: the schema, the YAML loader, presets, the
GPU catalog, Megatron argument names and the importers (Hugging Face config.json, Megatron
command lines)."""
