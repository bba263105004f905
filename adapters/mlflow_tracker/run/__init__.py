"""What an MLflow run holds: names, params, tags, events, LoggedModels, a sweep's parent and saved views.
"""
