"""`moeplan calibrate`: measured Megatron runs in, efficiency factors of the step-time model out."""
