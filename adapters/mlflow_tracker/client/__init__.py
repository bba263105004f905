"""MLflow's client in a child process, and how that process is scheduled beside training.
"""
