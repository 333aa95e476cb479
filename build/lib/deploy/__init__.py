"""tfdeploy: train TensorFlow across bare machines over SSH. `tasks.py` is the command line."""
