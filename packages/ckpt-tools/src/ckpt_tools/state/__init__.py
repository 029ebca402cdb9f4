"""Training state in and out of the format: collective save and resume load, RNG, optimizer, processors, adapters, the evaluation loader, resume planning."""
