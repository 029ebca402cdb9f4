"""The LeRobotDataset v3.0 format read from disk: metadata and parquet, video and image frames, cameras."""
