"""Where a run's dataset comes from: a LeRobotDataset on local disk or resolved through the Hub."""
