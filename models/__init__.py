"""Models: training data from the pipeline's own feature code, training, evaluation against
ground truth, and MLflow registration with champion/challenger promotion."""
