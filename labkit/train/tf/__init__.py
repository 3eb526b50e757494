"""labkit's TensorFlow/Keras room: the models, the stepper and the lessons that run on TensorFlow/Keras."""
