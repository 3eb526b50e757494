"""labkit's JAX/Flax room: the models, the stepper and the lessons that run on JAX/Flax."""
