"""The wok operator: reconciles InferenceServices and runs the batching-aware control loop."""
