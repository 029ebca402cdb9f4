"""What LeRobot's VLA policies (SmolVLA, pi0, pi0.5) compute alike: flow matching and its time
embedding, the attention masks and eager attention, camera resizing, and the pretrained files they
read by name (tokenizers, backbone configs)."""
