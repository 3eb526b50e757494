"""labkit's PyTorch room: the models, the stepper and the lessons that run on PyTorch."""
