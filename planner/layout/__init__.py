"""Where every rank sits: Megatron's rank generator, the dense and expert grids with one record per
process-group kind, pipeline splits and layout strings, pipeline schedules, and the layout summary."""
